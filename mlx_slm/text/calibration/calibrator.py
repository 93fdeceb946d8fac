"""The `Calibrator` (one offset per label and a temperature, applied to label log-probabilities),
the constants every method shares, and the checks of the arrays the fitters take."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...ground.errors import UserError
from ..labels import LabelError, gold_problem, log_softmax, validate

# Probabilities leave us (files, the service, Ray, DataFrames) with this many decimals. An
# abstaining run rounds them here, before it decides, so the decision is the one a reader of
# any output recomputes: abstained == (max(probs) < min_confidence), on every row.
PROB_DIGITS = 6


def written(probs: dict[str, float]) -> dict[str, float]:
    """`probs` as every output writes them."""
    return {k: round(float(v), PROB_DIGITS) for k, v in probs.items()}


METHODS = ("none", "batch", "em", "fit")
# What a `Calibrator` may say it is: a run's methods, and a typed decision's contextual prior (the
# answer to content-free states, `text.decisions.methods`), which classify does not offer.
ESTIMATES = (*METHODS, "contextual")
DEFAULT_WARMUP = 512
FORMAT = "mlx-slm.calibration"
VERSION = 1

# Calibrated log-probabilities are floored here (exp of it is the smallest normal double),
# so that outputs are finite and JSON-safe even when a label's probability underflows.
LOG_FLOOR = float(np.log(np.finfo(np.float64).tiny))  # about -708.4
# Raw log-probabilities below this (an exact 0: -inf) are read as this, by every fit and every
# apply alike: a temperature learned on them is applied to what it was learned on (with the
# floors apart, a fitted T of ~950 served 0.9999/0/0 for an answer it had fitted as 0.55/0.22/0.23).
INPUT_FLOOR = -1e3


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
    """Map gold label names to indices into `labels`; a gold that `labels.gold_problem` refuses
    (missing, not a string, not one of the labels) is an error naming its item."""
    labels = _check_labels(labels)
    pos = {lab: i for i, lab in enumerate(labels)}
    out = np.empty(len(gold), dtype=np.int64)
    for i, g in enumerate(gold):
        if gold_problem(g, labels) is not None:
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
        if self.method not in ESTIMATES:
            raise CalibrationError(f"calibration method {self.method!r} is not one of {', '.join(ESTIMATES)}")
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
            z = np.maximum(lp, INPUT_FLOOR) / self.temperature - np.asarray(self.log_prior)
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
        for key in ("method", "labels", "log_prior", "temperature"):  # (a temperature read as 1 would change answers)
            if key not in d:
                raise CalibrationError(f"calibration field {key!r} is missing")
        if not isinstance(d["method"], str):
            raise CalibrationError(f"calibration field 'method' must be a string, got {d['method']!r}")
        if not isinstance(d["labels"], list) or not all(isinstance(x, str) for x in d["labels"]):
            raise CalibrationError(f"calibration field 'labels' must be a list of strings, got {d['labels']!r}")
        lp = d["log_prior"]
        if not isinstance(lp, list) or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in lp):
            raise CalibrationError(f"calibration field 'log_prior' must be a list of numbers, got {lp!r}")
        t = d["temperature"]
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
