"""How right and how calibrated a decision question's answers are (`text/decisions/metrics.py`): the
decision eval's figures on fixed probabilities (no model): Brier, log-loss, ECE, the fitted temperature."""

from __future__ import annotations

import math

import numpy as np
import pytest

from mlx_slm.text.decisions.metrics import (
    T_BOUNDS,
    apply_temperature,
    brier,
    fit_temperature,
    format_question_report,
    log_loss,
    question_report,
)
from mlx_slm.text.metrics import EvaluationError


def test_brier_by_hand():
    p = [[0.8, 0.2], [0.3, 0.7]]
    g = np.array([0, 0])
    # multi-class: (0.2^2 + 0.2^2 + 0.7^2 + 0.7^2) / 2
    assert brier(p, g) == pytest.approx((0.08 + 0.98) / 2)
    # binary (noul): (0.8 - 1)^2, (0.3 - 1)^2
    assert brier(p, g, binary=True) == pytest.approx((0.04 + 0.49) / 2)
    assert brier([[1.0, 0.0, 0.0]], np.array([0])) == 0.0
    assert brier([[0.0, 1.0, 0.0]], np.array([0])) == 2.0


def test_log_loss_and_zero_probability():
    assert log_loss([[0.5, 0.5], [0.25, 0.75]], np.array([0, 1])) == pytest.approx(
        -(math.log(0.5) + math.log(0.75)) / 2
    )
    assert log_loss([[1.0, 0.0]], np.array([1])) == 1000.0  # clipped, finite


def test_question_report_figures():
    probs = np.array([[0.9, 0.1], [0.6, 0.4], [0.2, 0.8], [0.7, 0.3]])
    gold = np.array([0, 1, 1, 0])
    rep = question_report(probs, gold, ["true", "false"], binary=True, bins=10)
    assert rep["accuracy"] == 0.75
    assert rep["labels"] == ["true", "false"]
    assert rep["confusion"] == [[2, 0], [1, 1]]
    assert rep["brier"] == pytest.approx(np.mean([0.01, 0.36, 0.04, 0.09]))
    # ECE of the top probability: bins (0.8,0.9] {0.9 ok}, (0.7,0.8] {0.8 ok}, (0.6,0.7] {0.7 ok}, (0.5,0.6] {0.6 wrong}
    assert rep["ece"] == pytest.approx((0.1 + 0.2 + 0.3 + 0.6) / 4)
    text = format_question_report("spam", "noul", "is_spam", rep)
    assert "accuracy 75.00 %" in text and "Brier" in text and "ECE" in text


def test_bad_input_named():
    with pytest.raises(EvaluationError, match="option indices"):
        question_report([[0.5, 0.5]], np.array([2]), ["a", "b"])
    with pytest.raises(EvaluationError, match="shape"):
        question_report([[0.5, 0.5]], np.array([0]), ["a", "b", "c"])
    with pytest.raises(EvaluationError, match="nothing to score"):
        question_report(np.zeros((0, 2)), np.zeros(0, dtype=int), ["a", "b"])


def test_apply_temperature():
    p = np.array([[0.7, 0.2, 0.1]])
    assert apply_temperature(p, 1.0) is not None and np.array_equal(apply_temperature(p, 1.0), p)
    hot = apply_temperature(p, 2.0)
    expect = np.sqrt(p) / np.sqrt(p).sum()
    assert np.allclose(hot, expect)
    assert np.argmax(hot) == 0


def test_fit_temperature_recovers_a_known_one():
    rng = np.random.default_rng(0)
    n, k, true_t = 4000, 3, 2.5
    logits = rng.normal(0, 3, size=(n, k))
    truth = np.exp(logits - logits.max(1, keepdims=True))
    truth /= truth.sum(1, keepdims=True)
    gold = np.array([rng.choice(k, p=row) for row in truth])
    overconfident = apply_temperature(truth, 1 / true_t)  # the model's probabilities, too sharp
    t, info = fit_temperature(overconfident, gold)
    assert t == pytest.approx(true_t, rel=0.1)
    assert info["nll_fitted"] < info["nll_raw"] and info["converged"] and not info["at_bound"]


def test_fit_temperature_separable_sample_sharpens_toward_its_bound():
    t, info = fit_temperature([[0.9, 0.1], [0.2, 0.8]], np.array([0, 1]))
    assert T_BOUNDS[0] <= t < 0.1 and info["nll_fitted"] < 1e-6
    with pytest.raises(EvaluationError, match="at least 2"):
        fit_temperature([[0.9, 0.1]], np.array([0]))
