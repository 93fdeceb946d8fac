"""OpenAI's requests read: an unknown parameter or field refused as OpenAI refuses it, never
ignored; text that is not valid Unicode said as such."""

from __future__ import annotations

import numpy as np
import pytest

from mlx_slm.text.decisions.answers import openai_answer
from mlx_slm.text.decisions.errors import DecisionError
from mlx_slm.text.decisions.openai import parse_openai
from mlx_slm.text.decisions.prompt import render_user_message
from mlx_slm.text.decisions.systemone import parse_systemone

Q = [{"type": "choice", "name": "team", "instructions": "?", "choices": [{"value": "a"}, {"value": "b"}]}]


def body(**more):
    return {"model": "gpt-6-luna", "input": "hi", "questions": Q, **more}


@pytest.mark.parametrize(
    "more, where, what",
    [
        ({"prompt_cache_kye": "k"}, "prompt_cache_kye", "unknown parameter"),
        ({"prompt_cache_options": {"mode": "forever"}}, "prompt_cache_options.mode", "implicit, explicit"),
        ({"prompt_cache_options": {"ttl": "1h"}}, "prompt_cache_options.ttl", "30m"),
        ({"prompt_cache_options": {"mode": "explicit", "size": 3}}, "prompt_cache_options.size", "unknown field"),
        ({"safety_identifier": 3}, "safety_identifier", "string"),
        ({"questions": [{**Q[0], "choises": []}]}, "questions.0.choises", "unknown field"),
        ({"questions": [{**Q[0], "choices": [{"value": "a", "label": "x"}, {"value": "b"}]}]}, "questions.0.choices.0.label", "unknown field"),
        ({"questions": [{**Q[0], "name": "\ud800"}]}, "questions.0.name", "not valid Unicode"),
        ({"questions": [{**Q[0], "choices": [{"value": "\ud800"}, {"value": "b"}]}]}, "questions.0.choices.0.value", "not valid Unicode"),
    ],
)  # fmt: skip
def test_refused_naming_the_field(more, where, what):
    with pytest.raises(DecisionError) as e:
        parse_openai(body(**more))
    assert str(e.value).startswith(f"{where}: ") and what in str(e.value)


def test_known_optional_parameters_are_taken():
    r = parse_openai(
        body(prompt_cache_key="k", prompt_cache_options={"mode": "implicit", "ttl": "30m"}, safety_identifier="u")
    )
    assert r.cache_key == "k" and r.refusal == "question"


def test_system_one_ignores_unknown_fields_and_names_bad_unicode():
    r = parse_systemone({"model": "m", "state": "s", "x_nonce": 3, "questions": {"q": {"type": "noul"}}})
    assert r.refusal == "request"
    with pytest.raises(DecisionError, match="not valid Unicode"):
        parse_systemone({"model": "m", "state": "s", "questions": {"\ud800": {"type": "noul"}}})
    with pytest.raises(DecisionError, match="an option's name is not valid Unicode"):
        parse_systemone(
            {
                "model": "m",
                "state": "s",
                "questions": {"q": {"type": "choice", "criteria": {"\ud800": None, "b": None}}},
            }
        )


def test_openai_request_and_answers():
    body = {
        "model": "gpt-6-luna",
        "input": [{"role": "user", "content": [{"type": "input_json", "data": {"msg": "hi"}}]}],
        "prompt_cache_key": "k1",
        "questions": [
            {"type": "predicate", "name": "refund", "instructions": "Asks for money back."},
            {"type": "choice", "instructions": "Which?", "choices": [
                {"value": "true"}, {"value": True, "description": "yes it is"}]},
            {"type": "score", "name": "u", "instructions": "Urgent?", "levels": [{"label": "low"}, {"label": "high", "description": "now"}]},
        ],
    }  # fmt: skip
    r = parse_openai(body)
    assert r.state == {"msg": "hi"} and r.cache_key == "k1" and r.refusal == "question"
    pred, choice, score = r.questions
    assert (pred.type, pred.key, choice.key, choice.name) == ("noul", "refund", "#1", None)
    assert choice.options == ("true", True) and choice.labels == ("A", "B")
    assert "A. true\nB. true: yes it is\n" in render_user_message(r.state, choice)
    assert "A. low\nB. high: now\n" in render_user_message(r.state, score)
    assert openai_answer(pred, np.array([0.9, 0.1])) == {"type": "predicate", "name": "refund", "probability": 0.9}
    a = openai_answer(choice, np.array([0.25, 0.75]))
    assert a["choice"] is True and a["probabilities"][1] == {"value": True, "probability": 0.75}
    s = openai_answer(score, np.array([0.25, 0.75]))
    assert s["probabilities"][1] == {"value": 1, "label": "high", "probability": 0.75}


