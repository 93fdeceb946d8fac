"""Post-hoc calibration of label probabilities: undo a small model's label bias.

Small models prefer some labels whatever the input says. On this project's workload the
raw argmax was right 58.8 % of the time; dividing each item's label probabilities by
their mean over the input (batch calibration, Zhou et al. 2023) gave 87.8 %. The fix is
cheap because the bias is mostly one per-label offset in log space.

Every method here therefore has one form, applied to an (n, k) array of label
log-probabilities (or raw label scores: each row is normalized first, which changes
nothing below since per-row constants cancel):

    calibrated = log_softmax(log_probs / T - log_prior)

and differs only in how `log_prior` (one offset per label) and `T` are estimated:

- ``none``:  zeros, T = 1 (the raw model).
- ``batch``: log of the mean predicted distribution over the input (Zhou et al. 2023).
  Needs no labels, but assumes the input's classes are balanced: on an input skewed
  toward the label the model already favours, it removes the real skew along with the
  bias and can hurt.
- ``em``:    Saerens, Latinne & Decaestecker (2002) EM: estimates the input's label prior
  by maximum likelihood and moves the posteriors from the prior the model's posteriors
  assume (the *base*) to the estimated one. The principled fix for label shift, but only
  as good as the base: see `fit_em`.
- ``fit``:   offsets (and optionally T) fitted to a labelled sample by minimizing the
  log-loss of the gold labels, with cross-validated figures in `info`.

Streams: batch calibration needs the whole input's mean. A stream's caller buffers the
first `DEFAULT_WARMUP` items, calls `fit_batch` on them, and applies that calibrator to
the buffered items and every later one. That assumes the warm-up items are
representative of the rest (shuffle first if the input is sorted by label).

Pure numpy; nothing here needs MLX or a model.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from .errors import UserError
from .labels import LabelError, log_softmax, validate

# Probabilities leave us (files, the service, Ray, DataFrames) with this many decimals. An
# abstaining run rounds them here, before it decides, so the decision is the one a reader of
# any output recomputes: abstained == (max(probs) < min_confidence), on every row.
PROB_DIGITS = 6


def written(probs: dict[str, float]) -> dict[str, float]:
    """`probs` as every output writes them."""
    return {k: round(float(v), PROB_DIGITS) for k, v in probs.items()}


METHODS = ("none", "batch", "em", "fit")
DEFAULT_WARMUP = 512
FORMAT = "mlx-slm.calibration"
VERSION = 1

# Calibrated log-probabilities are floored here (exp of it is the smallest normal double),
# so that outputs are finite and JSON-safe even when a label's probability underflows.
LOG_FLOOR = float(np.log(np.finfo(np.float64).tiny))  # about -708.4
_FIT_FLOOR = -1e3  # raw log-probs below this (or -inf) are clipped for fitting only
_MIN_PRIOR = 1e-8  # EM keeps every class's estimated prior at least this (finite logs)
_A_BOUNDS = (1e-3, 1e3)  # fitted inverse temperature 1/T stays in here


class CalibrationError(UserError, ValueError):
    """A user error in calibration input (the message says what to fix)."""


# ---------------------------------------------------------------------------- helpers
def _check_labels(labels: Sequence[str]) -> tuple[str, ...]:
    if isinstance(labels, str):
        raise CalibrationError(f"labels must be a list of names, not the string {labels!r}")
    try:
        return tuple(validate(labels))
    except LabelError as e:
        raise CalibrationError(str(e)) from None


def _logsumexp(x: np.ndarray, axis: int) -> np.ndarray:
    m = np.max(x, axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    with np.errstate(divide="ignore"):
        out = np.log(np.sum(np.exp(x - m), axis=axis, keepdims=True)) + m
    return np.squeeze(out, axis=axis)


def _as_log_probs(log_probs: Any, k: int, *, allow_empty: bool = False) -> np.ndarray:
    """(n, k) float64 log-probabilities, each row normalized; -inf entries allowed."""
    try:
        arr = np.asarray(log_probs, dtype=np.float64)
    except (TypeError, ValueError) as e:
        raise CalibrationError(f"log_probs must be a numeric (items x labels) array: {e}") from None
    if arr.ndim != 2:
        raise CalibrationError(f"log_probs must be a 2-D array of shape (items, labels), got shape {arr.shape}")
    n, cols = arr.shape
    if cols != k:
        raise CalibrationError(
            f"log_probs has {cols} columns but there are {k} labels: give one score per label, in label order"
        )
    if n == 0:
        if allow_empty:
            return arr.reshape(0, k)
        raise CalibrationError("no items to calibrate on: log_probs is empty")
    bad = np.isnan(arr) | (arr == np.inf)
    if bad.any():
        i = int(np.argwhere(bad)[0][0])
        raise CalibrationError(f"log_probs row {i} holds NaN or +inf: scores must be finite (or -inf)")
    dead = ~np.isfinite(arr).any(axis=1)
    if dead.any():
        raise CalibrationError(f"log_probs row {int(np.argmax(dead))} is -inf for every label")
    with np.errstate(over="ignore"):  # a span beyond the float range: the low entries go to -inf
        return log_softmax(arr)


def _as_gold(gold_idx: Any, n: int, labels: tuple[str, ...]) -> np.ndarray:
    k = len(labels)
    try:
        g = np.asarray(gold_idx)
    except (TypeError, ValueError) as e:
        raise CalibrationError(f"gold_idx must be an array of label indices: {e}") from None
    if g.ndim != 1 or g.shape[0] != n:
        raise CalibrationError(f"gold_idx must be one label index per item, shape ({n},); got shape {g.shape}")
    if g.dtype.kind not in "iu":
        if g.dtype.kind == "f" and np.all(np.isfinite(g)) and np.all(g == np.round(g)):
            g = g.astype(np.int64)
        else:
            raise CalibrationError(
                f"gold_idx must hold integer label indices (got dtype {g.dtype}); "
                "map label names with gold_indices(gold, labels)"
            )
    g = g.astype(np.int64)
    out = (g < 0) | (g >= k)
    if out.any():
        i = int(np.argmax(out))
        raise CalibrationError(
            f"gold_idx[{i}] = {int(g[i])} is out of range: label indices run from 0 to {k - 1} ({', '.join(labels)})"
        )
    return g


def gold_indices(gold: Sequence[str], labels: Sequence[str]) -> np.ndarray:
    """Map gold label names to indices into `labels`; an unknown name is an error."""
    labels = _check_labels(labels)
    pos = {lab: i for i, lab in enumerate(labels)}
    out = np.empty(len(gold), dtype=np.int64)
    for i, g in enumerate(gold):
        if g not in pos:
            raise CalibrationError(
                f"gold label {g!r} (item {i}) is not one of the labels {list(labels)}: fix the gold data or add the label"
            )
        out[i] = pos[g]
    return out


def _json_safe(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_safe(v) for v in x]
    if isinstance(x, np.ndarray):
        return _json_safe(x.tolist())
    if isinstance(x, (bool, np.bool_)):
        return bool(x)
    if isinstance(x, (int, np.integer)):
        return int(x)
    if isinstance(x, (float, np.floating)):
        x = float(x)
        return x if math.isfinite(x) else None
    return x


# ---------------------------------------------------------------------------- Calibrator
@dataclass(frozen=True)
class Calibrator:
    """`apply(lp) = log_softmax(lp / temperature - log_prior)`, one offset per label.

    `n` is the number of items it was estimated from; `info` holds diagnostics
    (cross-validated figures for ``fit``, the estimated prior for ``em``) and takes no
    part in equality.
    """

    method: str
    labels: tuple[str, ...]
    log_prior: tuple[float, ...]
    temperature: float = 1.0
    n: int = 0
    info: dict = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise CalibrationError(f"calibration method {self.method!r} is not one of {', '.join(METHODS)}")
        labels = _check_labels(self.labels)
        try:
            prior = tuple(float(v) for v in self.log_prior)
        except (TypeError, ValueError):
            raise CalibrationError(f"log_prior must be a list of numbers, got {self.log_prior!r}") from None
        if len(prior) != len(labels):
            raise CalibrationError(f"log_prior has {len(prior)} values but there are {len(labels)} labels")
        if not all(math.isfinite(v) for v in prior):
            raise CalibrationError(f"log_prior must be finite, got {list(prior)}")
        try:
            t = float(self.temperature)
        except (TypeError, ValueError):
            raise CalibrationError(f"temperature must be a number, got {self.temperature!r}") from None
        if not (math.isfinite(t) and t > 0):
            raise CalibrationError(f"temperature must be a finite number > 0, got {self.temperature!r}")
        if isinstance(self.n, bool) or not isinstance(self.n, (int, np.integer)) or self.n < 0:
            raise CalibrationError(f"n must be a non-negative integer, got {self.n!r}")
        object.__setattr__(self, "labels", labels)
        object.__setattr__(self, "log_prior", prior)
        object.__setattr__(self, "temperature", t)
        object.__setattr__(self, "n", int(self.n))

    @classmethod
    def identity(cls, labels: Sequence[str]) -> Calibrator:
        """The raw model: zero offsets, T = 1."""
        labels = _check_labels(labels)
        return cls("none", labels, (0.0,) * len(labels))

    def check_labels(self, labels: Sequence[str]) -> None:
        """Raise unless `labels` are this calibrator's labels in the same order."""
        if tuple(labels) != self.labels:
            raise CalibrationError(
                f"this calibrator was made for labels {list(self.labels)}, not {list(labels)}: "
                "recalibrate for these labels"
            )

    def apply(self, log_probs: np.ndarray) -> np.ndarray:
        """Calibrated log-probabilities, same shape as the input ((n, k) or (k,)).

        Rows are normalized (logsumexp 0) and finite: entries are floored at `LOG_FLOOR`.
        """
        arr = np.asarray(log_probs, dtype=np.float64)
        one = arr.ndim == 1
        lp = _as_log_probs(arr[None, :] if one else arr, len(self.labels), allow_empty=True)
        if lp.shape[0] == 0:
            return lp[0] if one else lp
        with np.errstate(over="ignore"):
            z = lp / self.temperature - np.asarray(self.log_prior)
            out = np.maximum(log_softmax(z), LOG_FLOOR)
        return out[0] if one else out

    def probs(self, log_probs: np.ndarray) -> np.ndarray:
        """Calibrated probabilities (exp of `apply`)."""
        return np.exp(self.apply(log_probs))

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict; `from_dict` reads it back to an equal calibrator."""
        return {
            "format": FORMAT,
            "version": VERSION,
            "method": self.method,
            "labels": list(self.labels),
            "log_prior": list(self.log_prior),
            "temperature": self.temperature,
            "n": self.n,
            "info": _json_safe(self.info),
        }

    @classmethod
    def from_dict(cls, d: Any) -> Calibrator:
        """Read `to_dict` output back; a missing or malformed field is named in the error."""
        if not isinstance(d, dict):
            raise CalibrationError(f"a calibration must be a JSON object, got {type(d).__name__}")
        if d.get("format", FORMAT) != FORMAT:
            raise CalibrationError(
                f"field 'format' is {d.get('format')!r}, expected {FORMAT!r}: not a calibration file"
            )
        if d.get("version", VERSION) != VERSION:
            raise CalibrationError(f"field 'version' is {d.get('version')!r}; this version reads version {VERSION}")
        for key in ("method", "labels", "log_prior"):
            if key not in d:
                raise CalibrationError(f"calibration field {key!r} is missing")
        if not isinstance(d["method"], str):
            raise CalibrationError(f"calibration field 'method' must be a string, got {d['method']!r}")
        if not isinstance(d["labels"], list) or not all(isinstance(x, str) for x in d["labels"]):
            raise CalibrationError(f"calibration field 'labels' must be a list of strings, got {d['labels']!r}")
        lp = d["log_prior"]
        if not isinstance(lp, list) or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in lp):
            raise CalibrationError(f"calibration field 'log_prior' must be a list of numbers, got {lp!r}")
        t = d.get("temperature", 1.0)
        if isinstance(t, bool) or not isinstance(t, (int, float)):
            raise CalibrationError(f"calibration field 'temperature' must be a number, got {t!r}")
        n = d.get("n", 0)
        if isinstance(n, bool) or not isinstance(n, int):
            raise CalibrationError(f"calibration field 'n' must be an integer, got {n!r}")
        info = d.get("info", {})
        if not isinstance(info, dict):
            raise CalibrationError(f"calibration field 'info' must be an object, got {info!r}")
        try:
            return cls(d["method"], tuple(d["labels"]), tuple(lp), float(t), n, dict(info))
        except CalibrationError as e:
            raise CalibrationError(f"invalid calibration: {e}") from None


# ---------------------------------------------------------------------------- batch
def batch_log_prior(log_probs: np.ndarray) -> np.ndarray:
    """log of the mean predicted distribution over the items, shape (k,)."""
    lp = np.asarray(log_probs, dtype=np.float64)
    return _logsumexp(lp, axis=0) - math.log(lp.shape[0])


def fit_batch(log_probs: np.ndarray, labels: Sequence[str]) -> Calibrator:
    """Batch calibration (Zhou et al. 2023): divide by the mean predicted distribution.

    No labels needed. Assumes the items' true classes are roughly balanced; with one
    item it would flatten every prediction to uniform, so at least two are required.
    """
    labels = _check_labels(labels)
    lp = _as_log_probs(log_probs, len(labels))
    n = lp.shape[0]
    if n < 2:
        raise CalibrationError(
            "batch calibration needs at least 2 items (with 1 it flattens the prediction to uniform); "
            "calibrate on more items or use method 'none'"
        )
    prior = batch_log_prior(lp)
    return Calibrator("batch", labels, tuple(prior.tolist()), 1.0, n, {"prior": _prior_dict(labels, prior)})


def _prior_dict(labels: tuple[str, ...], log_prior: np.ndarray) -> dict[str, float]:
    p = np.exp(log_prior - _logsumexp(log_prior, axis=0))
    return written(dict(zip(labels, p.tolist())))


# ---------------------------------------------------------------------------- EM
def fit_em(
    log_probs: np.ndarray,
    labels: Sequence[str],
    max_iter: int = 100,
    tol: float = 1e-6,
    base: str | Sequence[float] | Calibrator = "uniform",
) -> Calibrator:
    """Saerens et al. (2002) EM: estimate the input's label prior, adjust the posteriors.

    The model's posteriors p_i(y) are taken to be calibrated under a *base* prior b(y).
    Starting from pi = uniform, EM alternates

        q_i(y) = p_i(y) * pi(y) / b(y), normalized over y      (E step)
        pi(y)  = mean_i q_i(y)                                   (M step)

    until max |pi_new - pi| < tol (or `max_iter` steps; `info["converged"]` says which).
    Each pi(y) is kept >= 1e-8 so logs stay finite. The result's `apply` returns the
    final q: log_prior = log b - log pi - log k (the constant only centers it).

    `base` says which prior the posteriors assume:

    - ``"uniform"`` (default): the model is taken as unbiased. Right for a calibrated
      model; for a biased one EM reads the bias as label shift and *amplifies* it.
    - a `Calibrator` (e.g. `fit_batch` on a balanced reference sample, or `fit_labelled`):
      its offsets and temperature are the model's measured bias; EM then estimates only
      the input's own skew on top of it. This is the recommended use for small models:
      measure the bias once, re-estimate the label mix per input.
    - a sequence of k probabilities: the base prior itself.

    ``"batch"`` (the batch mean of these same items) is refused: the batch mean is then
    itself the maximum-likelihood prior, so EM returns the raw posteriors unchanged.
    """
    labels = _check_labels(labels)
    k = len(labels)
    lp = _as_log_probs(log_probs, k)
    n = lp.shape[0]
    if n < 2:
        raise CalibrationError("EM prior estimation needs at least 2 items; calibrate on more items")
    if max_iter < 1 or not tol > 0:
        raise CalibrationError(f"max_iter must be >= 1 and tol > 0, got {max_iter}, {tol}")
    temperature = 1.0
    if isinstance(base, str):
        if base == "uniform":
            base_lp = np.zeros(k)
            base_name = "uniform"
        elif base == "batch":
            raise CalibrationError(
                "base='batch' on the same items makes EM a no-op (their mean is itself the "
                "maximum-likelihood prior); pass base=fit_batch(<balanced reference items>, labels) "
                "or base='uniform'"
            )
        else:
            raise CalibrationError(f"EM base {base!r} is not 'uniform', a Calibrator or a list of k probabilities")
    elif isinstance(base, Calibrator):
        base.check_labels(labels)
        base_lp = np.asarray(base.log_prior, dtype=np.float64)
        temperature = base.temperature
        base_name = f"calibrator:{base.method}"
    else:
        try:
            b = np.asarray(base, dtype=np.float64)
        except (TypeError, ValueError):
            raise CalibrationError(
                f"EM base must be 'uniform', a Calibrator or k probabilities, got {base!r}"
            ) from None
        if b.shape != (k,) or not np.all(np.isfinite(b)) or np.any(b <= 0):
            raise CalibrationError(f"EM base prior must be {k} positive probabilities, got {base!r}")
        base_lp = np.log(b / b.sum())
        base_name = "given"
    post = log_softmax(lp / temperature - base_lp)  # posteriors under a uniform prior
    log_pi = np.full(k, -math.log(k))
    converged, it = False, 0
    for it in range(1, max_iter + 1):  # noqa: B007  (read after the loop)
        q = log_softmax(post + log_pi)
        pi = np.maximum(np.exp(_logsumexp(q, axis=0) - math.log(n)), _MIN_PRIOR)
        pi /= pi.sum()
        delta = float(np.max(np.abs(pi - np.exp(log_pi))))
        log_pi = np.log(pi)
        if delta < tol:
            converged = True
            break
    log_prior = base_lp - log_pi - math.log(k)
    info = {
        "base": base_name,
        "prior": _prior_dict(labels, log_pi),
        "iterations": it,
        "converged": converged,
    }
    return Calibrator("em", labels, tuple(log_prior.tolist()), temperature, n, info)


# ---------------------------------------------------------------------------- labelled fit
def _objective(lp: np.ndarray, gold: np.ndarray, b: np.ndarray, a: float, lam: float) -> float:
    z = a * lp + b
    nll = float(np.mean(_logsumexp(z, axis=1) - z[np.arange(len(gold)), gold]))
    return nll + 0.5 * lam * (float(b @ b) + (a - 1.0) ** 2)


def _newton(
    lp: np.ndarray, gold: np.ndarray, k: int, fit_temp: bool, l2: float, max_iter: int = 100
) -> tuple[np.ndarray, float, int, bool]:
    """Minimize mean NLL(gold | softmax(a * lp + b)) + l2 / (2 n) * (|b|^2 + (a - 1)^2).

    Convex in (b, a), so damped Newton with an Armijo backtracking search converges in a
    few steps. The penalty is a MAP Gaussian prior (sd 1/sqrt(l2)) on each offset and on
    a = 1/T around 1; since the loss ignores a shift of all b, its minimizer has mean(b) = 0.
    """
    n = lp.shape[0]
    lam = l2 / n
    y = np.zeros((n, k))
    y[np.arange(n), gold] = 1.0
    b, a = np.zeros(k), 1.0
    f = _objective(lp, gold, b, a, lam)
    converged, it = False, 0
    for it in range(1, max_iter + 1):  # noqa: B007  (read after the loop)
        p = np.exp(log_softmax(a * lp + b))
        r = p - y
        g_b = r.mean(axis=0) + lam * b
        mp = p.mean(axis=0)
        h_bb = np.diag(mp) - p.T @ p / n + (lam + 1e-12) * np.eye(k)
        if fit_temp:
            s = np.sum(p * lp, axis=1)
            g_a = float(np.mean(np.sum(r * lp, axis=1)) + lam * (a - 1.0))
            h_ba = (p * lp).mean(axis=0) - (p * s[:, None]).mean(axis=0)
            h_aa = float(np.mean(np.sum(p * lp * lp, axis=1) - s * s)) + lam + 1e-12
            g = np.append(g_b, g_a)
            h = np.block([[h_bb, h_ba[:, None]], [h_ba[None, :], np.array([[h_aa]])]])
        else:
            g, h = g_b, h_bb
        if float(np.max(np.abs(g))) < 1e-9:
            converged = True
            break
        try:
            d = -np.linalg.solve(h, g)
        except np.linalg.LinAlgError:
            d = -g
        slope = float(g @ d)
        if slope >= 0:  # not a descent direction (numerically singular): fall back
            d, slope = -g, -float(g @ g)
        t = 1.0
        while True:
            nb = b + t * d[:k]
            na = float(np.clip(a + t * d[k], *_A_BOUNDS)) if fit_temp else a
            nf = _objective(lp, gold, nb, na, lam)
            if nf <= f + 1e-4 * t * slope or t < 1e-10:
                break
            t *= 0.5
        if nf > f:  # no progress possible at this precision
            converged = True
            break
        step = max(float(np.max(np.abs(nb - b))), abs(na - a))
        b, a, f = nb, na, nf
        if step < 1e-12:
            converged = True
            break
    return b - b.mean(), a, it, converged


def _stratified_folds(gold: np.ndarray, k: int, folds: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    fold = np.empty(len(gold), dtype=np.int64)
    offset = 0
    for c in range(k):
        idx = np.flatnonzero(gold == c)
        idx = idx[rng.permutation(len(idx))]
        fold[idx] = (np.arange(len(idx)) + offset) % folds
        offset += len(idx)
    return fold


def _score(lp: np.ndarray, gold: np.ndarray, b: np.ndarray, a: float) -> tuple[float, float]:
    """(sum of NLL of gold, number correct) under log_softmax(a * lp + b)."""
    z = log_softmax(a * lp + b)
    rows = np.arange(len(gold))
    return float(-np.sum(z[rows, gold])), float(np.sum(np.argmax(z, axis=1) == gold))


def fit_labelled(
    log_probs: np.ndarray,
    gold_idx: Sequence[int] | np.ndarray,
    labels: Sequence[str],
    temperature: bool | str = "auto",
    folds: int = 5,
    seed: int = 0,
    l2: float = 1e-2,
    max_iter: int = 100,
) -> Calibrator:
    """Fit per-label offsets (and optionally a temperature) to a labelled sample.

    Minimizes the mean log-loss of the gold labels under log_softmax(lp / T + b) with
    b = -log_prior, mean(b) = 0, plus an L2 penalty l2 / (2 n) * (|b|^2 + (1/T - 1)^2):
    a Gaussian prior of sd 1/sqrt(l2) (10 by default) that keeps tiny or separable
    samples from sending an offset to infinity while staying negligible for large ones.

    `temperature`: False fits offsets only; True fits offsets and T; "auto" fits both
    ways and keeps T only if the cross-validated log-loss improves.

    `info` reports stratified k-fold figures (each item scored by a calibrator fitted
    without it): cv_accuracy_raw/calibrated, cv_logloss_raw/calibrated, folds (the number
    used: min(folds, smallest label count), at least 2), n and per-label support. With
    a label seen only once cross-validation is impossible: the cv figures are None and
    `cv_note` says why ("auto" then fits offsets only).
    """
    labels = _check_labels(labels)
    k = len(labels)
    lp = _as_log_probs(log_probs, k)
    n = lp.shape[0]
    gold = _as_gold(gold_idx, n, labels)
    if temperature not in (True, False, "auto"):
        raise CalibrationError(f"temperature must be True, False or 'auto', got {temperature!r}")
    if isinstance(folds, bool) or not isinstance(folds, (int, np.integer)) or folds < 2:
        raise CalibrationError(f"folds must be an integer >= 2, got {folds!r}")
    if not (l2 >= 0 and math.isfinite(l2)):
        raise CalibrationError(f"l2 must be a finite number >= 0, got {l2!r}")
    support = np.bincount(gold, minlength=k)
    missing = [labels[c] for c in range(k) if support[c] == 0]
    if missing:
        names = ", ".join(repr(m) for m in missing)
        raise CalibrationError(f"the calibration sample has no example of label {names}: add some, or drop the label")
    lpf = np.maximum(lp, _FIT_FLOOR)

    info: dict[str, Any] = {
        "n": n,
        "support": {lab: int(s) for lab, s in zip(labels, support)},
        "l2": l2,
        "temperature_mode": temperature,
    }
    variants = {"auto": [False, True], True: [True], False: [False]}[temperature]
    nf = int(min(folds, support.min()))
    cv: dict[bool, tuple[float, float]] = {}
    if nf >= 2:
        fold = _stratified_folds(gold, k, nf, seed)
        raw_nll, raw_ok = _score(lpf, gold, np.zeros(k), 1.0)
        for v in variants:
            tot_nll = tot_ok = 0.0
            for f in range(nf):
                tr, te = fold != f, fold == f
                b, a, _, _ = _newton(lpf[tr], gold[tr], k, v, l2, max_iter)
                s_nll, s_ok = _score(lpf[te], gold[te], b, a)
                tot_nll += s_nll
                tot_ok += s_ok
            cv[v] = (tot_nll / n, tot_ok / n)
        use_temp = variants[0] if len(variants) == 1 else cv[True][0] < cv[False][0]
        info.update(
            folds=nf,
            cv_accuracy_raw=raw_ok / n,
            cv_logloss_raw=raw_nll / n,
            cv_accuracy_calibrated=cv[use_temp][1],
            cv_logloss_calibrated=cv[use_temp][0],
        )
        if temperature == "auto":
            info["cv_logloss_offsets_only"] = cv[False][0]
            info["cv_logloss_with_temperature"] = cv[True][0]
    else:
        use_temp = temperature is True
        low = [labels[c] for c in range(k) if support[c] < 2]
        info.update(
            folds=0,
            cv_accuracy_raw=None,
            cv_logloss_raw=None,
            cv_accuracy_calibrated=None,
            cv_logloss_calibrated=None,
            cv_note=(
                f"no cross-validation: label(s) {', '.join(map(repr, low))} have a single example "
                "(need at least 2 per label)" + ("; temperature not fitted" if temperature == "auto" else "")
            ),
        )
    b, a, it, conv = _newton(lpf, gold, k, use_temp, l2, max_iter)
    info.update(temperature_fitted=use_temp, iterations=it, converged=conv)
    return Calibrator("fit", labels, tuple((-b).tolist()), 1.0 / a, n, info)


# ---------------------------------------------------------------------------- dispatch
def fit(
    method: str,
    log_probs: np.ndarray | None,
    labels: Sequence[str],
    gold_idx: Sequence[int] | np.ndarray | None = None,
    **kw: Any,
) -> Calibrator:
    """Estimate a calibrator by name (one of `METHODS`); extra keywords go to the fitter.

    "fit" needs `gold_idx`; the other methods ignore it. "none" accepts log_probs=None.
    """
    if method == "none":
        labels = _check_labels(labels)
        n = 0 if log_probs is None else _as_log_probs(log_probs, len(labels), allow_empty=True).shape[0]
        c = Calibrator.identity(labels)
        return Calibrator(c.method, c.labels, c.log_prior, 1.0, n)
    if log_probs is None:
        raise CalibrationError(f"method {method!r} needs the items' label log-probabilities")
    if method == "batch":
        return fit_batch(log_probs, labels, **kw)
    if method == "em":
        return fit_em(log_probs, labels, **kw)
    if method == "fit":
        if gold_idx is None:
            raise CalibrationError("method 'fit' needs gold labels for the sample: pass gold_idx (label indices)")
        return fit_labelled(log_probs, gold_idx, labels, **kw)
    raise CalibrationError(f"calibration method {method!r} is not one of {', '.join(METHODS)}")


# ---------------------------------------------------------------------------- the spec and one run
@dataclass(frozen=True)
class CalibrationSpec:
    """How a run calibrates: the one value the CLI, task files, Ray, the service and the
    Python API pass around (`of` makes it from any of their forms).

    `kind` is one of `METHODS`. `prior`: a fitted `Calibrator` applied to every item as
    it is (a saved prior, or the one an interrupted run fitted). `base`: for ``em``, the
    offsets fitted on labelled data, on which each input's own label mix is re-estimated.
    Without either, ``batch``/``em`` fit their prior on each input's first `warmup`
    answered items, and ``fit``/``em`` still need labelled data (`needs_data`).
    """

    kind: str = "none"
    prior: Calibrator | None = None
    base: Calibrator | None = None
    warmup: int = DEFAULT_WARMUP

    def __post_init__(self) -> None:
        if self.kind not in METHODS:
            raise CalibrationError(f"calibration {self.kind!r} is not one of {', '.join(METHODS)}")
        if self.prior is not None and self.prior.method != self.kind:
            raise CalibrationError(f"a {self.prior.method!r} prior given as calibration {self.kind!r}")
        if self.base is not None and (self.kind != "em" or self.prior is not None):
            raise CalibrationError("a base calibrator goes with calibration 'em' (and no fitted prior)")

    @classmethod
    def of(cls, value: CalibrationSpec | Calibrator | str, *, warmup: int | None = None) -> CalibrationSpec:
        """The spec for a method name, a fitted `Calibrator` (applied as is) or a spec;
        `warmup` replaces the spec's own when given."""
        if isinstance(value, CalibrationSpec):
            spec = value
        elif isinstance(value, Calibrator):
            spec = cls(value.method, prior=value)
        elif value in METHODS:
            spec = cls(value)
        else:
            raise CalibrationError(
                f"calibration must be one of {', '.join(METHODS)}, a fitted Calibrator or a CalibrationSpec, "
                f"not {value!r}"
            )
        return spec if warmup is None or warmup == spec.warmup else replace(spec, warmup=warmup)

    # -- the task file's "calibration" field (warm-up is a field of its own there)
    def to_dict(self) -> str | dict[str, Any]:
        """The field's JSON: "none", "batch", a fitted prior's dict, or {"method": "em", "base": ...}."""
        if self.prior is not None:
            return self.prior.to_dict()
        if self.base is not None:
            return {"method": "em", "base": self.base.to_dict()}
        return self.kind

    @classmethod
    def from_dict(cls, d: Any, warmup: int = DEFAULT_WARMUP) -> CalibrationSpec:
        """Read `to_dict` back; a malformed calibrator is a `CalibrationError`."""
        if isinstance(d, dict) and d.get("method") == "em" and "base" in d:
            return cls("em", base=Calibrator.from_dict(d["base"]), warmup=warmup)
        if isinstance(d, dict):
            return cls.of(Calibrator.from_dict(d), warmup=warmup)
        return cls.of(d, warmup=warmup)

    def record(self) -> str | dict[str, Any]:
        """The run record's (manifest's) form: what `--resume` compares, warm-up included."""
        if self.prior is not None:
            return self.prior.to_dict()
        if self.base is not None:
            return {"method": "em", "base": self.base.to_dict(), "warmup": self.warmup}
        return self.kind if self.kind == "none" else {"method": self.kind, "warmup": self.warmup}

    @property
    def applies(self) -> bool:
        """Whether probabilities change at all (an identity prior is ``none`` too)."""
        return self.kind != "none"

    @property
    def fitted(self) -> bool:
        """Holds parameters fitted on some model's scores (they hold for those weights only)."""
        return self.prior is not None or self.base is not None

    @property
    def per_input(self) -> bool:
        """``batch``/``em`` without a fixed prior: each input's warm-up fits its own."""
        return self.prior is None and self.kind in ("batch", "em")

    @property
    def needs_data(self) -> bool:
        """``fit``, or ``em`` without a base: labelled data must be fitted first."""
        return self.prior is None and (self.kind == "fit" or (self.kind == "em" and self.base is None))

    @property
    def calibrator(self) -> Calibrator | None:
        """The fitted parameters held: the prior, or em's base."""
        return self.prior or self.base

    def fixed(self) -> CalibrationSpec:
        """What can be applied batch by batch, with no warm-up: the prior, else ``none``."""
        if self.prior is not None and self.applies:
            return self
        return CalibrationSpec(warmup=self.warmup)

    def fit_prior(self, log_probs: np.ndarray, labels: Sequence[str]) -> Calibrator:
        """``batch``/``em``: the prior fitted on one input's warm-up log-probabilities."""
        return fit_batch(log_probs, labels) if self.kind == "batch" else fit_em(log_probs, labels, base=self.base)

    def run(
        self,
        labels: Sequence[str],
        min_confidence: float | None = None,
        on_fit: Callable[[Calibrator], None] | None = None,
    ) -> Calibration:
        """The per-run state for one stream of predictions."""
        return Calibration(self, labels, min_confidence=min_confidence, on_fit=on_fit)


