"""`mlx-slm decide` (`cli/decide.py`) through the CLI, on a tiny random model: the help teaches, bad
input is exit 2 naming the fix, error rows exit 1. (`eval --decisions` is tested in
tests/jobs/test_evaluate_decisions.py, `train --decisions` in tests/jobs/test_train_decisions.py.)"""

from __future__ import annotations

import json

import pytest

from tests.decision_cli import QUESTIONS, run
from tests.decision_cli import gold as _gold
from tests.hostile import invoke, refused_cleanly


def test_help_teaches_with_an_example():
    r = run(["decide", "--help"])
    assert r.exit_code == 0
    for part in ("mlx-slm decide tickets.jsonl --questions Q.json", '"type": "noul"', "--shape", "--resume", "--task"):
        assert part in r.output


def test_stdin_to_stdout_error_rows_exit_1(tiny, q):
    deep: object = "x"
    for _ in range(40):
        deep = [deep]
    lines = [json.dumps({"id": 1, "state": "My card was charged twice"}), json.dumps({"id": 2, "state": 5}),
             json.dumps({"id": 3, "state": {"deep": deep}})]  # fmt: skip
    r = run(["decide", "--questions", str(q), "--model", tiny, "-q"], input="\n".join(lines) + "\n")
    assert r.exit_code == 1
    recs = [json.loads(x) for x in r.stdout.splitlines()]
    assert set(recs[0]["answers"]) == set(QUESTIONS)
    assert recs[1]["id"] == 2 and "line 2" in recs[1]["error"] and "the state" in recs[1]["error"]
    assert recs[2]["id"] == 3 and "nested" in recs[2]["error"]
    r2 = run(["decide", "--questions", str(q), "--model", tiny, "-q", "--on-error", "skip"], input=lines[0] + "\n")
    assert r2.exit_code == 0 and r2.stdout.splitlines()[0] == r.stdout.splitlines()[0]


@pytest.mark.parametrize(
    "body, words",
    [
        ({}, "questions"),
        ({"a": {"type": "boolean"}}, "type"),
        ({"a": {"type": "choice", "criteria": {"x": None}}}, "option"),
        ({"a": {"type": "score", "criteria": ["one"]}}, "level"),
        ("not json", "not valid JSON"),
    ],
)
def test_bad_questions_file_exit_2(tiny, tmp_path, body, words):
    p = tmp_path / "bad.json"
    p.write_text(body if isinstance(body, str) else json.dumps(body))
    r = run(["decide", "--questions", str(p), "--model", tiny], input='{"state": "x"}\n')
    assert r.exit_code == 2, r.output
    assert "error:" in r.output and words in r.output and "Traceback" not in r.output


def test_no_questions_exit_2(tiny):
    r = run(["decide", "--model", tiny], input='{"state": "x"}\n')
    assert r.exit_code == 2 and "--questions" in r.output


def test_export_refuses_a_decisions_task_saying_what_to_do(tiny, q, tmp_path):
    gold = _gold(tmp_path, 12)
    task = tmp_path / "prior.json"
    assert (
        run(
            ["eval", str(gold), "--decisions", str(q), "--model", tiny, "--fit-prior", "--save-task", str(task)]
        ).exit_code
        == 0
    )
    r = run(["export", str(task), "-o", str(tmp_path / "out")])
    assert r.exit_code == 2 and "typed decision questions" in r.output and "serve --task" in r.output


# ----------------------------------------------------------------------------- the option a reader names


def test_decide_names_its_own_option_for_a_csv_without_a_state_column(tmp_path, tiny_qwen_mlx):
    inp, q = tmp_path / "s.csv", tmp_path / "q.json"
    inp.write_text("id,body\n1,hello\n")
    q.write_text('{"spam": {"type": "noul", "instructions": "Spam?"}}')
    r = invoke(["decide", inp, "--questions", q, "--model", tiny_qwen_mlx, "-q"])
    refused_cleanly(r, "--state-column")
    assert "--text-column" not in r.output
