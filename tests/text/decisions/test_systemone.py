"""System One's requests (`text/decisions/systemone.py`) read and checked whole: every bad input named
by its `loc` and `type`, as FastAPI names it; unknown fields ignored."""

from __future__ import annotations

import json

import pytest

from mlx_slm.text.decisions.errors import DecisionError
from mlx_slm.text.decisions.systemone import parse_systemone

BAD_SYSTEMONE = [
    ({"state": "s", "questions": {}}, ("body", "questions"), "too_short"),
    ({"state": "s", "questions": {f"q{i}": {"type": "noul"} for i in range(401)}}, ("body", "questions"), "too_long"),
    ({"state": "s"}, ("body", "questions"), "missing"),
    ({"questions": {"a": {"type": "noul"}}}, ("body", "state"), "missing"),
    ({"state": None, "questions": {"a": {"type": "noul"}}}, ("body", "state"), "type_error"),
    ({"state": 3, "questions": {"a": {"type": "noul"}}}, ("body", "state"), "type_error"),
    ({"state": "s", "questions": {"a": {"type": "boolean"}}}, ("body", "questions", "a", "type"), "literal_error"),
    ({"state": "s", "questions": {"a": {"instructions": "x"}}}, ("body", "questions", "a", "type"), "missing"),
    ({"state": "s", "questions": {"a": {"type": "choice"}}}, ("body", "questions", "a", "criteria"), "missing"),
    ({"state": "s", "questions": {"a": {"type": "choice", "criteria": {}}}}, ("body", "questions", "a", "criteria"), "too_short"),
    ({"state": "s", "questions": {"a": {"type": "choice", "criteria": {"x": None}}}}, ("body", "questions", "a", "criteria"), "too_short"),
    ({"state": "s", "questions": {"a": {"type": "choice", "criteria": {str(i): None for i in range(256)}}}},
     ("body", "questions", "a", "criteria"), "too_long"),
    ({"state": "s", "questions": {"a": {"type": "score", "criteria": ["x"]}}}, ("body", "questions", "a", "criteria"), "too_short"),
    ({"state": "s", "questions": {"a": {"type": "score", "criteria": [str(i) for i in range(11)]}}},
     ("body", "questions", "a", "criteria"), "too_long"),
    ({"state": "s", "questions": {"a": {"type": "score", "criteria": {"0": "a", "1": "b"}}}},
     ("body", "questions", "a", "criteria"), "type_error"),
    ({"state": "s", "questions": {"a": {"type": "score", "criteria": ["a", None]}}}, ("body", "questions", "a", "criteria", 1), "type_error"),
    ({"state": "s", "questions": {"a": {"type": "noul", "instructions": 5}}}, ("body", "questions", "a", "instructions"), "type_error"),
    ({"state": "bad \ud800", "questions": {"a": {"type": "noul"}}}, ("body", "state"), "value_error"),
    ({"state": json.loads("[" * 40 + "]" * 40), "questions": {"a": {"type": "noul"}}}, ("body", "state"), "too_deep"),
]  # fmt: skip


@pytest.mark.parametrize("body,loc,kind", BAD_SYSTEMONE)
def test_bad_systemone_input_named(body, loc, kind):
    with pytest.raises(DecisionError) as e:
        parse_systemone({"model": "jev-latest", **body})
    assert (e.value.loc, e.value.type) == (loc, kind)
    assert e.value.msg


def test_unknown_fields_ignored_and_one_sided_criteria_accepted():
    body = {
        "model": "m",
        "state": "s",
        "x_nonce": 3,
        "questions": {"n": {"type": "noul", "criteria": {"false": None}, "extra": 1}},
    }
    (q,) = parse_systemone(body).questions
    assert q.descriptions == (None, None)
