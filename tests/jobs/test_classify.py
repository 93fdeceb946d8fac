"""A classify job (`jobs/classify.py`): one input file to one output, as `mlx-slm classify` runs it."""

import json

from click.testing import CliRunner

from mlx_slm.cli import main
from mlx_slm.files.output import csv_columns, scan_output
from tests.classify_run import TEXTS, cli, interrupted_copy, jsonl_input, run

# ----------------------------------------------------------------- 3. resume: ours, exactly


def test_a_system_prompt_over_the_context_fails_at_once_or_gives_error_rows(tiny_qwen_mlx, tmp_path):
    long_system = "Please read carefully. " * 600  # far over the tiny model's 1,024 positions
    r = CliRunner().invoke(main, ["classify", *cli(tiny_qwen_mlx), "--system", long_system], input="a\nb\n")
    assert r.exit_code == 2 and "shorten --system" in r.output and r.stdout.strip() == ""
    r = run(["classify", *cli(tiny_qwen_mlx), "--system", long_system, "--truncate", "tail"], input="a\nb\n")
    out = [json.loads(x) for x in r.stdout.splitlines()]
    assert r.exit_code == 1 and len(out) == 2 and all("shorten --system" in o["error"] for o in out)


def test_a_bad_input_header_leaves_the_old_output_alone(tiny_qwen_mlx, tmp_path):
    good = tmp_path / "in.csv"
    good.write_text("id,text\n1,hello\n")
    out = tmp_path / "o.csv"
    assert run(["classify", str(good), "-o", str(out), *cli(tiny_qwen_mlx)]).exit_code == 0
    before = out.read_bytes()
    r = CliRunner().invoke(main, ["classify", str(good), "--text-column", "body", "-o", str(out), *cli(tiny_qwen_mlx)])
    assert r.exit_code == 2 and "--text-column" in r.output
    assert out.read_bytes() == before
    r = CliRunner().invoke(main, ["classify", str(good), "--id-column", "msg_id", "-o", str(out), *cli(tiny_qwen_mlx)])
    assert r.exit_code == 2 and "'msg_id'" in r.output and out.read_bytes() == before


def test_a_resumed_batch_calibrated_run_does_not_call_its_items_labelled(tiny_qwen_mlx, tmp_path):
    """Issue 26: the summary of a resumed batch run said "6 labelled items" (batch uses no labels)."""
    inp = jsonl_input(tmp_path / "in.jsonl", TEXTS[:12])
    args = ["--model", str(tiny_qwen_mlx), "--labels", "a,b,c", "--window", "4", "--calibrate", "batch"]
    full = tmp_path / "full.jsonl"
    assert run(["classify", str(inp), "-o", str(full), *args, "--warmup", "6", "-q"]).exit_code == 0
    written, _ = scan_output(str(full), "jsonl", csv_columns(["a", "b", "c"], raw=True))
    part = tmp_path / "part.jsonl"
    interrupted_copy(full, part, written[7].end)
    r = CliRunner().invoke(main, ["classify", str(inp), "-o", str(part), "--resume", *args, "--warmup", "6"])
    assert r.exit_code == 0, r.output
    assert "the prior the interrupted run fitted, from the first 6 items of this input" in r.output
    assert "labelled" not in r.output and part.read_bytes() == full.read_bytes()
