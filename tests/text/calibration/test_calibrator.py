"""The `Calibrator` (`text/calibration/calibrator.py`): one offset per label and a temperature applied to
label log-probabilities, its JSON form, its checks of labels and gold labels; on synthetic scores (no model)."""

from __future__ import annotations

import json

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


def lse_rows(a):
    m = a.max(axis=1, keepdims=True)
    return (m + np.log(np.exp(a - m).sum(axis=1, keepdims=True)))[:, 0]


# ---------------------------------------------------------------------------- basics
def test_constants():
    assert METHODS == ("none", "batch", "em", "fit")
    assert DEFAULT_WARMUP == 512


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
        (lambda d: d.pop("temperature"), "'temperature' is missing"),  # never read as 1: the answers would change
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
