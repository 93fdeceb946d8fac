"""Calibration on synthetic label scores: no model, pure numpy.

Synthetic items: gold y, scores x = signal * onehot(y) + bias + N(0, sd^2). With
signal == sd^2 the bias-free softmax(x - bias) is exactly the Bayes posterior under a
uniform prior, so a fitted offset should recover -(bias - mean(bias)) with T = 1.
"""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from mlx_slm.text.calibration import (
    DEFAULT_WARMUP,
    LOG_FLOOR,
    METHODS,
    CalibrationError,
    Calibrator,
    fit,
    fit_batch,
    fit_em,
    fit_labelled,
    gold_indices,
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


def lse_rows(a):
    m = a.max(axis=1, keepdims=True)
    return (m + np.log(np.exp(a - m).sum(axis=1, keepdims=True)))[:, 0]


# ---------------------------------------------------------------------------- basics
def test_constants():
    assert METHODS == ("none", "batch", "em", "fit")
    assert DEFAULT_WARMUP == 512


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


def test_identity_keeps_argmax_and_values():
    lp, _ = synth(200, seed=1)
    c = Calibrator.identity(L3)
    assert c.method == "none" and c.log_prior == (0.0, 0.0, 0.0) and c.temperature == 1.0
    out = c.apply(lp)
    assert np.array_equal(np.argmax(out, axis=1), np.argmax(lp, axis=1))
    assert np.allclose(out, lp)


def test_apply_rows_are_normalized_log_probs_and_accept_raw_scores():
    rng = np.random.default_rng(2)
    scores = rng.normal(0, 10, (50, 3)) + 100.0  # raw scores, not normalized
    c = Calibrator("fit", L3, (0.3, -0.1, -0.2), 0.7)
    out = c.apply(scores)
    assert out.shape == (50, 3)
    assert np.allclose(lse_rows(out), 0.0, atol=1e-12)
    assert np.all(out <= 0)
    # same as applying to the normalized log-probs, and the documented formula
    assert np.allclose(out, c.apply(log_softmax(scores)))
    assert np.allclose(out, log_softmax(log_softmax(scores) / 0.7 - np.array([0.3, -0.1, -0.2])))
    # one row in, one row out
    assert np.allclose(c.apply(scores[0]), out[0])
    # -inf scores are fine; the output floor keeps it finite
    row = c.apply(np.array([[0.0, -np.inf, -1.0]]))
    assert row[0, 1] == LOG_FLOOR and np.isfinite(row).all()
    assert c.apply(np.zeros((0, 3))).shape == (0, 3)


def test_to_dict_from_dict_round_trip_via_json():
    lp, gold = synth(300, seed=3)
    for c in (fit_labelled(lp, gold, L3, temperature=True), fit_batch(lp, L3), fit_em(lp, L3), Calibrator.identity(L3)):
        d = json.loads(json.dumps(c.to_dict(), allow_nan=False))
        back = Calibrator.from_dict(d)
        assert back == c
        assert back.info == json.loads(json.dumps(c.to_dict()["info"]))
        assert np.array_equal(back.apply(lp), c.apply(lp))
    assert d["method"] == "none" and d["labels"] == list(L3)


@pytest.mark.parametrize(
    "mutate, field",
    [
        (lambda d: d.pop("labels"), "'labels' is missing"),
        (lambda d: d.update(log_prior=[0.0, 1.0]), "log_prior has 2 values"),
        (lambda d: d.update(log_prior=["x", 0, 0]), "'log_prior' must be a list of numbers"),
        (lambda d: d.update(temperature=0), "temperature must be a finite number > 0"),
        (lambda d: d.update(temperature="hot"), "'temperature' must be a number"),
        (lambda d: d.update(method="magic"), "'magic' is not one of"),
        (lambda d: d.update(format="something-else"), "field 'format'"),
        (lambda d: d.update(n=-1), "n must be a non-negative integer"),
        (lambda d: d.update(info=[]), "'info' must be an object"),
    ],
)
def test_from_dict_names_the_bad_field(mutate, field):
    d = Calibrator("batch", L3, (0.1, 0.2, 0.3), 1.0, 10).to_dict()
    mutate(d)
    with pytest.raises(CalibrationError, match=field):
        Calibrator.from_dict(d)


def test_check_labels():
    c = Calibrator.identity(L3)
    c.check_labels(list(L3))
    with pytest.raises(CalibrationError, match="made for labels"):
        c.check_labels(["bug", "billing", "other"])


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


def test_gold_indices():
    assert gold_indices(["bug", "other", "billing"], L3).tolist() == [1, 2, 0]
    with pytest.raises(CalibrationError, match="gold label 'refund' \\(item 1\\) is not one of the labels"):
        gold_indices(["bug", "refund"], L3)


# ---------------------------------------------------------------------------- properties
finite = st.floats(allow_nan=False, allow_infinity=False)


@st.composite
def cases(draw):
    n = draw(st.integers(1, 12))
    k = draw(st.integers(2, 8))
    x = draw(hnp.arrays(np.float64, (n, k), elements=finite))
    prior = draw(hnp.arrays(np.float64, (k,), elements=finite))
    t = draw(st.floats(min_value=1e-6, max_value=1e6))
    return x, prior, t


@settings(max_examples=150, deadline=None)
@given(cases())
def test_apply_returns_finite_normalized_rows(case):
    x, prior, t = case
    k = x.shape[1]
    c = Calibrator("fit", tuple(f"l{i}" for i in range(k)), tuple(prior), t)
    out = c.apply(x)
    assert out.shape == x.shape
    assert np.all(np.isfinite(out))
    assert np.all(out <= 0)
    assert np.allclose(lse_rows(out), 0.0, atol=1e-9)


@settings(max_examples=150, deadline=None)
@given(cases())
def test_zero_prior_never_changes_argmax(case):
    x, _, t = case
    k = x.shape[1]
    labels = tuple(f"l{i}" for i in range(k))
    srt = np.sort(x, axis=1)
    with np.errstate(over="ignore"):
        clear = srt[:, -1] - srt[:, -2] > 1e-6  # rows with a clear winner (exact ties may round either way)
    for c in (Calibrator.identity(labels), Calibrator("none", labels, (0.0,) * k, t)):
        out = c.apply(x)
        assert np.array_equal(np.argmax(out, axis=1)[clear], np.argmax(x, axis=1)[clear])
        # and order is never reversed: x_i < x_j implies out_i <= out_j
        less = x[:, :, None] < x[:, None, :]
        assert not np.any(less & (out[:, :, None] > out[:, None, :]))


def test_calibration_spec_one_value_for_every_form():
    from mlx_slm.text.calibration import CalibrationSpec

    labels = ("a", "b")
    prior = fit_batch(np.log(np.array([[0.7, 0.3], [0.6, 0.4]])), labels)
    base = replace(prior, method="fit")
    # The task file's JSON, as before: "none", "batch", a prior's dict, {"method": "em", "base": ...}.
    for spec, js in [
        (CalibrationSpec.of("none"), "none"),
        (CalibrationSpec.of("batch", warmup=64), "batch"),
        (CalibrationSpec.of(prior), prior.to_dict()),
        (CalibrationSpec("em", base=base), {"method": "em", "base": base.to_dict()}),
    ]:
        assert spec.to_dict() == js
        assert CalibrationSpec.from_dict(js, spec.warmup) == spec
    assert CalibrationSpec.of("batch", warmup=64).record() == {"method": "batch", "warmup": 64}
    assert CalibrationSpec.of("em").needs_data and CalibrationSpec.of("fit").needs_data
    assert not CalibrationSpec("em", base=base).needs_data and CalibrationSpec("em", base=base).fitted
    assert not CalibrationSpec.of(Calibrator.identity(labels)).applies
    with pytest.raises(CalibrationError):
        CalibrationSpec.of("bogus")
    with pytest.raises(CalibrationError, match="needs fitting first"):
        CalibrationSpec.of("em").run(labels)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.floats(0.0, 1.0, allow_nan=False), min_size=2, max_size=5),
    st.integers(0, 4),
    st.floats(-4e-7, 4e-7),
)
def test_abstain_is_decided_on_the_probabilities_as_written(weights, pick, nudge):
    """A reader of any output recomputes the decision: abstained == (max(probs) < bar), with the
    bar taken from a written probability, nudged below the sixth decimal (a machine's last bits)."""
    from mlx_slm.text.calibration import Calibration
    from mlx_slm.text.predictions import Prediction

    w = np.asarray(weights) + 1e-3
    labels = [f"l{i}" for i in range(len(w))]
    p = w / w.sum()
    pred = Prediction(
        0, labels[int(np.argmax(p))], dict(zip(labels, p.tolist())), dict(zip(labels, np.log(p).tolist()))
    )
    bar = round(float(p[pick % len(p)]) + nudge, 6)  # a threshold a user copied from a written file
    (out,) = Calibration("none", labels, min_confidence=min(bar, 1.0))(iter([pred]))
    assert all(v == round(v, 6) for v in out.probs.values())
    assert out.abstained == (max(out.probs.values()) < min(bar, 1.0))
    assert (out.label is None) == out.abstained