def test_openai_input_messages_joined():
    body = {"model": "m", "questions": [{"type": "predicate", "instructions": "x"}],
            "input": [{"role": "system", "content": "Be strict."}, {"role": "user", "content": "Hello"}]}  # fmt: skip
    assert parse_openai(body).state == "System: Be strict.\n\nHello"


BAD_OPENAI = [
    ({"input": "s", "questions": []}, ("body", "questions"), "too_short"),
    ({"input": "s", "questions": [{"type": "predicate", "instructions": "x"}] * 401}, ("body", "questions"), "too_long"),
    ({"input": "s", "questions": [{"type": "choice", "instructions": "x", "choices": [{"value": "a"}, {"value": "a"}]}]},
     ("body", "questions", 0, "choices", 1, "value"), "value_error"),
    ({"input": "s", "questions": [{"type": "choice", "instructions": "x", "choices": [{"value": "a"}]}]},
     ("body", "questions", 0, "choices"), "too_short"),
    ({"input": "s", "questions": [{"type": "choice", "instructions": "x", "choices": [{"value": 1}, {"value": "a"}]}]},
     ("body", "questions", 0, "choices", 0, "value"), "type_error"),
    ({"input": "s", "questions": [{"type": "score", "instructions": "x", "levels": [{"label": "a"}]}]},
     ("body", "questions", 0, "levels"), "too_short"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "data:"}]}],
      "questions": [{"type": "predicate", "instructions": "x"}]}, ("body", "input", 0, "content", 0), "images"),
    ({"input": "s", "questions": [{"type": "yesno", "instructions": "x"}]}, ("body", "questions", 0, "type"), "literal_error"),
    ({"input": "s", "questions": [{"type": "predicate"}]}, ("body", "questions", 0, "instructions"), "missing"),
]  # fmt: skip


@pytest.mark.parametrize("body,loc,kind", BAD_OPENAI)
def test_bad_openai_input_named(body, loc, kind):
    with pytest.raises(DecisionError) as e:
        parse_openai({"model": "gpt-6-luna", **body})
    assert (e.value.loc, e.value.type) == (loc, kind)


def test_a_missing_model_is_named_with_the_routes_own_default():
    """OpenAI's client sends 'gpt-6-luna' by default, System One's 'jev-latest': each route's missing
    model names its own."""
    q = [{"type": "predicate", "instructions": "x"}]
    with pytest.raises(DecisionError) as e:
        parse_openai({"input": "s", "questions": q})
    assert e.value.loc == ("body", "model") and "'gpt-6-luna'" in str(e.value) and "jev" not in str(e.value)
    with pytest.raises(DecisionError) as e:
        parse_systemone({"state": "s", "questions": {"a": {"type": "noul", "instructions": "x"}}})
    assert e.value.loc == ("body", "model") and "'jev-latest'" in str(e.value)


def test_string_and_boolean_values_are_distinct():
    body = {"model": "m", "input": "s", "questions": [
        {"type": "choice", "instructions": "x", "choices": [{"value": "true"}, {"value": True}]}]}  # fmt: skip
    assert parse_openai(body).questions[0].options == ("true", True)


def test_openai_input_json_bounds():
    q = [{"type": "predicate", "instructions": "x"}]
    big = {
        "model": "m",
        "questions": q,
        "input": [{"role": "user", "content": [{"type": "input_json", "data": list(range(10_001))}]}],
    }
    with pytest.raises(DecisionError) as e:
        parse_openai(big)
    assert e.value.type == "too_long" and e.value.loc == ("body", "input", 0, "content", 0, "data")
    ok = {
        "model": "m",
        "questions": q,
        "input": [{"role": "user", "content": [{"type": "input_json", "data": list(range(9_000))}]}],
    }
    assert len(parse_openai(ok).state) == 9_000
    # 256 KiB measured as compact JSON: 4,000 strings of 62 characters are 260,001 bytes compact
    # (264,000 with ", " between them), so they fit
    near = [{"role": "user", "content": [{"type": "input_json", "data": ["x" * 62] * 4_000}]}]
    assert len(parse_openai({"model": "m", "questions": q, "input": near}).state) == 4_000
