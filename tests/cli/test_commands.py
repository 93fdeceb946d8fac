import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from mlx_slm.cli import main
from mlx_slm.text.workload import tickets

TEXTS = [t for t, _ in tickets(12)]


def run(args, input=None):
    r = CliRunner().invoke(main, args, input=input, catch_exceptions=False)
    return r


def write_jsonl(path, texts, bad_line_at=None):
    lines = [json.dumps({"id": f"t{i}", "text": t}) for i, t in enumerate(texts)]
    if bad_line_at is not None:
        lines.insert(bad_line_at, "{broken")
    path.write_text("\n".join(lines) + "\n")


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


@pytest.mark.parametrize(
    "extra, msg",
    [
        (["--template", "no placeholder"], "{text}"),
        (["--labels", "a,a"], "twice"),
        (["--labels", "a,"], "empty"),
        (["--model", "no-such-model"], "not a built-in name"),
        (["--resume"], "--resume needs -o"),
    ],
)
def test_user_errors_are_one_line_no_traceback(tiny_qwen_mlx, extra, msg):
    args = ["classify", "--model", str(tiny_qwen_mlx), "-q", *extra]
    r = CliRunner().invoke(main, args, input="hello\n")
    assert r.exit_code == 2
    assert msg in r.output and "Traceback" not in r.output


@pytest.fixture(scope="session")
def doctor_run():
    """`mlx-slm doctor`, run once: what it prints does not depend on the tiny model the test is
    parametrized by (session-scoped: pytest runs the two parameters apart, in different module
    passes). Its matmul rate is timed on one 256 x 256 product instead of 1024 and 2048 ones
    four times (~1.8 s of CPU): the test reads the line's shape, not the rate."""
    from mlx_slm.ground import blas as _blas

    peak = _blas.matmul_peak
    mp = pytest.MonkeyPatch()
    mp.setattr(_blas, "matmul_peak", lambda: peak(sizes=(256,), reps=1))
    try:
        return run(["doctor"])
    finally:
        mp.undo()


def test_convert_command_and_doctor(tiny_hf, tmp_path, doctor_run):
    r = run(["convert", str(tiny_hf), "--out", str(tmp_path / "c"), "--dtype", "bfloat16"])
    assert r.exit_code == 0 and (tmp_path / "c" / "conversion.json").exists()
    rec = json.loads((tmp_path / "c" / "conversion.json").read_text())
    assert rec["dtype"] == "bfloat16" and len(rec["source_sha256"]["model.safetensors"]) == 64
    d = doctor_run
    assert d.exit_code == 0 and "GFLOP/s" in d.output and "compute dtype" in d.output


@pytest.mark.slow  # a child process (~4 s of imports); test_integrity's closed-pipe test runs the same entry quick
def test_real_subprocess(tiny_qwen_mlx):
    env = dict(os.environ)
    p = subprocess.run(
        [sys.executable, "-m", "mlx_slm.cli", "classify", "--model", str(tiny_qwen_mlx), "--labels", "a,b,c", "-q"],
        input="My card was charged twice\n",
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr
    rec = json.loads(p.stdout)
    assert rec["id"] == 1 and rec["label"] in ("a", "b", "c")


# --------------------------------------------------------------------------- issue 22: the smaller mends


def test_parity_without_torch_exits_2_with_the_hint(tiny_qwen_mlx, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a))
    r = CliRunner().invoke(main, ["parity", "--model", str(tiny_qwen_mlx), "--reference", str(tiny_qwen_mlx)])
    assert r.exit_code == 2, r.output
    assert "pip install 'mlx-slm[reference]'" in r.output and "bug" not in r.output


def test_transformers_no_torch_notice_is_silenced_and_other_warnings_pass():
    code = "import sys; sys.modules['torch'] = None; {}import transformers"
    # mlx_lm's import sets TRANSFORMERS_NO_ADVISORY_WARNINGS in os.environ (an earlier test imports it), which
    # silences the notice in the child by itself: the children start without it, as a user's shell does.
    env = {k: v for k, v in os.environ.items() if k != "TRANSFORMERS_NO_ADVISORY_WARNINGS"}
    env["MLX_SLM_BLAS"] = "none"
    plain = subprocess.run([sys.executable, "-c", code.format("")], capture_output=True, text=True, env=env)
    assert "PyTorch was not found" in plain.stderr  # what a user without PyTorch saw
    ours = subprocess.run(
        [sys.executable, "-c", code.format("import mlx_slm; ")], capture_output=True, text=True, env=env
    )
    assert ours.returncode == 0 and "PyTorch was not found" not in ours.stderr, ours.stderr
    other = "import mlx_slm, transformers; transformers.logging.get_logger('transformers').warning('a real warning')"
    got = subprocess.run([sys.executable, "-c", other], capture_output=True, text=True, env=env)
    assert "a real warning" in got.stderr


def test_template_and_system_escapes_on_the_command_line(tiny_qwen_mlx, tmp_path):
    inp = tmp_path / "in.jsonl"
    write_jsonl(inp, TEXTS[:3])
    task = tmp_path / "task.json"
    args = ["classify", str(inp), "--model", str(tiny_qwen_mlx), "--labels", "a,b,c", "-q", "-o", str(tmp_path / "o")]
    r = run([*args[:-1], str(tmp_path / "o.jsonl"), "--template", r"Email: {text}\nRoute:", "--system",
             r"Route it.\tBe brief. C:\\new", "--save-task", str(task)])  # fmt: skip
    assert r.exit_code == 0, r.output
    t = json.loads(task.read_text())
    assert t["template"] == "Email: {text}\nRoute:" and t["system"] == "Route it.\tBe brief. C:\\new"
    r = run(["classify", "--help"])
    assert r"\n is a newline" in " ".join(r.output.split())


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


def test_help_groups_options_into_sections_and_serve_shows_only_its_own():
    out = run(["classify", "--help"]).output
    for title in ("Input", "Output", "Task and model", "Labels and prompt", "Calibration", "Batching", "Scale-out"):
        assert f"\n{title} options:\n" in out
    assert "\nOptions:\n" not in out
    serve = run(["serve", "--help"]).output
    assert "\nServer options:\n" in serve and "\nLimits options:\n" in serve
    for flag in ("--window", "--save-task", "--format", "--id-field", "--id-column", "--shard", "--resume"):
        assert flag not in serve
    # In serve the text and gold fields name --calibration-data's, and say so by their section.
    assert serve.index("Calibration data options:") < serve.index("--text-field")


def test_parity_input_says_which_rows_it_skipped(tmp_path, capsys):
    """Issue 26: `parity --input` skipped rows it could not read without a word."""
    from mlx_slm.cli.parity import _input_texts

    inp = tmp_path / "in.jsonl"
    inp.write_text('{"text": "one"}\n{broken\n{"text": ""}\n{"text": "two"}\n{"text": "three"}\n')
    assert _input_texts(str(inp), 2) == ["one", "two"]
    err = capsys.readouterr().err
    assert "2 row(s) that cannot be read were skipped (line 2, 3)" in err and "on 2 text(s)" in err
    inp.write_text('{"text": "one"}\n')
    assert _input_texts(str(inp), 5) == ["one"] and capsys.readouterr().err == ""
