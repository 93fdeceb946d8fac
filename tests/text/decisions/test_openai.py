"""OpenAI's requests read: an unknown parameter or field refused as OpenAI refuses it, never
ignored; text that is not valid Unicode said as such."""

from __future__ import annotations

import pytest

from mlx_slm.text.decisions.errors import DecisionError
from mlx_slm.text.decisions.openai import parse_openai
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
