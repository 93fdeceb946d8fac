"""Outputs, hostile round five (issue 33): merge types a questions run's CSV parts into Parquet by
the Parquet writer's own rule and refuses an -o extension classify refuses; CSV cells that a
spreadsheet would read as a formula are written as they are (as pandas' to_csv writes them) and read
back exactly; a run killed while holding its lock leaves a lock that the next run takes over, says
so, and removes.

From hostile round five (issue 33); was tests/test_outputs_round5.py."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from mlx_slm.files.output import read_records
from mlx_slm.text.workload import tickets
from tests.hostile import invoke, refused_cleanly, write

QUESTIONS = [
    {"name": "team", "question": "Which team?", "labels": ["billing", "technical"]},
    {"name": "size", "question": "How big?", "kind": "scale", "levels": ["1", "2", "3"]},
]


@pytest.fixture
def qrun(tiny_qwen_mlx, tmp_path):
    data = write(
        tmp_path / "in.jsonl", "".join(json.dumps({"id": i, "text": t}) + "\n" for i, (t, _) in enumerate(tickets(16)))
    )
    q = write(tmp_path / "q.jsonl", "".join(json.dumps(x) + "\n" for x in QUESTIONS))
    return ["classify", data, "--model", tiny_qwen_mlx, "--questions", q, "--min-confidence", "0.6", "-q",
            "--window", "4"]  # fmt: skip


def test_a_questions_runs_csv_parts_merge_into_the_same_parquet_as_one_run(qrun, tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    for fmt in ("csv", "tsv"):
        parts = [tmp_path / f"part{i}.{fmt}" for i in range(2)]
        for i, p in enumerate(parts):
            assert invoke([*qrun, "-o", p, "--shard", f"{i}/2", "--on-error", "skip"]).exit_code == 0
        r = invoke(["merge", *parts, "-o", tmp_path / f"all-{fmt}.parquet"])
        assert r.exit_code == 0, r.output
        assert invoke([*qrun, "-o", tmp_path / "one.parquet"]).exit_code == 0
        merged, one = pq.read_table(tmp_path / f"all-{fmt}.parquet"), pq.read_table(tmp_path / "one.parquet")
        assert merged.schema.field("team.p_billing").type == one.schema.field("team.p_billing").type  # float64
        assert merged.schema.field("size.expected").type == one.schema.field("size.expected").type
        assert merged.schema.field("team.abstained").type == one.schema.field("team.abstained").type  # bool
        assert merged.drop(["id"]).equals(one.drop(["id"]))  # CSV ids are strings; everything else equal
        assert merged.column("id").to_pylist() == [str(i) for i in one.column("id").to_pylist()]


@pytest.mark.parametrize("name", ["all.weird", "all", "all.jsonl.bak"])
def test_merge_refuses_an_output_extension_classify_refuses(name, qrun, tmp_path):
    parts = [tmp_path / f"p{i}.jsonl" for i in range(2)]
    for i, p in enumerate(parts):
        assert invoke([*qrun, "-o", p, "--shard", f"{i}/2"]).exit_code == 0
    r = invoke(["merge", *parts, "-o", tmp_path / name])
    refused_cleanly(r, "unknown output extension", "name it .jsonl")
    assert not (tmp_path / name).exists()
    assert invoke([*qrun, "-o", tmp_path / name]).exit_code == 2  # classify refuses the same name


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


def test_a_killed_runs_lock_is_taken_over_said_and_removed(tmp_path, capfd):
    from mlx_slm.files.output import OutputLock

    out = tmp_path / "o.jsonl"
    code = f"from mlx_slm.files.output import OutputLock; import time\nwith OutputLock({str(out)!r}):\n print('held', flush=True); time.sleep(60)"
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "held"
    p.kill()
    p.wait()
    lock = tmp_path / "o.jsonl.lock"
    assert f"pid {p.pid}" in lock.read_text()  # the crashed run's lock file is left behind ...
    with OutputLock(str(out)):  # ... taken over at once (no wait), with a note naming the dead holder
        assert f"pid {p.pid}" not in lock.read_text()
    err = capfd.readouterr().err
    assert f"pid {p.pid}" in err and "stopped without finishing" in err
    assert not lock.exists()  # and removed when this run ends
    with OutputLock(str(out)):  # a lock released cleanly leaves nothing to note
        pass
    assert "stopped without finishing" not in capfd.readouterr().err


def test_an_output_written_whole_is_never_renamed_over_a_fifo_or_a_device(qrun, tmp_path):
    """--json, --save-task, merge's -o (and rerank's) are written into a temporary file renamed into
    place: over /dev/full or /dev/null that rename would replace the device (as root). A path that is
    not a regular file is refused: before any work where the option is written whole, and always in
    the writer itself. (A FIFO stands in for a device here: the test must not risk /dev.)"""
    import os

    from mlx_slm.ground.errors import OutputError
    from mlx_slm.ground.safefs import atomic_write

    fifo = tmp_path / "fifo.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(OutputError, match="not a regular file"):
        atomic_write(fifo, "x", "--json")
    assert fifo.is_fifo()
    data = write(tmp_path / "gold.jsonl", '{"text": "hi", "label": "a"}\n')
    for flag in ("--json", "--save-task"):
        r = invoke(["eval", data, "--labels", "a,b", "--model", tmp_path / "no-model", flag, fifo])
        refused_cleanly(r, f"{flag} {fifo} is not a regular file")
    parts = [tmp_path / f"p{i}.jsonl" for i in range(2)]
    for i, p in enumerate(parts):
        assert invoke([*qrun, "-o", p, "--shard", f"{i}/2"]).exit_code == 0
    refused_cleanly(invoke(["merge", *parts, "-o", fifo]), "not a regular file")
    assert fifo.is_fifo()
