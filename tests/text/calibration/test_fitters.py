"""The calibration fitters (`text/calibration/fitters.py`: batch, EM, a labelled fit) on synthetic
label scores: no model, pure numpy.

Synthetic items: gold y, scores x = signal * onehot(y) + bias + N(0, sd^2). With
signal == sd^2 the bias-free softmax(x - bias) is exactly the Bayes posterior under a
uniform prior, so a fitted offset should recover -(bias - mean(bias)) with T = 1.
"""

from __future__ import annotations

import numpy as np
import pytest

from mlx_slm.text.calibration import (
    CalibrationError,
    Calibrator,
    fit,
    fit_batch,
    fit_em,
    fit_labelled,
)
from mlx_slm.text.labels import log_softmax

L3 = ("billing", "bug", "other")
BIAS = np.array([2.0, 0.0, -1.0])


def synth(n, prior=(1 / 3, 1 / 3, 1 / 3), bias=BIAS, signal=4.0, sd=2.0, seed=0):
    rng = np.random.default_rng(seed)
    gold = rng.choice(len(prior), size=n, p=prior)
    x = np.eye(len(prior))[gold] * signal + np.asarray(bias) + rng.normal(0.0, sd, (n, len(prior)))
    return log_softmax(x), gold


def acc(lp, gold):
    return float(np.mean(np.argmax(lp, axis=1) == gold))


def test_batch_recovers_accuracy_on_biased_balanced_data():
    lp, gold = synth(3000, seed=0)
    c = fit_batch(lp, L3)
    assert c.method == "batch" and c.n == 3000 and c.temperature == 1.0
    raw, cal = acc(lp, gold), acc(c.apply(lp), gold)
    assert raw == pytest.approx(0.7697, abs=1e-3)
    assert cal == pytest.approx(0.821, abs=1e-3)
    # its prior is the mean predicted distribution
    assert np.allclose(np.exp(c.log_prior), np.exp(lp).mean(axis=0))
    assert c.info["prior"]["billing"] > 0.5


def test_batch_strongly_biased_model():
    # a bias of 5 nats toward 'billing': batch calibration helps but under-corrects (the mean
    # prediction is flatter than the bias), a labelled fit removes it
    lp, gold = synth(3000, bias=[5.0, 0.0, 0.0], seed=4)
    raw, cal = acc(lp, gold), acc(fit_batch(lp, L3).apply(lp), gold)
    fitted = acc(fit_labelled(lp, gold, L3, temperature=False).apply(lp), gold)
    assert raw == pytest.approx(0.567, abs=1e-3)
    assert cal == pytest.approx(0.715, abs=1e-3)
    assert fitted == pytest.approx(0.876, abs=1e-3)


# ---------------------------------------------------------------------------- labelled fit
def test_fit_labelled_recovers_known_offset():
    lp, gold = synth(3000, seed=0)
    c = fit_labelled(lp, gold, L3, temperature=False)
    target = BIAS - BIAS.mean()  # log_prior = -b = the bias, centered
    assert np.allclose(c.log_prior, target, atol=0.06)
    assert abs(sum(c.log_prior)) < 1e-9
    assert c.temperature == 1.0
    i = c.info
    assert i["folds"] == 5 and i["n"] == 3000 and i["support"] == {"billing": 990, "bug": 1013, "other": 997}
    assert i["cv_accuracy_raw"] == pytest.approx(0.7697, abs=1e-3)
    assert i["cv_accuracy_calibrated"] > i["cv_accuracy_raw"] + 0.08
    assert i["cv_logloss_calibrated"] < i["cv_logloss_raw"] - 0.2
    assert i["converged"]


def test_fit_labelled_temperature():
    # scores twice as sharp as the Bayes posterior: the fitted T should be about 2
    lp, gold = synth(4000, seed=5)
    c = fit_labelled(2.0 * lp, gold, L3, temperature=True)
    assert c.temperature == pytest.approx(2.0, rel=0.1)
    assert np.allclose(c.log_prior, BIAS - BIAS.mean(), atol=0.1)
    auto = fit_labelled(2.0 * lp, gold, L3, temperature="auto")
    assert auto.info["temperature_fitted"] is True
    assert auto.info["cv_logloss_with_temperature"] < auto.info["cv_logloss_offsets_only"]
    # already at T = 1: auto keeps offsets only
    auto1 = fit_labelled(lp, gold, L3, temperature="auto")
    assert auto1.info["temperature_fitted"] is False and auto1.temperature == 1.0


def test_fit_labelled_tiny_sample_stays_bounded():
    # separable sample of 4: the L2 prior keeps the offsets finite and moderate
    lp = log_softmax(np.array([[3.0, 0, 0], [0, 3.0, 0], [0, 0, 3.0], [0, 0, 2.0]]))
    c = fit_labelled(lp, [0, 1, 2, 2], L3, temperature=True)
    assert np.all(np.abs(c.log_prior) < 10) and 1e-3 <= c.temperature <= 1e3
    assert c.info["folds"] == 0 and c.info["cv_accuracy_raw"] is None
    assert "single example" in c.info["cv_note"]
    # folds shrink to the smallest label count
    lp, gold = synth(60, seed=6)
    gold[:] = 0
    gold[:3], gold[3:6] = 1, 2
    assert fit_labelled(lp, gold, L3).info["folds"] == 3


