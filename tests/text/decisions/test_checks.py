"""The checks both decision APIs make (`text/decisions/checks.py`): a question's name, a state, a count."""

from __future__ import annotations

import json

import pytest

from mlx_slm.text.decisions.errors import DecisionError
from mlx_slm.text.decisions.files import read_questions_file
from mlx_slm.text.decisions.openai import parse_openai


def test_a_question_name_used_twice_is_refused(tmp_path):
    """Answers are found by key: a name used twice, or one like an unnamed question's "#<index>",
    is refused naming the field (a 400 on the route, exit 2 for a questions file)."""
    from mlx_slm.ground.errors import UserError

    q = {"type": "predicate", "name": "refund", "instructions": "Refund?"}
    for qs in ([q, {**q, "instructions": "Again?"}], [{"type": "predicate", "instructions": "?"}, {**q, "name": "#0"}]):
        with pytest.raises(DecisionError) as e:
            parse_openai({"model": "m", "input": "x", "questions": qs})
        assert e.value.loc == ("body", "questions", 1, "name") and "unique" in e.value.msg
        p = tmp_path / "q.json"
        p.write_text(json.dumps(qs))
        with pytest.raises(UserError):
            read_questions_file(str(p))
