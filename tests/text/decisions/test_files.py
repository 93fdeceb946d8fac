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