def test_fit_dispatcher():
    lp, gold = synth(300, seed=7)
    assert fit("none", None, L3) == Calibrator.identity(L3)
    assert fit("none", lp, L3).n == 300
    assert fit("batch", lp, L3) == fit_batch(lp, L3)
    assert fit("em", lp, L3, max_iter=5).info["iterations"] <= 5
    assert fit("fit", lp, L3, gold_idx=gold, temperature=False) == fit_labelled(lp, gold, L3, temperature=False)
    with pytest.raises(CalibrationError, match="needs gold labels"):
        fit("fit", lp, L3)
    with pytest.raises(CalibrationError, match="'platt' is not one of"):
        fit("platt", lp, L3)


# ---------------------------------------------------------------------------- EM
def test_em_beats_batch_on_skewed_input_with_calibrated_model():
    # an unbiased model on a 70/20/10 input: batch calibration assumes balance and hurts
    lp, gold = synth(3000, prior=(0.7, 0.2, 0.1), bias=(0, 0, 0), seed=3)
    raw, batch = acc(lp, gold), acc(fit_batch(lp, L3).apply(lp), gold)
    em = fit_em(lp, L3)
    got = acc(em.apply(lp), gold)
    assert em.info["converged"] and em.info["base"] == "uniform"
    assert list(em.info["prior"].values()) == pytest.approx([0.7, 0.2, 0.1], abs=0.02)
    assert batch == pytest.approx(0.799, abs=1e-3)
    assert got == pytest.approx(0.906, abs=1e-3)
    assert got > raw + 0.02 and got > batch + 0.08


def test_em_with_measured_bias_beats_batch_on_skewed_input():
    # a model biased toward the *minority* label; bias measured once on a balanced labelled sample
    bias = np.array([-1.0, 0.0, 2.0])
    ref, ref_gold = synth(600, bias=bias, seed=2)
    base = fit_labelled(ref, ref_gold, L3)
    lp, gold = synth(3000, prior=(0.7, 0.2, 0.1), bias=bias, seed=1)
    em = fit_em(lp, L3, base=base)
    assert em.info["base"] == "calibrator:fit"
    assert list(em.info["prior"].values()) == pytest.approx([0.7, 0.2, 0.1], abs=0.02)
    raw, batch, got = acc(lp, gold), acc(fit_batch(lp, L3).apply(lp), gold), acc(em.apply(lp), gold)
    assert raw < 0.66 and batch < 0.66
    assert got > 0.88
    # and EM with a uniform base reads the bias as label shift: no better than raw
    assert acc(fit_em(lp, L3).apply(lp), gold) <= raw


def test_em_apply_equals_em_posteriors():
    lp, _ = synth(500, prior=(0.6, 0.3, 0.1), bias=(0, 0, 0), seed=8)
    em = fit_em(lp, L3, tol=1e-12, max_iter=10_000)
    pi = np.array(list(em.info["prior"].values()))
    q = np.exp(em.apply(lp))
    assert np.allclose(q, np.exp(lp) * pi / (np.exp(lp) * pi).sum(axis=1, keepdims=True), atol=1e-5)
    assert np.allclose(q.mean(axis=0), pi, atol=1e-5)  # the EM fixed point


def test_em_explicit_base_prior_and_batch_base_refused():
    lp, _ = synth(300, seed=9)
    a = fit_em(lp, L3, base=[0.5, 0.25, 0.25])
    assert a.info["base"] == "given"
    with pytest.raises(CalibrationError, match="no-op"):
        fit_em(lp, L3, base="batch")
    with pytest.raises(CalibrationError, match="3 positive probabilities"):
        fit_em(lp, L3, base=[0.5, 0.5])


# ---------------------------------------------------------------------------- errors
def test_errors():
    lp, gold = synth(30, seed=10)
    with pytest.raises(CalibrationError, match="empty"):
        fit_batch(np.zeros((0, 3)), L3)
    with pytest.raises(CalibrationError, match="empty"):
        fit_labelled(np.zeros((0, 3)), [], L3)
    with pytest.raises(CalibrationError, match="at least 2 items"):
        fit_batch(lp[:1], L3)
    with pytest.raises(CalibrationError, match="at least 2 items"):
        fit_em(lp[:1], L3)
    g = gold.copy()
    g[g == 1] = 0
    with pytest.raises(CalibrationError, match="no example of label 'bug': add some, or drop the label"):
        fit_labelled(lp, g, L3)
    g[0] = 3
    with pytest.raises(CalibrationError, match=r"gold_idx\[0\] = 3 is out of range"):
        fit_labelled(lp, g, L3)
    with pytest.raises(CalibrationError, match=r"shape \(30,\)"):
        fit_labelled(lp, gold[:-1], L3)
    with pytest.raises(CalibrationError, match="2 columns but there are 3 labels"):
        fit_batch(lp[:, :2], L3)
    with pytest.raises(CalibrationError, match="2-D"):
        fit_batch(lp[0], L3)
    with pytest.raises(CalibrationError, match="2 columns but there are 3 labels"):
        Calibrator.identity(L3).apply(lp[:, :2])
    with pytest.raises(CalibrationError, match="NaN"):
        fit_batch(np.array([[0.0, np.nan, 0.0], [0, 0, 0]]), L3)
    with pytest.raises(CalibrationError, match="at least two labels"):
        Calibrator.identity(["only"])
    with pytest.raises(CalibrationError, match="given twice"):
        fit_batch(lp, ["a", "a", "b"])
    with pytest.raises(CalibrationError, match="integer label indices"):
        fit_labelled(lp, gold + 0.5, L3)
