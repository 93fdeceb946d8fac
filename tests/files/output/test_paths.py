"""Output formats and paths (`files/output/paths.py`): an output is never an input (the same file,
redirected stdin), its format comes from its extension or `--output-format`, and every output is
checked before any work. From output integrity (issue 10)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from mlx_slm.cli import main
from mlx_slm.files.output import MANIFEST_SUFFIX
from tests.classify_run import TEXTS, cli, jsonl_input, run

# ----------------------------------------------------------------- 1. never destroy input


@pytest.mark.parametrize("how", ["same", "symlink", "hardlink", "relative"])
def test_output_that_is_the_input_is_refused_before_opening(tiny_qwen_mlx, tmp_path, how, monkeypatch):
    inp = jsonl_input(tmp_path / "t.jsonl")
    before = inp.read_bytes()
    out = {"same": inp, "relative": Path("t.jsonl")}.get(how, tmp_path / "link.jsonl")
    if how == "symlink":
        out.symlink_to(inp)
    elif how == "hardlink":
        os.link(inp, out)
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(main, ["classify", str(inp), "-o", str(out), *cli(tiny_qwen_mlx)])
    assert r.exit_code == 2
    assert "would destroy the input" in r.output
    assert inp.read_bytes() == before
    assert not Path(str(out) + MANIFEST_SUFFIX).exists()


def test_output_that_is_redirected_stdin_is_refused(tiny_qwen_mlx, tmp_path):
    inp = jsonl_input(tmp_path / "t.jsonl")
    before = inp.read_bytes()
    with open(inp, "rb") as f:
        p = subprocess.run(
            [sys.executable, "-m", "mlx_slm.cli", "classify", "-o", str(inp), *cli(tiny_qwen_mlx)],
            stdin=f,
            capture_output=True,
            text=True,
            timeout=300,
        )
    assert p.returncode == 2, p.stderr
    assert "standard input" in p.stderr and "Traceback" not in p.stderr
    assert inp.read_bytes() == before


def test_unknown_output_extension_is_an_error_unless_a_format_is_given(tiny_qwen_mlx, tmp_path):
    r = CliRunner().invoke(main, ["classify", "-o", str(tmp_path / "o.out"), *cli(tiny_qwen_mlx)], input="hi\n")
    assert r.exit_code == 2 and "--output-format" in r.output and not (tmp_path / "o.out").exists()
    r = run(["classify", "-o", str(tmp_path / "o.out"), "--output-format", "csv", *cli(tiny_qwen_mlx)], input="hi\n")
    assert r.exit_code == 0 and (tmp_path / "o.out").read_text().startswith("id,label,")


def test_every_output_is_checked_before_any_work(tiny_qwen_mlx, tmp_path):
    inp = jsonl_input(tmp_path / "in.jsonl", TEXTS[:3])
    before = inp.read_bytes()
    r = CliRunner().invoke(main, ["classify", str(inp), "--save-task", str(inp), *cli(tiny_qwen_mlx)])
    assert r.exit_code == 2 and "--save-task" in r.output and inp.read_bytes() == before
    r = CliRunner().invoke(
        main,
        [
            "classify",
            str(inp),
            "-o",
            str(tmp_path / "o.jsonl"),
            "--save-task",
            str(tmp_path / "o.jsonl"),
            *cli(tiny_qwen_mlx),
        ],
    )
    assert r.exit_code == 2 and "its own file" in r.output
    r = CliRunner().invoke(main, ["classify", str(inp), "-o", str(tmp_path / "nope" / "o.jsonl"), *cli(tiny_qwen_mlx)])
    assert r.exit_code == 2 and "does not exist" in r.output and "Traceback" not in r.output
    r = CliRunner().invoke(main, ["eval", str(inp), "--json", str(inp), *cli(tiny_qwen_mlx)])
    assert r.exit_code == 2 and inp.read_bytes() == before
    r = CliRunner().invoke(main, ["classify", str(inp), "-o", "-", "--resume", *cli(tiny_qwen_mlx)])
    assert r.exit_code == 2 and "--resume needs -o FILE" in r.output
