"""Each API's answer shape: no option lost to another of the same text, and what made an answer
(`x_method`, `x_raw_...`) only where anything beyond the raw letters did."""

from __future__ import annotations

import numpy as np
import pytest

from mlx_slm.text.decisions.answers import RAW_METHOD, answer, systemone_answer
from mlx_slm.text.decisions.methods import Method
from mlx_slm.text.decisions.openai import openai_questions
from mlx_slm.text.decisions.settings import DecisionConfig
from mlx_slm.text.decisions.systemone import parse_systemone, systemone_questions
from tests.decision_cases import QUESTIONS, transformers_questions

CFG = DecisionConfig()


def test_the_raw_record_is_what_a_plain_method_says():
    assert Method().record() == RAW_METHOD


def test_a_string_and_a_boolean_of_one_text_are_both_answered_in_system_ones_shape():
    """decide --shape systemone of an OpenAI list holding "true" and true: both options keep their
    probability (the string keyed as JSON), the probabilities sum to 1 (issue 53's lost option)."""
    (q,) = openai_questions(
        [{"type": "choice", "instructions": "?", "choices": [{"value": "true"}, {"value": True}, {"value": "no"}]}], CFG
    )
    p = np.array([0.3, 0.5, 0.2])
    got = answer(q, p, "systemone")
    assert got["probabilities"] == {'"true"': 0.3, "true": 0.5, "no": 0.2}
    assert sum(got["probabilities"].values()) == pytest.approx(1.0) and got["choice"] == "true"
    oa = answer(q, p, "openai")
    assert [x["value"] for x in oa["probabilities"]] == ["true", True, "no"] and oa["choice"] is True


@pytest.mark.parametrize("shape, field", [("systemone", "probabilities"), ("openai", "probabilities")])
def test_a_changed_answer_carries_its_method_and_raw_probabilities(shape, field):
    (q,) = systemone_questions({"t": {"type": "choice", "instructions": "?", "criteria": {"a": None, "b": None}}}, CFG)
    raw, final = np.array([0.7, 0.3]), np.array([0.4, 0.6])
    plain = answer(q, raw, shape, raw, RAW_METHOD)
    assert "x_method" not in plain and "x_raw_probabilities" not in plain
    applied = {**RAW_METHOD, "calibration": "batch"}
    got = answer(q, final, shape, raw, applied)
    assert got["x_method"] == applied
    assert got["x_raw_probabilities"] == answer(q, raw, shape)[field]


@pytest.mark.parametrize("shape", ["systemone", "openai"])
def test_an_answer_nothing_divided_has_no_raw_field_even_from_a_copy(shape):
    """A trained or restyled answer (no prior, no fit) IS its raw answer: no x_raw field, whether the
    raw array is the same object (a local run) or an equal copy (Ray's workers, after JSON)."""
    (q,) = systemone_questions({"t": {"type": "choice", "instructions": "?", "criteria": {"a": None, "b": None}}}, CFG)
    p = np.array([0.7, 0.3])
    for applied in ({**RAW_METHOD, "trained": "head"}, {**RAW_METHOD, "style": "names", "permute": 2}):
        same, copy = answer(q, p, shape, p, applied), answer(q, p, shape, p.copy(), applied)
        assert same == copy and "x_raw_probabilities" not in copy and copy["x_method"] == applied


@pytest.mark.parametrize("shape", ["systemone", "openai"])
def test_none_of_these_changes_the_choice_only_and_says_so(shape):
    """An answer whose record says "none of these" answered it chooses that option; its
    probabilities and confidence stay the method's (`chosen_index`: the one home of the rule)."""
    (q,) = systemone_questions(
        {"t": {"type": "choice", "instructions": "?", "criteria": {"a": None, "b": None, "none": None}}}, CFG
    )
    p = np.array([0.5, 0.3, 0.2])
    none = {"option": "none", "min_confidence": 0.6}
    top = answer(q, p, shape, p, {**RAW_METHOD, "none_of_these": {**none, "answered_none": False}})
    said = answer(q, p, shape, p, {**RAW_METHOD, "none_of_these": {**none, "answered_none": True}})
    assert top["choice"] == "a" and said["choice"] == "none"
    assert said["probabilities"] == top["probabilities"] and said["confidence"] == top["confidence"]
    assert said["x_method"]["none_of_these"]["answered_none"] is True


def test_a_noul_keeps_its_raw_answer_in_its_own_field():
    (q,) = systemone_questions({"u": {"type": "noul", "instructions": "?"}}, CFG)
    got = answer(
        q, np.array([0.2, 0.8]), "systemone", np.array([0.6, 0.4]), {**RAW_METHOD, "calibration": "contextual"}
    )
    assert got["noul"] == 0.2 and got["x_raw_noul"] == 0.6
    (p,) = openai_questions([{"type": "predicate", "instructions": "?"}], CFG)
    got = answer(p, np.array([0.2, 0.8]), "openai", np.array([0.6, 0.4]), {**RAW_METHOD, "calibration": "fit"})
    assert got["probability"] == 0.2 and got["x_raw_probability"] == 0.6


def test_a_refused_question_is_openais_refusal():
    (q,) = openai_questions([{"type": "predicate", "name": "n", "instructions": "?"}], CFG)
    assert answer(q, None, "openai") == {"type": "refusal", "name": "n"}


def test_answers_have_the_apis_shapes():
    body = {"model": "m", "state": "s", "questions": QUESTIONS}
    qs = {q.key: q for q in parse_systemone(body).questions}
    assert systemone_answer(qs["urgent"], np.array([0.8, 0.2])) == {"type": "noul", "noul": 0.8}
    a = systemone_answer(qs["team"], np.array([0.7, 0.1, 0.1, 0.1]))
    assert list(a) == ["type", "choice", "confidence", "probabilities"] and a["choice"] == "billing"
    assert a["confidence"] == pytest.approx((0.7 - 0.25) / 0.75)
    s = systemone_answer(qs["anger"], np.array([0.2, 0.5, 0.3]))
    assert s["score"] == pytest.approx(1.1) and s["legend"] == {"0": "Calm", "1": {"lvl": 1}, "2": "Very angry"}
    assert list(s["probabilities"]) == ["0", "1", "2"]
    # the same numbers as Transformers' Question.answer
    for key, p in (("team", [0.4, 0.3, 0.2, 0.1]), ("anger", [0.2, 0.5, 0.3]), ("urgent", [0.3, 0.7])):
        (t,) = transformers_questions({"questions": {key: QUESTIONS[key]}})
        assert close(systemone_answer(qs[key], np.array(p)), t.answer(p))


def close(a, b) -> bool:
    if isinstance(a, dict):
        return isinstance(b, dict) and list(a) == list(b) and all(close(a[k], b[k]) for k in a)
    if isinstance(a, float):
        return a == pytest.approx(b, abs=1e-12)
    return a == b
