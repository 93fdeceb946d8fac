"""How right and how calibrated one decision question's answers are, and its fitted temperature.

Pure numpy on given probabilities: `probs` (n, k), one row per answered state, in the
question's option order (noul: its `noul_options` order, "true" first by default), and
`gold` (n,), the index of each state's gold option. `eval --decisions` reads the
probabilities from a `Decider` run (or a `decide` output) and the gold from the input.

Why these figures: a decision's probabilities are what a caller acts on (a threshold on
`noul`, a confidence gate on a choice), so the report says both how often the top option
is right (accuracy) and whether its probabilities can be taken at their word: the Brier
score (the mean squared error of the probability vector), the expected calibration
error of the top option's probability (`metrics.ece`, equal-width bins), the log-loss,
and the reliability bins a plot draws. The temperature is the one-parameter fix that
keeps every answer's argmax: p' = softmax(log p / T), fitted by the gold's mean
negative log-likelihood (Guo et al. 2017).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..labels import log_softmax
from ..metrics import DEFAULT_BINS, EvaluationError, format_report, report

T_BOUNDS = (1e-2, 1e2)  # a fitted temperature stays in here (a separable sample would send it to 0)
_FLOOR = -1e3  # log-probabilities below this (a 0 probability) are clipped for fitting


def _checked(probs: Any, gold: Any, k: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(probs (n, k) float64, gold (n,) int64), their shapes and values checked."""
    p = np.asarray(probs, dtype=np.float64)
    g = np.asarray(gold)
    if p.ndim != 2 or (k is not None and p.shape[1] != k):
        raise EvaluationError(f"probabilities must be (items, {k or 'options'}), got shape {p.shape}")
    if g.shape != (p.shape[0],):
        raise EvaluationError(f"gold must hold one option index per item ({p.shape[0]}), got shape {g.shape}")
    if g.size and (g.dtype.kind not in "iu" or g.min() < 0 or g.max() >= p.shape[1]):
        raise EvaluationError(f"gold must hold option indices in [0, {p.shape[1]}), got {g.tolist()[:5]}...")
    if p.size and (not np.all(np.isfinite(p)) or p.min() < 0 or p.max() > 1 + 1e-9):
        raise EvaluationError("probabilities must be finite numbers in [0, 1]")
    return p, g.astype(np.int64)


def brier(probs: Any, gold: Any, binary: bool = False) -> float:
    """The Brier score: the mean over items of sum_k (p_k - [k == gold])^2 (0 is perfect, 2 the
    worst). `binary` (a noul question): the usual two-outcome form, (p_first - [gold == 0])^2,
    half of the sum over both options."""
    p, g = _checked(probs, gold)
    if g.size == 0:
        return 0.0
    y = np.zeros_like(p)
    y[np.arange(g.size), g] = 1.0
    if binary:
        return float(np.mean((p[:, 0] - y[:, 0]) ** 2))
    return float(np.mean(np.sum((p - y) ** 2, axis=1)))


def log_loss(probs: Any, gold: Any) -> float:
    """The gold option's mean negative log-probability (a 0 probability counts as 1000, not infinity)."""
    p, g = _checked(probs, gold)
    if g.size == 0:
        return 0.0
    with np.errstate(divide="ignore"):
        return float(-np.mean(np.maximum(np.log(p[np.arange(g.size), g]), _FLOOR)))


def question_report(
    probs: Any,
    gold: Any,
    options: Sequence[str],
    binary: bool = False,
    bins: int = DEFAULT_BINS,
    chosen: Sequence[int] | None = None,
    confidence: Sequence[float] | None = None,
) -> dict[str, Any]:
    """One question's figures, JSON-safe: `metrics.report`'s (accuracy, macro-F1, per-option
    P/R/F1, confusion, ECE of the top probability, reliability bins, coverage curve) with the
    options as its labels, and `brier` and `log_loss`. The answer is the top option (a noul's
    "true" when P(true) >= 0.5, its first option winning a tie, as argmax does), or `chosen`'s
    (each answer's option as it was given: "none of these" may choose another than the top), its
    confidence the chosen option's probability, or `confidence`'s."""
    options = [str(o) for o in options]
    p, g = _checked(probs, gold, len(options))
    if g.size == 0:
        raise EvaluationError("no item has both an answer and a gold option: nothing to score")
    top = np.argmax(p, axis=1) if chosen is None else np.asarray(chosen, dtype=np.int64)
    conf = p[np.arange(g.size), top].tolist() if confidence is None else [float(c) for c in confidence]
    rep = report([options[i] for i in g], [options[i] for i in top], conf, options, bins=bins)
    rep["brier"] = brier(p, g, binary)
    rep["brier_form"] = "binary" if binary else "multi-class"
    rep["log_loss"] = log_loss(p, g)
    return rep


