"""A questions file (`text/decisions/files.py`): either API's questions, or a whole body; its errors name
the file."""

from __future__ import annotations

import json

import pytest

from mlx_slm.text.decisions.errors import DecisionError
from mlx_slm.text.decisions.files import read_questions_file
from tests.decision_cases import QUESTIONS


@pytest.mark.parametrize("content", [QUESTIONS, {"model": "m", "state": "s", "questions": QUESTIONS},
                                     [{"type": "predicate", "instructions": "x"}]])  # fmt: skip
def test_questions_file(tmp_path, content):
    p = tmp_path / "q.json"
    p.write_text(json.dumps(content))
    qs = read_questions_file(str(p))
    assert len(qs) == (1 if isinstance(content, list) else len(QUESTIONS))


def test_a_question_whose_id_is_questions_is_a_question_not_a_body(tmp_path):
    """System One ids are the client's: {"questions": {"type": ...}, ...} is a questions object whose
    first question is called "questions", read as the route reads it, not as a body's questions."""
    p = tmp_path / "q.json"
    p.write_text(
        json.dumps({"questions": {"type": "noul", "instructions": "A question?"}, "urgent": QUESTIONS["urgent"]})
    )
    assert [q.key for q in read_questions_file(str(p))] == ["questions", "urgent"]


def test_questions_file_errors_name_the_file(tmp_path):
    p = tmp_path / "q.json"
    p.write_text('{"a": {"type": "choice"}}')
    with pytest.raises(DecisionError, match="q.json"):
        read_questions_file(str(p))


@pytest.mark.parametrize(
    "question, field, near",
    [
        ({"type": "noul", "instrutions": "Is it urgent?"}, "instrutions", "instructions"),
        ({"type": "noul", "critera": {"true": "today"}}, "critera", "criteria"),
        ({"type": "score", "criteria": ["a", "b"], "levles": ["x"]}, "levles", None),
    ],
)
def test_a_question_field_that_is_no_field_is_refused_in_a_file(tmp_path, question, field, near):
    """A typo in a questions file would drop its content unseen (the question asked without its
    instructions): refused naming the file, the question and the field; `x_` fields are a client's
    own. (On the wire they are ignored, as TypeSafe's schema does: `parse_systemone`.)"""
    from mlx_slm.text.decisions.systemone import parse_systemone

    p = tmp_path / "q.json"
    p.write_text(json.dumps({"t": question, "u": {"type": "noul", "x_note": "mine"}}))
    with pytest.raises(DecisionError) as e:
        read_questions_file(str(p))
    assert "q.json" in str(e.value) and f"questions.t.{field}: unknown field {field!r}" in str(e.value), e.value
    assert (f"did you mean {near!r}" in str(e.value)) == (near is not None), e.value
    assert len(parse_systemone({"model": "m", "state": "s", "questions": {"t": question}}).questions) == 1


@pytest.mark.parametrize(
    "text, key",
    [
        (
            '{"team": {"type": "noul", "instructions": "Billing?"}, "team": {"type": "noul", "instructions": "x"}}',
            "team",
        ),
        ('{"t": {"type": "choice", "instructions": "?", "criteria": {"a": "x", "b": null, "a": "y"}}}', "a"),
        ('{"t": {"type": "choice", "type": "noul", "instructions": "?"}}', "type"),
        ('[{"type": "predicate", "instructions": "x", "instructions": "y"}]', "instructions"),
    ],
    ids=["question", "option", "field", "openai"],
)
def test_a_key_written_twice_is_refused_not_dropped(tmp_path, text, key):
    """JSON keeps the last of a key written twice: a question, an option or a field would vanish
    unseen; the file is refused naming the key."""
    p = tmp_path / "q.json"
    p.write_text(text)
    with pytest.raises(DecisionError, match=f"q.json: the key '{key}' is written twice in one object"):
        read_questions_file(str(p))
