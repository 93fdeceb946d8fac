"""A questions file (`text/decisions/files.py`): either API's questions, or a whole body; its errors name
the file."""

from __future__ import annotations

import json

import pytest

from mlx_slm.text.decisions.errors import DecisionError
from mlx_slm.text.decisions.files import read_questions_file

QUESTIONS = {
    "urgent": {"type": "noul", "instructions": "Is it urgent?", "criteria": {"true": "Needs action today"}},
    "both": {"type": "noul", "instructions": {"ask": "spam?"}, "criteria": {"true": "ads", "false": ["real", 1]}},
    "none": {"type": "noul"},
    "team": {"type": "choice", "instructions": "Which team?",
             "criteria": {"billing": "Payments", "sales": None, "ops": {"k": "v"}, "x": ["a", "b"]}},
    "anger": {"type": "score", "instructions": ["How", "angry?"], "criteria": ["Calm", {"lvl": 1}, "Very angry"]},
}  # fmt: skip


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
