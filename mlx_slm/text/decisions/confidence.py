"""TypeSafe's confidence formulas (typesafe-ai system-one-adapter-python's
confidence_metrics.py, also llama.cpp's, Transformers' `Question.answer` and avrik-server's):
not entropy, not the top probability. Thresholds set on one formula do not transfer to another."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def choice_confidence(p: Sequence[float]) -> float:
    """(p_max - 1/n) / (1 - 1/n), 1 for one option, never below 0."""
    p = np.asarray(p, dtype=np.float64)
    n = len(p)
    return 1.0 if n == 1 else float(max(0.0, (p.max() - 1 / n) / (1 - 1 / n)))


def score_confidence(p: Sequence[float]) -> float:
    """1 - sum p_i |i - mode| / D, D the same for a uniform distribution; never below 0."""
    p = np.asarray(p, dtype=np.float64)
    n = len(p)
    if n == 1:
        return 1.0
    mode = int(np.argmax(p))
    distance = float(sum(pi * abs(i - mode) for i, pi in enumerate(p)))
    uniform = sum(abs(i - (n - 1) / 2) for i in range(n)) / n
    return max(0.0, 1 - distance / uniform)


def expected_level(p: Sequence[float]) -> float:
    """A score's answer: the probability-weighted level index (it may fall between levels)."""
    return float(sum(i * float(pi) for i, pi in enumerate(p)))
