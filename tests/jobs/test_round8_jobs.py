"""Hostile round eight (issue 53), the jobs' part: messages that name the right thing. A number too
long for Python to read is said so in every JSON reader (not Python's `sys.set_int_max_str_digits`
advice, which no user of a file or an HTTP client can follow)."""

from __future__ import annotations

import pytest

from mlx_slm.classifier.task import Task
from mlx_slm.files.labelfiles import read_label_descriptions
from mlx_slm.files.readers import read_rows
from mlx_slm.ground.errors import UserError
from mlx_slm.text.prompts import read_examples
from mlx_slm.text.questions import read_questions

HUGE = "9" * 5000


def _fault(fn, path) -> str:
    with pytest.raises(UserError) as e:
        fn(str(path))
    return str(e.value)


@pytest.mark.parametrize(
    "name, line, read",
    [
        ("input.jsonl", f'{{"text": "a", "n": {HUGE}}}', lambda p: next(iter(read_rows(p))).error),
        (
            "examples.jsonl",
            f'{{"text": "a", "label": "x", "n": {HUGE}}}',
            lambda p: _fault(lambda q: read_examples(q, ["x", "y"]), p),
        ),
        ("labels.jsonl", f'{{"label": "x", "n": {HUGE}}}', lambda p: _fault(read_label_descriptions, p)),
        ("questions.jsonl", f'{{"name": "q", "n": {HUGE}}}', lambda p: _fault(read_questions, p)),
        ("questions.json", f'[{{"name": "q", "n": {HUGE}}}]', lambda p: _fault(read_questions, p)),
        ("task.json", f'{{"model": "m", "n": {HUGE}}}', lambda p: _fault(Task.load, p)),
    ],
)
def test_every_json_reader_says_a_number_is_too_long(tmp_path, name, line, read):
    p = tmp_path / name
    p.write_text(line + "\n")
    said = read(p)
    assert "number too long" in said and "set_int_max_str_digits" not in said, said