# ---------------------------------------------------------------------------- temperature
def apply_temperature(probs: Any, temperature: float) -> np.ndarray:
    """softmax(log p / T) per row (T = 1: the probabilities as they are, bit for bit)."""
    p = np.asarray(probs, dtype=np.float64)
    if temperature == 1.0:
        return p
    with np.errstate(divide="ignore"):
        lp = np.log(p)
    return np.exp(log_softmax(lp / float(temperature)))


def _nll(lp: np.ndarray, g: np.ndarray, a: float) -> float:
    z = log_softmax(a * lp)
    return float(-np.mean(z[np.arange(g.size), g]))


def fit_temperature(probs: Any, gold: Any, max_iter: int = 100) -> tuple[float, dict[str, Any]]:
    """The temperature T minimising the gold's mean NLL under softmax(log p / T), and what the fit
    did: {n, nll_raw, nll_fitted, iterations, converged, at_bound}.

    Newton on a = 1/T with a backtracking line search (the NLL is convex in a: a log-sum-exp
    of a linear function), T kept in `T_BOUNDS`. A sample the model already answers with
    every gold at the top, confidently, pushes T to its lower bound (`at_bound` says so):
    fit on more, or harder, states."""
    p, g = _checked(probs, gold)
    n = g.size
    if n < 2:
        raise EvaluationError(f"fitting a temperature needs at least 2 labelled items, got {n}")
    with np.errstate(divide="ignore"):
        lp = np.maximum(np.log(p), _FLOOR)
    lo, hi = 1 / T_BOUNDS[1], 1 / T_BOUNDS[0]
    a, f = 1.0, _nll(lp, g, 1.0)
    raw, it, converged = f, 0, False
    rows = np.arange(n)
    for it in range(1, max_iter + 1):  # noqa: B007 (read after the loop)
        q = np.exp(log_softmax(a * lp))
        s = np.sum(q * lp, axis=1)
        grad = float(np.mean(s - lp[rows, g]))
        hess = float(np.mean(np.sum(q * lp * lp, axis=1) - s * s))
        if abs(grad) < 1e-10:
            converged = True
            break
        step = -grad / hess if hess > 1e-12 else -grad
        t = 1.0
        while True:
            na = float(np.clip(a + t * step, lo, hi))
            nf = _nll(lp, g, na)
            if nf <= f - 1e-4 * t * abs(grad * step) or t < 1e-10:
                break
            t *= 0.5
        if nf > f or abs(na - a) < 1e-12:
            converged = True
            break
        a, f = na, nf
    T = 1.0 / a
    info = {
        "n": int(n),
        "nll_raw": raw,
        "nll_fitted": f,
        "iterations": it,
        "converged": converged,
        "at_bound": bool(math.isclose(a, lo) or math.isclose(a, hi)),
    }
    return T, info


def format_question_report(name: str, qtype: str, field: str, rep: dict[str, Any]) -> str:
    """A question's headline figures in a few lines (the per-option table and the confusion follow
    from `metrics.format_report`)."""

    head = (
        f"== {name} ({qtype}, gold field {field!r})\n"
        f"accuracy {100 * rep['accuracy']:.2f} %  Brier {rep['brier']:.4f} ({rep['brier_form']})  "
        f"ECE {rep['ece']:.4f}  log-loss {max(0.0, rep['log_loss']):.4f}  n {rep['n']}"
    )
    if "temperature" in rep:
        t = rep["temperature"]
        head += (
            f"\nfitted temperature {t['value']:.4f}: log-loss {t['nll_raw']:.4f} -> {t['nll_fitted']:.4f}, "
            f"ECE {t['ece_raw']:.4f} -> {t['ece_fitted']:.4f}, Brier {t['brier_raw']:.4f} -> {t['brier_fitted']:.4f}"
            + (" (at its bound: fit on more states)" if t["at_bound"] else "")
        )
    return head + "\n" + format_report(rep)
