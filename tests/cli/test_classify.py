"""`mlx-slm classify` and `merge` (`cli/classify.py`): a file or stdin in, JSONL or CSV out, error rows in place."""

import json

from mlx_slm.text.workload import tickets
from tests.classify_run import run, write_jsonl

TEXTS = [t for t, _ in tickets(12)]


def test_classify_file_jsonl_with_error_row(tiny_qwen_mlx, tmp_path):
    inp = tmp_path / "in.jsonl"
    write_jsonl(inp, TEXTS, bad_line_at=3)
    r = run(["classify", str(inp), "--model", str(tiny_qwen_mlx), "--labels", "a,b,c", "-q"])
    assert r.exit_code == 1  # --on-error fail, after writing everything
    out = [json.loads(x) for x in r.stdout.splitlines()]
    assert len(out) == len(TEXTS) + 1
    assert out[3] == {"id": None, "line": 4, "error": out[3]["error"]} and "malformed JSON" in out[3]["error"]
    ids = [o["id"] for o in out if "label" in o]
    assert ids == [f"t{i}" for i in range(len(TEXTS))]
    assert all(abs(sum(o["probs"].values()) - 1) < 1e-5 for o in out if "label" in o)
    r2 = run(["classify", str(inp), "--model", str(tiny_qwen_mlx), "--labels", "a,b,c", "-q", "--on-error", "skip"])
    assert r2.exit_code == 0 and r2.stdout == r.stdout


def test_classify_stdin_text_and_csv_output(tiny_qwen_mlx, tmp_path):
    out = tmp_path / "o.csv"
    r = run(
        ["classify", "--model", str(tiny_qwen_mlx), "--labels", "a,b,c", "-o", str(out)],
        input="\n".join(TEXTS[:3]) + "\n",
    )
    assert r.exit_code == 0, r.output
    lines = out.read_text().splitlines()
    assert lines[0].startswith("id,label,p_a,p_b,p_c") and len(lines) == 4
    assert "items/s" in r.stderr and "padding" in r.stderr and "cache saved" in r.stderr


def test_a_json_array_file_is_refused_saying_how_to_convert_it(tiny_qwen_mlx, tmp_path):
    """`json.dump(rows, f, indent=2)` saved as rows.json: refused with the fix (exit 2), no output."""
    inp, out = tmp_path / "rows.json", tmp_path / "o.jsonl"
    inp.write_text(json.dumps([{"id": i, "text": t} for i, t in enumerate(TEXTS[:3])], indent=2))
    r = run(["classify", str(inp), "--model", str(tiny_qwen_mlx), "--labels", "a,b,c", "-o", str(out)])
    assert r.exit_code == 2 and "one JSON array, not JSON Lines" in r.output and "jq -c" in r.output
    r = run(["classify", "--model", str(tiny_qwen_mlx), "--labels", "a,b,c"], input=inp.read_text())
    assert r.exit_code == 2 and "one JSON array, not JSON Lines" in r.output and r.stdout == ""
