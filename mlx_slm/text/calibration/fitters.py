"""The fitters, each returning a `Calibrator`: batch (Zhou et al. 2023), EM (Saerens et al.
2002), the labelled fit (offsets and maybe a temperature, cross-validated), and `fit` by name."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..labels import log_softmax

# The array checks are the package's own (calibrator.py), shared with the Calibrator.
from .calibrator import (
    INPUT_FLOOR,
    METHODS,
    CalibrationError,
    Calibrator,
    _as_gold,
    _as_log_probs,
    _check_labels,
    _logsumexp,
    written,
)

_FIT_FLOOR = INPUT_FLOOR  # raw log-probs below this (or -inf) are clipped, as `Calibrator.apply` clips them
_MIN_PRIOR = 1e-8  # EM keeps every class's estimated prior at least this (finite logs)
_A_BOUNDS = (1e-3, 1e3)  # fitted inverse temperature 1/T stays in here


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


def stratified_folds(gold: np.ndarray, k: int, folds: int, seed: int) -> np.ndarray:
    """Each row's fold (0..folds-1): each label's rows dealt round the folds in a seeded order, so a
    label with `folds` or more rows is in every fold (the same gold and seed: the same folds)."""
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


def _check_labelled(
    labels: tuple[str, ...], gold: np.ndarray, temperature: bool | str, folds: int, l2: float
) -> np.ndarray:
    """`fit_labelled`'s settings, and a sample with every label in it; returns each label's support."""
    k = len(labels)
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
    return support


@dataclass(frozen=True)
class _LabelledFit:
    """`fit_labelled`'s settings, checked once and read by the cross-validation and the final fit."""

    temperature: bool | str
    folds: int
    seed: int
    l2: float
    max_iter: int


def _cross_validate(
    lpf: np.ndarray,
    gold: np.ndarray,
    labels: tuple[str, ...],
    support: np.ndarray,
    how: _LabelledFit,
    info: dict[str, Any],
) -> bool:
    """Stratified k-fold figures into `info`; returns whether to fit a temperature
    ("auto": only if it lowers the cross-validated log-loss)."""
    k, n = len(labels), len(gold)
    temperature, l2, max_iter = how.temperature, how.l2, how.max_iter
    variants = {"auto": [False, True], True: [True], False: [False]}[temperature]
    nf = int(min(how.folds, support.min()))
    cv: dict[bool, tuple[float, float]] = {}
    if nf >= 2:
        fold = stratified_folds(gold, k, nf, how.seed)
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
        return use_temp
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
    return temperature is True


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
    support = _check_labelled(labels, gold, temperature, folds, l2)
    lpf = np.maximum(lp, _FIT_FLOOR)

    info: dict[str, Any] = {
        "n": n,
        "support": {lab: int(s) for lab, s in zip(labels, support)},
        "l2": l2,
        "temperature_mode": temperature,
    }
    use_temp = _cross_validate(lpf, gold, labels, support, _LabelledFit(temperature, folds, seed, l2, max_iter), info)
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
