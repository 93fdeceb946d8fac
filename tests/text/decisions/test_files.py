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
