"""Exact resume (`files/output/resume.py`): the rows already written checked against the input's ids,
cut back to the last whole window; a resumed file is byte-identical to an uninterrupted run, after any
cut, a kill, batch calibration; after a torn or edited output or manifest, refused with a clear error."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mlx_slm.files.output import csv_columns, manifest_path, plan_resume, scan_output
from mlx_slm.text.workload import tickets
from tests import hostile
from tests.classify_run import TEXTS, cli, interrupted_copy, jsonl_input, run
from tests.hostile import refused, write


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_resume_after_a_torn_or_edited_output_or_manifest(tiny_qwen_mlx, tmp_path, fmt):
    inp = write(
        tmp_path / "in.jsonl", "".join(json.dumps({"id": f"t{i}", "text": f"item {i} x"}) + "\n" for i in range(6))
    )
    out = tmp_path / f"out.{fmt}"
    args = ["classify", str(inp), "-o", str(out), "--model", str(tiny_qwen_mlx), "-q", "--window", "2"]
    r = hostile.cli(*args)
    assert r.exit_code == 0, r.output
    whole = out.read_bytes()
    manifest = Path(str(out) + ".mlx-slm.json")
    man = json.loads(manifest.read_text())
    man["complete"], man["rows"] = False, None  # as an interrupted run leaves it
    lines = whole.split(b"\n")
    edits = {
        "torn 0xff": b"\n".join(lines[:3]) + b"\n\xff\xfe garbage\n",
        "blank line": b"\n".join(lines[:2]) + b"\n\n" + b"\n".join(lines[2:]),
        "one field": b"\n".join(lines[:2]) + b"\nx\n",
        "deep": b"\n".join(lines[:2]) + b"\n" + b"[" * 50_000 + b"\n",
    }
    for what, data in edits.items():
        write(out, data)
        manifest.write_text(json.dumps(man))
        refused(hostile.cli(*args, "--resume"), str(out), "start again without --resume")
        assert out.read_bytes() == data, what  # refused: left untouched
    for bad in ({"manifest_version": "2"}, {"complete": "yes"}, {"rows": -1}, {"fitted_calibrator": [1]}):
        write(out, whole)
        manifest.write_text(json.dumps({**man, **bad}))
        refused(hostile.cli(*args, "--resume"), str(manifest), "not a readable mlx-slm manifest", next(iter(bad)))
    manifest.write_bytes(b"\xff{")
    refused(hostile.cli(*args, "--resume"), "not a readable mlx-slm manifest")
    write(out, whole)
    manifest.write_text(json.dumps(man))
    r = hostile.cli(*args, "--resume")
    assert r.exit_code == 0 and out.read_bytes() == whole, r.output


# ----------------------------------------------------------------- several rows a unit (a rerank query's)


def _grouped(tmp_path, units):
    """A grouped output: each unit (id, rows, alone) gives `rows` rows naming it in `query_id`."""
    out = tmp_path / "g.jsonl"
    lines = []
    for uid, n, alone in units:
        lines += (
            [{"query_id": uid, "line": 1, "error": "bad"}]
            if alone
            else [{"query_id": uid, "rank": k} for k in range(n)]
        )
    out.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return out, out.read_bytes().splitlines(keepends=True)


class _Unit:
    def __init__(self, uid, alone=False):
        self.id, self.error = uid, ("bad" if alone else None)


def _plan(out, units, window, complete=None):
    """`plan_group_resume`, its units to run again followed by those it did not reach."""
    from mlx_slm.files.output import plan_group_resume

    it = iter(units)
    keep, rows, errors, redo = plan_group_resume(str(out), "query_id", it, lambda u: (u.id, u.error is not None), window, complete)  # fmt: skip
    return keep, rows, errors, redo + list(it)


def test_a_grouped_output_keeps_its_finished_windows_of_units(tmp_path):
    """Windows of two units that run (an error rides along); the last unit found may be cut short,
    so its window runs again; a complete run keeps everything."""
    spec = [(1, 2, False), (2, 3, False), (None, 1, True), (3, 2, False), (4, 1, False)]
    units = [_Unit(u, a) for u, _, a in spec]
    out, lines = _grouped(tmp_path, spec)
    keep, rows, errors, redo = _plan(out, units, 2, complete=len(lines))
    assert (keep, rows, errors, redo) == (len(b"".join(lines)), 9, 1, [])
    for cut_rows, kept_units in ((0, 0), (2, 0), (5, 0), (6, 3), (7, 3), (8, 3), (9, 3)):
        out.write_bytes(b"".join(lines[:cut_rows]) + b'{"query_id": ')  # and a torn row
        keep, rows, errors, redo = _plan(out, units, 2)
        kept_rows = sum(n for _, n, _ in spec[:kept_units])
        assert (keep, rows, redo) == (len(b"".join(lines[:kept_rows])), kept_rows, units[kept_units:]), cut_rows
        assert errors == (1 if kept_units >= 3 else 0)
    # the error unit found last is whole in its one row: with its window finished, everything found is kept
    out.write_bytes(b"".join(lines[:6]))
    assert _plan(out, units, 2)[1:3] == (6, 1)


def test_a_grouped_output_of_other_units_is_refused(tmp_path):
    out, lines = _grouped(tmp_path, [(1, 2, False), (7, 1, False)])
    with pytest.raises(Exception, match="row 3 has query_id 7 where the input has 2: it is not the output"):
        _plan(out, [_Unit(1), _Unit(2)], 2)
    with pytest.raises(Exception, match="rows past the input's last unit"):
        _plan(out, [_Unit(1)], 2)
    out.write_bytes(b'{"query_id": 1}\n[1]\n')
    with pytest.raises(Exception, match="row 2 is not an mlx-slm output record"):
        _plan(out, [_Unit(1), _Unit(2)], 2)


# Output integrity (issue 10): exact resume from any cut, killed or interrupted.


# ----------------------------------------------------------------- 3. resume: ours, exactly


@pytest.mark.parametrize("ext", ["jsonl", "csv"])
def test_resume_from_any_cut_is_byte_identical_with_the_same_exit_status(tiny_qwen_mlx, tmp_path, ext):
    # Error rows in the middle, an explicit id equal to an error row's line, a duplicate id,
    # and ids with U+2028 / U+0085 (which str.splitlines would split).
    bad = [
        (3, "{broken"),
        (7, json.dumps({"id": "t1", "text": "duplicate id"})),
        (9, json.dumps({"id": 4, "text": "int id"})),
        (12, json.dumps({"id": "x\u2028y\u0085z", "text": "odd id"})),
        (13, ""),
    ]
    inp = jsonl_input(tmp_path / "in.jsonl", TEXTS[:20], bad)
    full = tmp_path / f"full.{ext}"
    args = cli(tiny_qwen_mlx, "--window", "4", "--batch-size", "3")
    r_full = run(["classify", str(inp), "-o", str(full), *args])
    assert r_full.exit_code == 1  # error rows
    data = full.read_bytes()
    written, _ = scan_output(str(full), ext, csv_columns(["a", "b", "c"]))
    assert len(written) == 25
    ends = [w.end for w in written]
    cuts = sorted({0, 5, ends[0], ends[0] + 7, ends[3], ends[6] - 1, ends[10], ends[15] + 2, ends[-2], len(data) - 1})
    for cut in cuts:
        part = tmp_path / f"part-{cut}.{ext}"
        interrupted_copy(full, part, cut)
        r = run(["classify", str(inp), "-o", str(part), "--resume", *args])
        assert r.exit_code == r_full.exit_code, (cut, r.output)
        assert part.read_bytes() == data, f"cut at byte {cut}"
    # A complete output resumes to itself, with the same status, computing nothing.
    r = run(["classify", str(inp), "-o", str(full), "--resume", *args])
    assert r.exit_code == 1 and full.read_bytes() == data


def test_plan_resume_keeps_whole_windows_only(tmp_path):
    from mlx_slm.files.readers import Row

    out = tmp_path / "o.jsonl"
    recs = [{"id": i, "label": "a", "probs": {}} for i in range(1, 8)]
    out.write_text("".join(json.dumps(r) + "\n" for r in recs))
    rows = [Row(i, i, f"text {i}") for i in range(1, 11)]
    keep_bytes, kept, errors, redo = plan_resume(str(out), "jsonl", csv_columns(["a"]), iter(rows), 3, None)
    # Windows of 3 valid items: rows 1-3, 4-6 complete; row 7 opens the third window.
    assert keep_bytes == sum(len(json.dumps(r)) + 1 for r in recs[:6]) and kept == 6 and errors == 0
    assert [r.id for r in redo] == [7]
    # A completed run keeps everything, but only if its row count still holds.
    assert plan_resume(str(out), "jsonl", csv_columns(["a"]), iter(rows), 3, 7)[1] == 7
    with pytest.raises(Exception, match="changed since"):
        plan_resume(str(out), "jsonl", csv_columns(["a"]), iter(rows), 3, 9)


# ----------------------------------------------------------------- interruption for real


def _sigint_default() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.slow
@pytest.mark.parametrize("sig, seed", [(signal.SIGINT, 1), (signal.SIGKILL, 2), (signal.SIGKILL, 3)])
def test_kill_then_resume_equals_an_uninterrupted_run(tiny_qwen_mlx, tmp_path, sig, seed):
    texts = [t for t, _ in tickets(300)]
    inp = jsonl_input(tmp_path / "in.jsonl", texts, [(50, "{bad")])
    args = [
        sys.executable,
        "-m",
        "mlx_slm.cli",
        "classify",
        str(inp),
        *cli(tiny_qwen_mlx, "--window", "8", "--batch-size", "4"),
    ]
    full = tmp_path / "full.jsonl"
    ref = subprocess.run([*args, "-o", str(full)], capture_output=True, text=True, timeout=600)
    assert ref.returncode == 1, ref.stderr
    part = tmp_path / "part.jsonl"
    # SIGINT as a terminal gives it, even where the suite runs in a background job (which ignores it)
    p = subprocess.Popen([*args, "-o", str(part)], stderr=subprocess.PIPE, text=True, preexec_fn=_sigint_default)
    deadline = time.time() + 300
    at = random.Random(seed).randint(500, 12000)  # bytes written when the signal comes: a random point
    while time.time() < deadline and (not part.exists() or part.stat().st_size < at):
        time.sleep(0.005)
    p.send_signal(sig)
    err = p.communicate(timeout=120)[1]
    assert p.returncode == (130 if sig == signal.SIGINT else -signal.SIGKILL), err
    if sig == signal.SIGINT:
        assert "Traceback" not in err and "interrupted" in err
    assert 0 < part.stat().st_size < full.stat().st_size
    resumed = subprocess.run([*args, "-o", str(part), "--resume"], capture_output=True, text=True, timeout=600)
    assert resumed.returncode == ref.returncode, resumed.stderr
    assert part.read_bytes() == full.read_bytes()
    assert not Path(str(part) + ".lock").exists()


@pytest.mark.parametrize("ext", ["tsv", "jsonl"])
def test_resume_with_batch_calibration_and_abstain_is_byte_identical(tiny_qwen_mlx, tmp_path, ext):
    inp = jsonl_input(tmp_path / "in.jsonl", TEXTS[:24], [(5, "{bad")])
    args = cli(tiny_qwen_mlx, "--window", "4", "--calibrate", "batch", "--warmup", "6", "--min-confidence", "0.6")
    full = tmp_path / f"full.{ext}"
    r_full = run(["classify", str(inp), "-o", str(full), *args])
    assert r_full.exit_code == 1
    data = full.read_bytes()
    assert b"raw_p" in data or b"raw_probs" in data
    written, _ = scan_output(str(full), ext, csv_columns(["a", "b", "c"], raw=True, abstain=True))
    for cut in (written[2].end, written[9].end + 3, written[17].end):
        part = tmp_path / f"part-{cut}.{ext}"
        interrupted_copy(full, part, cut)
        doc = json.loads(manifest_path(str(part)).read_text())
        assert doc["fitted_calibrator"]["method"] == "batch"
        r = run(["classify", str(inp), "-o", str(part), "--resume", *args])
        assert r.exit_code == 1 and part.read_bytes() == data, cut
