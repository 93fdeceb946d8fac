""" "None of these": how a task answers out-of-scope texts, and how well it does (pure numpy).

A task with a none label (`train --none-label oos`) learns the out-of-scope examples as one more
class; a text is answered "none of these" (no label, abstained) when that class is the likeliest,
or when no in-scope label reaches the task's `min_confidence`. This module holds that rule
(`answers`), the figures of a run against gold labels where the none label marks the
out-of-scope texts (`figures`: in-scope accuracy with abstentions counted wrong, out-of-scope
recall and precision), and the choice of `min_confidence` on held-out data to a stated target
(`choose_threshold`: the largest threshold that costs in-scope accuracy at most `target`, the
share of in-scope texts it may lose, against no threshold).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

DEFAULT_TARGET = 0.02  # in-scope accuracy the threshold may cost on held-out data (2 points)


def answers(probs: np.ndarray, labels: Sequence[str], none_label: str | None, threshold: float | None) -> list:
    """Each row's answer: a label, or None for "none of these" (the none label likeliest, or no
    in-scope label at `threshold` or above)."""
    labels = list(labels)
    probs = np.asarray(probs, dtype=np.float64)
    best = probs.argmax(axis=1)
    none = np.zeros(len(probs), dtype=bool)
    if none_label is not None:
        k = labels.index(none_label)
        none |= best == k
        inside = np.delete(probs, k, axis=1).max(axis=1)
    else:
        inside = probs.max(axis=1)
    if threshold is not None:
        none |= inside < threshold
    return [None if n else labels[b] for n, b in zip(none, best)]


def figures(answered: Sequence[str | None], gold: Sequence[str], none_label: str) -> dict[str, Any]:
    """In-scope accuracy (of the texts whose gold is not `none_label`, the share answered with their
    gold; "none of these" counts wrong), the share of them answered at all, and out-of-scope
    recall (the none texts answered "none") and precision (of the "none" answers, the share that
    were none texts)."""
    gold_in = np.array([g != none_label for g in gold])
    said_none = np.array([a is None for a in answered])
    right = np.array([a is not None and a == g for a, g in zip(answered, gold)])
    n_in, n_out = int(gold_in.sum()), int((~gold_in).sum())
    out: dict[str, Any] = {
        "in_scope": n_in,
        "out_of_scope": n_out,
        "in_scope_accuracy": round(float(right[gold_in].mean()), 4) if n_in else None,
        "in_scope_answered": round(float((~said_none[gold_in]).mean()), 4) if n_in else None,
    }
    out["oos_recall"] = round(float(said_none[~gold_in].mean()), 4) if n_out else None
    out["oos_precision"] = round(float((~gold_in[said_none]).mean()), 4) if said_none.any() and n_out else None
    return out


def none_answer(label: str | None, probs: dict[str, float], none_label: str | None) -> tuple[str | None, float | None]:
    """One answer as eval scores it, (label, confidence): with a none label, an answer of "none of
    these" (label None) is the none label, not an abstention; its confidence is the probability
    that the text is not its likeliest in-scope label (1 - that label's probability), whether the
    none class won or a threshold found no label sure enough. Without one, None stays an abstention."""
    if label is None and none_label is not None:
        inside = [v for k, v in probs.items() if k != none_label]
        return none_label, float(min(1.0, max(0.0, 1.0 - max(inside)))) if inside else 1.0
    return label, max(probs.values()) if probs else None


def choose_threshold(
    probs: np.ndarray, gold: Sequence[str], labels: Sequence[str], none_label: str, target: float = DEFAULT_TARGET
) -> tuple[float | None, dict[str, Any]]:
    """(threshold, its held-out figures): the largest `min_confidence` whose in-scope accuracy on
    these held-out texts (`probs`: their label probabilities, `gold`: their labels, `none_label`
    marking the out-of-scope ones) is within `target` of the accuracy without one. None when no
    threshold above 0 keeps to the target."""
    if not 0.0 < target < 1.0:
        raise ValueError(f"the target is a share of in-scope accuracy between 0 and 1, got {target!r}")
    probs = np.asarray(probs, dtype=np.float64)
    base = figures(answers(probs, labels, none_label, None), gold, none_label)
    if not base["in_scope"]:
        raise ValueError("the held-out data has no in-scope text (only the none label): give labelled texts too")
    k = list(labels).index(none_label)
    inside = np.delete(probs, k, axis=1).max(axis=1)
    best: tuple[float | None, dict[str, Any]] = (None, {**base, "threshold": None})
    for t in np.unique(inside):
        got = figures(answers(probs, labels, none_label, float(t)), gold, none_label)
        if got["in_scope_accuracy"] >= base["in_scope_accuracy"] - target - 1e-12:
            best = (float(t), {**got, "threshold": float(t)})
    return best[0], {**best[1], "target": target, "without_threshold": base}
