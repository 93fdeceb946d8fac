"""The writers (`files/output/writers.py`): JSONL, CSV and TSV row by row, Parquet whole when the run
finishes. CSV cells that a spreadsheet would read as a formula are written as they are (as pandas'
to_csv writes them) and read back exactly; a Parquet output appears only when the run is complete;
a full disk is one line and exit 2, never a second traceback.

Partly from hostile round five (issue 33; was tests/test_outputs_round5.py), output integrity (issue
10) and the full disk of issue 33, item 3."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mlx_slm.files.output import Writer, csv_columns, manifest_path, read_records, scan_output
from mlx_slm.text.workload import tickets
from tests.hostile import invoke, model_cli, refused_cleanly, write, write_input

FORMULAS = ["=1+1", "+33 1 23", "-2", "@SUM(A1)", '=HYPERLINK("http://x","y")', "\t=1", " =2"]


def test_csv_cells_that_look_like_formulas_are_written_as_they_are_and_read_back_exactly(tiny_qwen_mlx, tmp_path):
    """The decision: CSV and TSV are data for programs, written as pandas' to_csv and Python's csv
    module write them; no quote or apostrophe is added in front of `=`, `+`, `-` or `@` (it would
    change the ids that pandas, --resume, merge and eval read back). Open such a file in a
    spreadsheet through its import dialog, the id column as text (README, Outputs)."""
    pd = pytest.importorskip("pandas")
    data = write(
        tmp_path / "in.jsonl",
        "".join(json.dumps({"id": x, "text": f"text {i}"}) + "\n" for i, x in enumerate(FORMULAS)),
    )
    for fmt in ("csv", "tsv"):
        out = tmp_path / f"o.{fmt}"
        r = invoke(["classify", data, "--model", tiny_qwen_mlx, "--labels", "=a,+b,-c,@d", "-q", "-o", out])
        assert r.exit_code == 0, r.output
        frame = pd.read_csv(out, sep="," if fmt == "csv" else "\t", dtype=str, keep_default_na=False)
        assert list(frame["id"]) == FORMULAS
        assert set(frame["label"]) <= {"=a", "+b", "-c", "@d"} and "p_=a" in frame.columns
        assert [r.fields["id"] for r in read_records(str(out), fmt) if r.row] == FORMULAS  # as resume, merge read
        before = out.read_bytes()  # --resume reads the ids back and checks them against the input's
        r = invoke(["classify", data, "--model", tiny_qwen_mlx, "--labels", "=a,+b,-c,@d", "-o", out, "--resume"])
        assert r.exit_code == 0 and "was complete already" in r.output and out.read_bytes() == before


# Output integrity (issue 10): a Parquet output appears only when the run is complete.


TEXTS = [t for t, _ in tickets(40)]


def cli(model, *extra):
    return ["--model", str(model), "--labels", "a,b,c", "-q", *extra]


@pytest.mark.slow  # a CLI subprocess signalled mid-run, as the other kill tests
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL])
def test_an_interrupted_parquet_run_leaves_no_parquet_file(tiny_qwen_mlx, tmp_path, sig):
    """Issue 26: Ctrl-C on a Parquet run wrote a valid file with the rows done so far. The
    input comes through a pipe left open, so the run is stopped mid-way for certain: its
    batch calibration is fitted (rows classified) and the input is not finished."""
    pytest.importorskip("pyarrow")
    out = tmp_path / "o.parquet"
    out.write_bytes(b"an older output")  # would outlive the run and pass for its output
    args = ["classify", "-", "-o", str(out), "--format", "jsonl", "--calibrate", "batch", "--warmup", "6"]
    p = subprocess.Popen(
        [sys.executable, "-m", "mlx_slm.cli", *args, *cli(tiny_qwen_mlx, "--window", "2")],
        stdin=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # as a terminal gives it, in any job
    )
    p.stdin.write("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in enumerate(TEXTS[:20])))
    p.stdin.flush()
    manifest = manifest_path(str(out))
    deadline = time.time() + 300
    while time.time() < deadline and p.poll() is None:
        if manifest.exists() and json.loads(manifest.read_text()).get("fitted_calibrator"):
            break
        time.sleep(0.02)
    assert p.poll() is None, p.stderr.read()
    p.send_signal(sig)
    err = p.communicate(timeout=120)[1]
    assert p.returncode == (130 if sig == signal.SIGINT else -signal.SIGKILL), err
    assert not out.exists() and not list(tmp_path.glob("*.partial"))
    assert json.loads(manifest.read_text())["complete"] is False
    if sig == signal.SIGINT:
        assert "Traceback" not in err and not Path(str(out) + ".lock").exists()


def test_writer_and_scan_output_jsonl(tmp_path):
    out = tmp_path / "o.jsonl"
    w = Writer(str(out), csv_columns(["x", "y"]))
    w.write({"id": 1, "label": "x", "probs": {"x": 0.9, "y": 0.1}})
    w.write({"id": None, "line": 2, "error": "line 2: boom"})
    w.write({"id": "a\u2028b\u0085c", "label": "y", "probs": {"x": 0.1, "y": 0.9}})
    w.close()
    with open(out, "a") as f:
        f.write('{"id": 3, "lab')  # torn last record
    rows, header_end = scan_output(str(out), "jsonl", csv_columns(["x", "y"]))
    assert [(r.id, r.error) for r in rows] == [(1, False), (None, True), ("a\u2028b\u0085c", False)]
    assert header_end == 0 and rows[-1].end == out.read_bytes().rfind(b"\n") + 1


def test_writer_csv(tmp_path):
    out = tmp_path / "o.csv"
    w = Writer(str(out), csv_columns(["x", "y"]), fmt="csv")
    w.write({"id": 1, "label": "x", "probs": {"x": 0.9, "y": 0.1}})
    w.write({"id": "multi\nline\rid", "line": 3, "error": 'line 3: a "quoted" error'})
    w.close()
    lines = out.read_text().splitlines()
    assert lines[0] == "id,label,p_x,p_y,truncated,line,error"
    assert lines[1].startswith("1,x,0.9,0.1")
    rows, header_end = scan_output(str(out), "csv", csv_columns(["x", "y"]))
    assert [(r.id, r.error) for r in rows] == [("1", False), ("multi\nline\rid", True)]
    with open(out, "ab") as f:
        f.write(b'2,"torn\n')  # an open quote at the end: not a complete row
    assert len(scan_output(str(out), "csv", csv_columns(["x", "y"]))[0]) == 2


# A full disk (issue 33, item 3): the writer's error is one line and exit 2 for every output format,
# and closing the file, or Python flushing stdout at exit, never raises a second time. `-o /dev/full` and
# `> /dev/full` fail every write; a regular file stops growing under RLIMIT_FSIZE (EFBIG), and what was
# written before is complete row by row: `--resume` finishes it into the uninterrupted run's bytes.


ROOT = Path(__file__).resolve().parents[3]


FULL = "/dev/full"


full_device = pytest.mark.skipif(not os.path.exists(FULL), reason="no /dev/full here")


@full_device
@pytest.mark.parametrize("fmt", ["jsonl", "csv", "tsv"])
def test_every_streamed_format_to_a_full_device_is_one_line(fmt, tiny_qwen_mlx, tmp_path):
    r = invoke(["classify", write_input(tmp_path / "in.jsonl"), *model_cli(tiny_qwen_mlx), "-o", FULL,
                "--output-format", fmt])  # fmt: skip
    refused_cleanly(r, f"cannot write to {FULL}", "No space left on device")


@full_device
def test_parquet_to_a_full_device_is_refused_before_the_run(tiny_qwen_mlx, tmp_path):
    r = invoke(["classify", write_input(tmp_path / "in.jsonl"), *model_cli(tiny_qwen_mlx), "-o", FULL,
                "--output-format", "parquet"])  # fmt: skip
    refused_cleanly(r, "Parquet output needs -o FILE.parquet")


@full_device
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


@full_device
def test_a_file_system_that_fills_mid_run_is_one_line(tiny_qwen_mlx, tmp_path):
    out = tmp_path / "out.csv"
    r = _run(["classify", write_input(tmp_path / "in.jsonl", 120), *model_cli(tiny_qwen_mlx), "-o", out], limit=3000)
    _clean(r, str(out), "File too large", "--resume")
    assert 0 < out.stat().st_size <= 3000


@full_device
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


@full_device
def test_standard_output_on_a_full_device_is_one_line(tiny_qwen_mlx, tmp_path):
    data = write_input(tmp_path / "in.jsonl")
    with open(FULL, "w") as full:
        _clean(_run(["classify", data, *model_cli(tiny_qwen_mlx)], stdout=full), "standard output", "No space left")
        _clean(_run(["models"], stdout=full), "cannot write", "No space left")
