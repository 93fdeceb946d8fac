"""Metrics against gold labels: accuracy, per-label P/R/F1, confusion, calibration, coverage.

Pure numpy functions on label indices: gold (n,) in [0, k), predicted (n,) in [-1, k)
where -1 means the item was not answered (abstained, or it failed), and confidences (n,)
(the max calibrated probability of each answered item). `report` takes label names,
builds everything into one JSON-safe dict and `format_report` prints it (`evaluate.plot` draws it).
They sit low (no files, no model) so that `heads` can score its cross-validation with them.

Why the confidence figures: a classifier that may abstain is tuned by a confidence
threshold, and a threshold means something only if confidences are calibrated (ECE,
reliability) and if one can read off what each threshold buys (the coverage curve,
`threshold_for_accuracy`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..ground.errors import UserError

DEFAULT_BINS = 15
DEFAULT_POINTS = (1.0, 0.9, 0.8, 0.7, 0.6, 0.5)


class EvaluationError(UserError, ValueError):
    """Inconsistent evaluation input (the message says what to fix)."""


# ---------------------------------------------------------------------------- checks
def _ints(x: Any, name: str) -> np.ndarray:
    a = np.asarray(x)
    if a.ndim != 1:
        raise EvaluationError(f"{name} must be a 1-D array, got shape {a.shape}")
    if a.size == 0:
        return a.astype(np.int64)
    if a.dtype.kind not in "iu":
        if a.dtype.kind == "f" and np.all(np.isfinite(a)) and np.all(a == np.round(a)):
            return a.astype(np.int64)
        raise EvaluationError(f"{name} must hold integer label indices, got dtype {a.dtype}")
    return a.astype(np.int64)


def _pair(gold: Any, pred: Any, k: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    g, p = _ints(gold, "gold"), _ints(pred, "pred")
    if g.shape != p.shape:
        raise EvaluationError(f"gold has {g.size} items but pred has {p.size}")
    if k is not None:
        if g.size and (g.min() < 0 or g.max() >= k):
            raise EvaluationError(f"gold indices must lie in [0, {k}), got {g.min()}..{g.max()}")
        if p.size and (p.min() < -1 or p.max() >= k):
            raise EvaluationError(f"pred indices must lie in [0, {k}) or be -1 (abstained), got {p.min()}..{p.max()}")
    return g, p


def _conf_correct(confidence: Any, correct: Any) -> tuple[np.ndarray, np.ndarray]:
    c = np.asarray(confidence, dtype=np.float64)
    ok = np.asarray(correct, dtype=bool)
    if c.ndim != 1 or ok.shape != c.shape:
        raise EvaluationError(f"confidence and correct must be 1-D of equal length, got {c.shape} and {ok.shape}")
    if c.size and (not np.all(np.isfinite(c)) or c.min() < 0 or c.max() > 1):
        raise EvaluationError("confidences must be finite probabilities in [0, 1]")
    return c, ok


# ---------------------------------------------------------------------------- counts
def confusion(gold: Any, pred: Any, k: int) -> np.ndarray:
    """(k, k) counts, rows gold, columns predicted; abstained items (pred -1) are left out."""
    g, p = _pair(gold, pred, k)
    keep = p >= 0
    return np.bincount(g[keep] * k + p[keep], minlength=k * k).reshape(k, k).astype(np.int64)


def per_label(conf: np.ndarray, labels: Sequence[str], support: Any = None) -> dict[str, dict[str, float]]:
    """Precision, recall, F1 and support per label; 0 where a ratio is undefined.

    `support` (gold items per label) defaults to the confusion row sums; pass the full
    counts to make recall count abstained items as misses (as `report` does).
    """
    conf = np.asarray(conf)
    k = len(labels)
    if conf.shape != (k, k):
        raise EvaluationError(f"confusion must be ({k}, {k}) for {k} labels, got {conf.shape}")
    tp = np.diag(conf).astype(np.float64)
    predicted = conf.sum(axis=0).astype(np.float64)
    sup = conf.sum(axis=1) if support is None else np.asarray(support)
    if sup.shape != (k,) or np.any(sup < conf.sum(axis=1)):
        raise EvaluationError("support must give, per label, at least the gold items in the confusion matrix")
    out = {}
    for i, lab in enumerate(labels):
        prec = tp[i] / predicted[i] if predicted[i] else 0.0
        rec = tp[i] / sup[i] if sup[i] else 0.0
        f1 = 2 * prec * rec / (prec + rec) if prec + rec else 0.0
        out[lab] = {"precision": float(prec), "recall": float(rec), "f1": float(f1), "support": int(sup[i])}
    return out


def macro_f1(conf: np.ndarray, support: Any = None) -> float:
    """Unweighted mean F1 over the labels that occur as gold or as a prediction.

    Labels absent from both are left out (as scikit-learn does by default), so an
    evaluation set without some label is not charged a 0 for it.
    """
    conf = np.asarray(conf)
    k = conf.shape[0]
    per = per_label(conf, [str(i) for i in range(k)], support)
    sup = conf.sum(axis=1) if support is None else np.asarray(support)
    present = [i for i in range(k) if sup[i] > 0 or conf[:, i].sum() > 0]
    if not present:
        return 0.0
    return float(np.mean([per[str(i)]["f1"] for i in present]))


def accuracy(gold: Any, pred: Any) -> float:
    """Fraction of items with pred == gold; abstained (-1) items count as wrong. 0 if empty."""
    g, p = _pair(gold, pred)
    return float(np.mean(g == p)) if g.size else 0.0


# ---------------------------------------------------------------------------- calibration
def _edges(bins: int) -> np.ndarray:
    return np.arange(bins + 1) / bins  # i / bins: the same doubles as the literals (0.7, not 0.7000000000000001)


def _bin_index(c: np.ndarray, bins: int) -> np.ndarray:
    """Equal-width bins, right-closed: bin i holds (i/bins, (i+1)/bins]; 0 goes to bin 0."""
    return np.clip(np.searchsorted(_edges(bins), c, side="left") - 1, 0, bins - 1)


def reliability(confidence: Any, correct: Any, bins: int = DEFAULT_BINS) -> list[dict[str, Any]]:
    """Per equal-width bin: {lo, hi, confidence (mean), accuracy, count}; None when empty."""
    if bins < 1:
        raise EvaluationError(f"bins must be >= 1, got {bins}")
    c, ok = _conf_correct(confidence, correct)
    idx = _bin_index(c, bins)
    edges = _edges(bins)
    out = []
    for b in range(bins):
        m = idx == b
        cnt = int(m.sum())
        out.append(
            {
                "lo": float(edges[b]),
                "hi": float(edges[b + 1]),
                "confidence": float(c[m].mean()) if cnt else None,
                "accuracy": float(ok[m].mean()) if cnt else None,
                "count": cnt,
            }
        )
    return out


def ece(confidence: Any, correct: Any, bins: int = DEFAULT_BINS) -> float:
    """Expected calibration error: sum over bins of (bin share) * |accuracy - mean confidence|."""
    c, _ = _conf_correct(confidence, correct)
    if c.size == 0:
        return 0.0
    total = 0.0
    for r in reliability(confidence, correct, bins):
        if r["count"]:
            total += r["count"] / c.size * abs(r["accuracy"] - r["confidence"])
    return float(total)


def coverage_curve(confidence: Any, correct: Any, points: Sequence[float] = DEFAULT_POINTS) -> list[dict[str, Any]]:
    """Accuracy when answering only the most confident fraction of items.

    For each target coverage c the threshold is the confidence of the ceil(c * n)-th most
    confident item and every item with confidence >= threshold is kept (ties are kept
    together, so `coverage` is the fraction actually kept and may exceed `target`).
    Rows: {target, coverage, accuracy, threshold, n}. Thresholds fall as coverage grows.
    """
    c, ok = _conf_correct(confidence, correct)
    if c.size == 0:
        return []
    srt = np.sort(c)[::-1]
    out = []
    for target in points:
        if not 0 < target <= 1:
            raise EvaluationError(f"coverage points must be in (0, 1], got {target}")
        m = max(1, math.ceil(target * c.size - 1e-9))
        thr = float(srt[m - 1])
        keep = c >= thr
        out.append(
            {
                "target": float(target),
                "coverage": float(keep.mean()),
                "accuracy": float(ok[keep].mean()),
                "threshold": thr,
                "n": int(keep.sum()),
            }
        )
    return out


def threshold_for_accuracy(confidence: Any, correct: Any, target: float) -> float | None:
    """The smallest confidence threshold P such that items with confidence >= P are at
    least `target` accurate (so the largest coverage meeting the target), or None."""
    c, ok = _conf_correct(confidence, correct)
    if c.size == 0:
        return None
    order = np.argsort(-c, kind="stable")
    cs, oks = c[order], ok[order]
    hits = np.cumsum(oks)
    # evaluate only at the last index of each run of equal confidences (ties kept together)
    last = np.flatnonzero(np.append(cs[1:] != cs[:-1], True))
    acc = hits[last] / (last + 1)
    good = np.flatnonzero(acc >= target - 1e-12)
    if good.size == 0:
        return None
    return float(cs[last[good[-1]]])


# ---------------------------------------------------------------------------- report
def report(
    gold_labels: Sequence[str],
    pred_labels: Sequence[str | None],
    confidences: Sequence[float | None],
    labels: Sequence[str],
    bins: int = DEFAULT_BINS,
    points: Sequence[float] = DEFAULT_POINTS,
) -> dict[str, Any]:
    """Everything about one labelled run, JSON-safe.

    A prediction of None is an abstention (or a failed item). `accuracy`, `ece`,
    `reliability`, `confusion` and `coverage_curve` are over the answered items only;
    `coverage` = answered / n, `abstained` = n - answered, and `accuracy_all` counts
    abstentions as wrong. Per-label recall and support count every gold item, so an
    abstention is a miss there. Confidences of abstained items are ignored (may be None).
    """
    labels = list(labels)
    k = len(labels)
    if k < 1:
        raise EvaluationError("no labels given")
    if len(set(labels)) != k:
        raise EvaluationError(f"labels must be distinct, got {labels}")
    n = len(gold_labels)
    if len(pred_labels) != n or len(confidences) != n:
        raise EvaluationError(
            f"gold ({n}), predictions ({len(pred_labels)}) and confidences ({len(confidences)}) "
            "must have one entry per item"
        )
    pos = {lab: i for i, lab in enumerate(labels)}
    gold = np.empty(n, dtype=np.int64)
    pred = np.empty(n, dtype=np.int64)
    conf = np.zeros(n)
    for i, (g, p, c) in enumerate(zip(gold_labels, pred_labels, confidences)):
        if g not in pos:
            raise EvaluationError(f"gold label {g!r} of item {i} is not one of the labels {labels}")
        gold[i] = pos[g]
        if p is None:
            pred[i] = -1
            continue
        if p not in pos:
            raise EvaluationError(f"predicted label {p!r} of item {i} is not one of the labels {labels}")
        pred[i] = pos[p]
        if c is None or not (0 <= float(c) <= 1):
            raise EvaluationError(f"confidence of item {i} must be a probability in [0, 1], got {c!r}")
        conf[i] = float(c)
    answered = pred >= 0
    na = int(answered.sum())
    ok = gold[answered] == pred[answered]
    ca = conf[answered]
    cm = confusion(gold, pred, k)
    support = np.bincount(gold, minlength=k)
    per = per_label(cm, labels, support)
    return {
        "n": n,
        "labels": labels,
        "accuracy": float(ok.mean()) if na else 0.0,
        "accuracy_all": accuracy(gold, pred),
        "coverage": na / n if n else 0.0,
        "abstained": n - na,
        "macro_f1": macro_f1(cm, support),
        "per_label": per,
        "confusion": cm.tolist(),
        "ece": ece(ca, ok, bins),
        "reliability": reliability(ca, ok, bins),
        "coverage_curve": coverage_curve(ca, ok, points),
    }


def format_report(rep: dict[str, Any]) -> str:
    """A plain-text rendering of `report`: headline figures, per-label table, confusion, coverage."""
    labels = rep["labels"]
    lines = [
        f"items {rep['n']}  answered {rep['n'] - rep['abstained']} ({100 * rep['coverage']:.1f} %)"
        f"  abstained {rep['abstained']}",
        f"accuracy {100 * rep['accuracy']:.2f} % (answered)  {100 * rep['accuracy_all']:.2f} % (all, abstained wrong)",
        f"macro-F1 {rep['macro_f1']:.4f}  ECE {rep['ece']:.4f}",
        "",
    ]
    w = max(5, *(len(lab) for lab in labels))
    lines.append(f"{'label':<{w}}  {'precision':>9}  {'recall':>6}  {'f1':>6}  {'support':>7}")
    for lab in labels:
        r = rep["per_label"][lab]
        lines.append(f"{lab:<{w}}  {r['precision']:>9.3f}  {r['recall']:>6.3f}  {r['f1']:>6.3f}  {r['support']:>7d}")
    if rep.get("none_label") is not None:
        lines.append(f'({rep["none_label"]!r} is "none of these": a text answered none is predicted it)')
    lines += ["", "confusion (rows gold, columns predicted; abstained left out)"]
    cm = rep["confusion"]
    cw = max(4, *(len(lab) for lab in labels), *(len(str(v)) for row in cm for v in row))
    lines.append(" " * (w + 2) + "  ".join(f"{lab:>{cw}}" for lab in labels))
    for lab, row in zip(labels, cm):
        lines.append(f"{lab:<{w}}  " + "  ".join(f"{v:>{cw}d}" for v in row))
    curve = rep.get("coverage_curve") or []
    if curve:
        lines += [
            "",
            "coverage (answer only the most confident)",
            f"{'target':>6}  {'kept':>6}  {'threshold':>9}  {'accuracy':>8}  {'n':>6}",
        ]
        for r in curve:
            lines.append(
                f"{100 * r['target']:>5.0f}%  {100 * r['coverage']:>5.1f}%  {r['threshold']:>9.4f}"
                f"  {100 * r['accuracy']:>7.2f}%  {r['n']:>6d}"
            )
    return "\n".join(lines) + "\n"
