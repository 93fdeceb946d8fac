"""TypeSafe's confidence formulas (`text/decisions/confidence.py`)."""

from __future__ import annotations

import pytest

from mlx_slm.text.decisions.confidence import choice_confidence, score_confidence


def test_confidences():
    assert choice_confidence([0.5, 0.5]) == 0.0 and choice_confidence([1.0, 0.0]) == 1.0
    assert choice_confidence([1 / 3] * 3) == pytest.approx(0.0)
    assert score_confidence([0, 1, 0]) == 1.0 and score_confidence([1 / 3] * 3) == pytest.approx(1 - (2 / 3) / (2 / 3))
    assert score_confidence([0.5, 0, 0.5]) == 0.0
