"""A full disk (issue 33, item 3): the writer's error is one line and exit 2 for every output format,
and closing the file, or Python flushing stdout at exit, never raises a second time (that traceback
replaced the message). `-o /dev/full` and `> /dev/full` fail every write; a regular file stops
growing under RLIMIT_FSIZE (EFBIG, as a full file system stops it), and what was written before is
complete row by row: `--resume` finishes it into the uninterrupted run's bytes."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.hostile import invoke, model_cli, refused_cleanly, write_input

ROOT = Path(__file__).resolve().parents[2]
FULL = "/dev/full"
pytestmark = pytest.mark.skipif(not os.path.exists(FULL), reason="no /dev/full here")


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "tsv"])
def test_every_streamed_format_to_a_full_device_is_one_line(fmt, tiny_qwen_mlx, tmp_path):
    r = invoke(["classify", write_input(tmp_path / "in.jsonl"), *model_cli(tiny_qwen_mlx), "-o", FULL,
                "--output-format", fmt])  # fmt: skip
    refused_cleanly(r, f"cannot write to {FULL}", "No space left on device")


def test_parquet_to_a_full_device_is_refused_before_the_run(tiny_qwen_mlx, tmp_path):
    r = invoke(["classify", write_input(tmp_path / "in.jsonl"), *model_cli(tiny_qwen_mlx), "-o", FULL,
                "--output-format", "parquet"])  # fmt: skip
    refused_cleanly(r, "Parquet output needs -o FILE.parquet")


def test_the_writer_closes_after_a_failed_write_without_a_second_error(tmp_path):
    from mlx_slm.files.output import Writer
    from mlx_slm.ground.errors import OutputError

    for fmt in ("jsonl", "csv"):
        w = None
        with pytest.raises(OutputError, match="No space left"):
            w = Writer(FULL, ["id", "label", "p_a", "truncated", "line", "error"], fmt)  # a CSV header fails here
            for i in range(10_000):  # ... a JSONL row when it is flushed
                w.write({"id": i, "label": "a", "probs": {"a": 1.0}})
        if w is not None:
            w.close()  # nothing buffered is left to fail again


def _run(args, limit: int | None = None, stdout=None):
    def cap():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG, not a kill, past the limit
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return subprocess.run(
        [sys.executable, "-m", "mlx_slm.cli", *map(str, args)], cwd=ROOT, text=True,
        stdout=stdout if stdout is not None else subprocess.PIPE, stderr=subprocess.PIPE,
        preexec_fn=cap if limit else None,
    )  # fmt: skip


def _clean(r, *words):
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr and "Exception ignored" not in r.stderr, r.stderr
    for w in words:
        assert w in r.stderr, (w, r.stderr)


def test_a_file_system_that_fills_mid_run_is_one_line(tiny_qwen_mlx, tmp_path):
    out = tmp_path / "out.csv"
    r = _run(["classify", write_input(tmp_path / "in.jsonl", 120), *model_cli(tiny_qwen_mlx), "-o", out], limit=3000)
    _clean(r, str(out), "File too large", "--resume")
    assert 0 < out.stat().st_size <= 3000


@pytest.mark.slow  # a dozen processes: the quick loop runs the case above
def test_a_file_system_that_fills_mid_run_then_resume_gives_the_uninterrupted_bytes(tiny_qwen_mlx, tmp_path):
    data = write_input(tmp_path / "in.jsonl", 120)
    base = ["classify", data, *model_cli(tiny_qwen_mlx)]
    for fmt in ("jsonl", "csv", "tsv", "parquet"):
        out = tmp_path / f"out.{fmt}"
        r = _run([*base, "-o", out], limit=3000)
        _clean(r, str(out), "File too large")
        if fmt == "parquet":  # written whole at the end, into a temporary file: none is left
            assert not out.exists() and not list(tmp_path.glob(".out.parquet.*"))
            continue
        assert 0 < out.stat().st_size <= 3000
        assert _run([*base, "-o", out, "--resume"]).returncode == 0
        assert _run([*base, "-o", tmp_path / f"ref.{fmt}"]).returncode == 0
        assert out.read_bytes() == (tmp_path / f"ref.{fmt}").read_bytes()
        assert json.loads((tmp_path / f"out.{fmt}.mlx-slm.json").read_text())["complete"]


def test_standard_output_on_a_full_device_is_one_line(tiny_qwen_mlx, tmp_path):
    data = write_input(tmp_path / "in.jsonl")
    with open(FULL, "w") as full:
        _clean(_run(["classify", data, *model_cli(tiny_qwen_mlx)], stdout=full), "standard output", "No space left")
        _clean(_run(["models"], stdout=full), "cannot write", "No space left")