class Calibration:
    """Calibrates (and optionally abstains on) a stream of raw predictions, for one run.

    A spec with a `prior` applies it as is. ``batch`` (Zhou et al. 2023) and ``em`` with
    a base (Saerens et al. 2002) hold back the first `warmup` answered items, fit the
    prior on them (`calibrator`, with `on_fit` told), then calibrate every item, them
    included, with that one prior. The fitted prior lives here, never on the shared
    classifier, and an object serves one run. Predictions come back as new objects;
    raw probabilities stay on each (`raw_probs`).
    """

    def __init__(
        self,
        spec: CalibrationSpec | Calibrator | str,
        labels: Sequence[str],
        *,
        min_confidence: float | None = None,
        on_fit: Callable[[Calibrator], None] | None = None,
    ):
        spec = CalibrationSpec.of(spec)
        if spec.needs_data:
            raise CalibrationError(
                f"calibration {spec.kind!r} needs fitting first: use 'none', 'batch', 'em' with a base, or a "
                "Calibrator (calibration.fit_labelled for 'fit')"
            )
        if spec.prior is not None:
            spec.prior.check_labels(labels)
        if min_confidence is not None and not 0.0 <= min_confidence <= 1.0:
            raise CalibrationError(f"min_confidence must be between 0 and 1, got {min_confidence}")
        self.spec, self.method, self.base = spec, spec.kind, spec.base
        self.calibrator: Calibrator | None = spec.prior if spec.applies else None
        self.labels, self.warmup, self.min_confidence = tuple(labels), max(2, spec.warmup), min_confidence
        self.on_fit, self.fitted_here, self._used = on_fit, False, False

    def __call__(self, preds: Iterable[Any]) -> Iterator[Any]:
        if self._used:
            raise RuntimeError("a Calibration serves one run: make a new one for the next stream")
        self._used = True
        it = iter(preds)
        if self.spec.per_input:
            held: list[Any] = []
            answered = 0
            for p in it:
                held.append(p)
                answered += p.ok
                if answered >= self.warmup:
                    break
            ok = [p for p in held if p.ok]
            if len(ok) >= 2:
                self.calibrator = self.spec.fit_prior(self._log_probs(ok), self.labels)
                self.fitted_here = True
                if self.on_fit is not None:
                    self.on_fit(self.calibrator)
            yield from (self._finish(p) for p in held)
        yield from (self._finish(p) for p in it)

    def result(self) -> CalibrationSpec:
        """The spec this run leaves for later inputs (what `--save-task` writes): the prior
        it applied or fitted, or for ``em`` its base (each input re-estimates its own mix)."""
        if self.method == "em" and self.base is not None:
            return CalibrationSpec("em", base=self.base, warmup=self.spec.warmup)
        if self.calibrator is None:
            return CalibrationSpec(warmup=self.spec.warmup)
        return CalibrationSpec.of(self.calibrator, warmup=self.spec.warmup)

    def _log_probs(self, preds: Sequence[Any]) -> np.ndarray:
        return log_softmax(np.array([[p.scores[lab] for lab in self.labels] for p in preds]))

    def _finish(self, p: Any) -> Any:
        if not p.ok:
            return p
        if self.calibrator is not None:
            probs = self.calibrator.probs(self._log_probs([p]))[0]
            p = replace(
                p,
                raw_probs=p.probs,
                probs={lab: float(x) for lab, x in zip(self.labels, probs)},
                label=self.labels[int(np.argmax(probs))],
            )
        if self.min_confidence is not None:
            # decided on the probabilities as written (see PROB_DIGITS), never on bits a reader cannot see
            p = replace(p, probs=written(p.probs))
            if max(p.probs.values()) < self.min_confidence:
                p = replace(p, label=None, abstained=True)
        return p
