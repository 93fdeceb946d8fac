"""`mlx-slm eval` (`cli/eval.py`): classify a labelled input (or read a classify output back) and report
the figures."""

import json

from click.testing import CliRunner

from mlx_slm.cli import main
from mlx_slm.text.workload import tickets
from tests.classify_run import write_jsonl

TEXTS = [t for t, _ in tickets(12)]


def test_eval_items_per_second_and_resume_messages(tiny_qwen_mlx, tmp_path):
    inp = tmp_path / "in.jsonl"
    inp.write_text(
        "".join(json.dumps({"id": f"t{i}", "text": t, "label": "a"}) + "\n" for i, t in enumerate(TEXTS[:4]))
    )
    base = ["--model", str(tiny_qwen_mlx), "--labels", "a,b,c"]
    r = CliRunner().invoke(main, ["eval", str(inp), *base])
    assert r.exit_code == 0, r.output
    assert "4 items in" in r.output and "0.00 items/s" not in r.output
    out = tmp_path / "o.jsonl"
    write_jsonl(inp, TEXTS[:3], bad_line_at=1)
    assert CliRunner().invoke(main, ["classify", str(inp), "-o", str(out), *base]).exit_code == 1
    r = CliRunner().invoke(main, ["classify", str(inp), "-o", str(out), "--resume", *base])
    assert r.exit_code == 1
    assert "was complete already: 4 rows (1 errors) kept, nothing left to classify" in r.output
    assert "0 rows" not in r.output
    other = tmp_path / "other.jsonl"
    other.write_text('{"id": 1}\n')
    r = CliRunner().invoke(main, ["classify", str(inp), "-o", str(other), "--resume", *base])
    assert r.exit_code == 2 and "left untouched" in r.output and "version before" not in r.output
