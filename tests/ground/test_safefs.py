"""Files and their neighbours: nothing of the user's destroyed, nothing written through a link
someone placed, merge that checks everything it can, and concurrent first use of an empty
cache. One test per class of failure; each failed (data loss, a write through a link, a
traceback or a hang) before its fix."""

import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from mlx_slm.cli import main
from mlx_slm.files.output import manifest_path
from mlx_slm.ground.errors import OutputError
from mlx_slm.ground.safefs import FileLock, UnsafePathError, atomic_write, atomic_writer, open_nofollow
from mlx_slm.text.workload import tickets
from mlx_slm.weights.convert import RECORD, is_converted
from tests.hostile import invoke, refused_cleanly, write, write_input
from tests.hostile import model_cli as cli
from tests.hostile import refused_cleanly as refused

TEXTS = [t for t, _ in tickets(40)]


VICTIM = "the victim's own data\n"


def tree_digest(p: Path) -> dict[str, str]:
    return {
        str(f.relative_to(p)): hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(p.rglob("*")) if f.is_file()
    }


# ----------------------------------------------------------------- convert never destroys


def test_convert_never_destroys_a_folder_or_its_source(tiny_qwen_hf, tmp_path):
    src = tmp_path / "cv" / "src"
    shutil.copytree(tiny_qwen_hf, src)
    before = tree_digest(src)

    # A folder of the user's: refused, untouched; --force replaces it (and says so in --help).
    d = tmp_path / "d"
    d.mkdir()
    (d / "keep.txt").write_text("keep")
    refused(invoke(["convert", src, "--out", d]), "not empty", "keep.txt", "--force")
    assert (d / "keep.txt").read_text() == "keep"
    assert "--force" in invoke(["convert", "--help"]).output
    r = invoke(["convert", src, "--out", d, "--force"])
    assert r.exit_code == 0, r.output
    assert is_converted(d) and not (d / "keep.txt").exists()
    # A previous conversion of ours is replaced without --force; its record lists its files.
    assert set(json.loads((d / RECORD).read_text())["files"]) == {p.name for p in d.iterdir()}
    r = invoke(["convert", src, "--out", d, "--dtype", "float32"])
    assert r.exit_code == 0, r.output
    assert json.loads((d / RECORD).read_text())["dtype"] == "float32"
    # ... but not once something foreign was put in it.
    (d / "notes.txt").write_text("mine")
    refused(invoke(["convert", src, "--out", d]), "notes.txt")
    assert (d / "notes.txt").read_text() == "mine"

    # Never the source: the source itself, a folder inside it, a folder holding it (even --force).
    for out in (src, src / "sub", tmp_path / "cv"):
        for force in ([], ["--force"]):
            refused(invoke(["convert", src, "--out", out, *force]), "source")
    assert tree_digest(src) == before and not (src / "sub").exists()

    # A link, or a file, at --out: refused, the target untouched.
    victim = tmp_path / "victim.txt"
    victim.write_text(VICTIM)
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "elsewhere")
    refused(invoke(["convert", src, "--out", link, "--force"]), "symbolic link")
    refused(invoke(["convert", src, "--out", victim, "--force"]), "is a file")
    assert victim.read_text() == VICTIM and not (tmp_path / "elsewhere").exists()
    # No temporary folders are left beside the outputs.
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_convert_into_a_read_only_folder_is_a_clear_error(tiny_qwen_hf, tmp_path, monkeypatch):
    ro = tmp_path / "ro"
    ro.mkdir()
    if os.geteuid() == 0:  # root writes anywhere: make the folder refuse as a read-only mount would
        import tempfile

        real = tempfile.mkdtemp

        def mkdtemp(*a, dir=None, **k):
            if dir is not None and Path(dir) == ro:
                raise PermissionError(13, "Permission denied")
            return real(*a, dir=dir, **k)

        monkeypatch.setattr(tempfile, "mkdtemp", mkdtemp)
    else:
        ro.chmod(0o555)
    try:
        refused(invoke(["convert", tiny_qwen_hf, "--out", ro / "m"]), str(ro), "Permission denied")
    finally:
        ro.chmod(0o755)
    assert list(ro.iterdir()) == []


# ----------------------------------------------------------------- never through a link


def test_links_placed_beside_an_output_are_never_written_through(tiny_qwen_mlx, tmp_path):
    inp = write_input(tmp_path / "in.jsonl")
    victim = tmp_path / "victim.txt"
    victim.write_text(VICTIM)
    out = tmp_path / "out.jsonl"
    # The repro: a link at OUT.lock, and a run that fails (no such model).
    Path(f"{out}.lock").symlink_to(victim)
    refused(invoke(["classify", inp, "-o", out, "--model", "no-such-model", "-q"]), "symbolic link")
    assert victim.read_text() == VICTIM and not out.exists()
    os.unlink(f"{out}.lock")
    # A link at the output itself or at its manifest: refused before anything is written.
    for companion in ("", ".mlx-slm.json"):
        Path(f"{out}{companion}").symlink_to(victim)
        refused(invoke(["classify", inp, "-o", out, *cli(tiny_qwen_mlx)]), "symbolic link")
        os.unlink(f"{out}{companion}")
        assert victim.read_text() == VICTIM and not out.exists()
    # A link at a name a temporary file once had (OUT.mlx-slm.json.tmp): never used at all.
    Path(f"{out}.mlx-slm.json.tmp").symlink_to(victim)
    r = invoke(["classify", inp, "-o", out, *cli(tiny_qwen_mlx)])
    assert r.exit_code == 0, r.output
    assert victim.read_text() == VICTIM
    assert json.loads(manifest_path(str(out)).read_text())["complete"]
    assert not manifest_path(str(out)).is_symlink() and not out.is_symlink()
    # A link at --save-task: refused before the run.
    task = tmp_path / "task.json"
    task.symlink_to(victim)
    refused(invoke(["classify", inp, "-o", tmp_path / "o2.jsonl", "--save-task", task, *cli(tiny_qwen_mlx)]), "link")
    assert victim.read_text() == VICTIM
    # No temporary file is left behind.
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".partial")]


def test_safefs_primitives(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text(VICTIM)
    link = tmp_path / "link.json"
    link.symlink_to(victim)
    with pytest.raises(UnsafePathError, match="symbolic link"):
        atomic_write(link, "{}")
    with pytest.raises(UnsafePathError):
        os.close(open_nofollow(link, os.O_WRONLY))
    with pytest.raises(OutputError, match="is a folder"):
        atomic_write(tmp_path, "x")
    # A FIFO where a file is expected: refused at once, not a hang.
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(UnsafePathError, match="not a regular file"):
        open_nofollow(fifo, os.O_RDWR)
    # A failed write leaves the old content and no temporary file.
    f = tmp_path / "f.txt"
    atomic_write(f, "old")
    with pytest.raises(RuntimeError), atomic_writer(f) as w:
        w.write(b"half")
        raise RuntimeError("interrupted")
    assert f.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == [
        "f.txt",
        "fifo",
        "link.json",
        "victim.txt",
    ]
    assert victim.read_text() == VICTIM
    # A lock file that is a link is refused; a held lock makes the next holder say it waits.
    (tmp_path / "l.lock").symlink_to(victim)
    with pytest.raises(UnsafePathError):
        FileLock(tmp_path / "l.lock").__enter__()
    said, order = [], []
    with FileLock(tmp_path / "m.lock"):
        t = threading.Thread(
            target=lambda: (
                FileLock(tmp_path / "m.lock", "waiting for another process", said.append).__enter__()
                and order.append("second")
            )
        )
        t.start()
        time.sleep(0.3)
        order.append("first released")
    t.join(10)
    assert said == ["waiting for another process"] and order == ["first released", "second"]


def test_plots_and_reports_are_never_written_through_a_link(tmp_path):
    pytest.importorskip("matplotlib")
    from mlx_slm.jobs.evaluate import plot
    from mlx_slm.text.metrics import report

    rep = report(["a", "b", "a"], ["a", "b", "b"], [0.9, 0.8, 0.6], ["a", "b"])
    victim = tmp_path / "victim.png"
    victim.write_text(VICTIM)
    plots = tmp_path / "plots"
    plots.mkdir()
    (plots / "confusion.png").symlink_to(victim)
    with pytest.raises(UnsafePathError):
        plot(rep, plots)
    assert victim.read_text() == VICTIM
    os.unlink(plots / "confusion.png")
    assert [p.name for p in plot(rep, plots)] == ["confusion.png", "reliability.png"]
    assert (plots / "confusion.png").read_bytes()[:4] == b"\x89PNG"


def test_eval_refuses_a_linked_plot_file_before_printing_the_report(tiny_qwen_mlx, tmp_path):
    """Issue 26: a link at --plots/reliability.png was found only after the report was printed."""
    pytest.importorskip("matplotlib")
    gold = tmp_path / "g.jsonl"
    gold.write_text("".join(json.dumps({"text": t, "label": "a"}) + "\n" for t in ("one", "two")))
    preds = tmp_path / "p.jsonl"
    preds.write_text("".join(json.dumps({"id": i, "label": "a", "probs": {"a": 0.9, "b": 0.1}}) + "\n" for i in (1, 2)))
    victim = tmp_path / "victim.png"
    victim.write_text(VICTIM)
    plots = tmp_path / "plots"
    plots.mkdir()
    (plots / "reliability.png").symlink_to(victim)
    args = ["eval", str(gold), "--labels", "a,b", "--predictions", str(preds), "--plots", str(plots)]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 2 and "reliability.png" in r.output and "symbolic link" in r.output, r.output
    assert "accuracy" not in r.output and victim.read_text() == VICTIM and not (plots / "confusion.png").exists()
    os.unlink(plots / "reliability.png")
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0 and (plots / "reliability.png").read_bytes()[:4] == b"\x89PNG"
    assert "mlx-slm: wrote" in r.output
    r = CliRunner().invoke(main, [*args, "-q"])  # -q: no notes on stderr, the figures still on stdout
    assert r.exit_code == 0 and "accuracy" in r.output and "mlx-slm: wrote" not in r.output, r.output


# ----------------------------------------------------------------- merge trusts nothing it can check


@pytest.fixture()
def parts(tiny_qwen_mlx, tmp_path):
    inp = write_input(tmp_path / "in.jsonl", 24)
    ps = [tmp_path / f"p{i}.jsonl" for i in range(2)]
    for i, p in enumerate(ps):
        r = invoke(["classify", inp, "-o", p, "--window", "4", "--shard", f"{i}/2", *cli(tiny_qwen_mlx)])
        assert r.exit_code == 0, r.output
        assert json.loads(manifest_path(str(p)).read_text())["output_sha256"]
    return inp, ps


def test_merge_never_writes_through_a_link_or_over_a_left_partial(parts, tmp_path):
    _, (p0, p1) = parts
    victim = tmp_path / "victim.txt"
    victim.write_text(VICTIM)
    out = tmp_path / "all.jsonl"
    Path(f"{out}.partial").symlink_to(victim)  # the repro
    r = invoke(["merge", p0, p1, "-o", out])
    assert r.exit_code == 0, r.output
    assert victim.read_text() == VICTIM and not out.is_symlink()
    assert out.read_bytes() == p0.read_bytes() + p1.read_bytes()
    # A .partial folder left where a merge once wrote is no obstacle either.
    os.unlink(f"{out}.partial")
    Path(f"{out}.partial").mkdir()
    assert invoke(["merge", p0, p1, "-o", out]).exit_code == 0
    # The output itself a link, or a folder: a clear refusal.
    link = tmp_path / "link.jsonl"
    link.symlink_to(victim)
    refused(invoke(["merge", p0, p1, "-o", link]), "symbolic link")
    (tmp_path / "dir.jsonl").mkdir()
    refused(invoke(["merge", p0, p1, "-o", tmp_path / "dir.jsonl"]), "folder")
    assert victim.read_text() == VICTIM


def test_merge_refuses_edited_parts_inputs_and_manifests_and_writes_nothing(parts, tmp_path):
    inp, (p0, p1) = parts
    out = tmp_path / "all.jsonl"
    good1, m1 = p1.read_bytes(), manifest_path(str(p1)).read_text()

    # A label edited by hand (same rows, valid JSON): the part's recorded sha256 tells.
    rows = p1.read_text().splitlines(keepends=True)
    rec = json.loads(rows[0])
    rec["label"] = next(lab for lab in ("a", "b", "c") if lab != rec["label"])
    p1.write_text(json.dumps(rec) + "\n" + "".join(rows[1:]))
    refused(invoke(["merge", p0, p1, "-o", out]), str(p1), "changed after its run completed")

    # Rows that are no records at all (a part of an older version: no checksum to tell).
    doc = json.loads(m1)
    del doc["output_sha256"]
    manifest_path(str(p1)).write_text(json.dumps(doc))
    for bad in (b"garbage\n", b"[1, 2]\n", b"\xff\xfe\n"):
        p1.write_bytes(bad + b"".join(good1.splitlines(keepends=True)[1:]))
        refused(invoke(["merge", p0, p1, "-o", out]), str(p1), "row 1", "not an mlx-slm output record")
    p1.write_bytes(good1)

    # A manifest with its shard index (or rows) removed or mistyped.
    for key, value in (("index", None), ("rows", [1]), ("count", "2")):
        doc = json.loads(m1)
        if value is None:
            del doc["settings"]["shard"][key]
        else:
            doc["settings"]["shard"][key] = value
        manifest_path(str(p1)).write_text(json.dumps(doc))
        refused(invoke(["merge", p0, p1, "-o", out]), str(p1), repr(key))
    manifest_path(str(p1)).write_text(m1)

    # The input edited after sharding, its ids unchanged.
    data = inp.read_text()
    i = data.index('"text": "') + len('"text": "')
    inp.write_text(data[:i] + "Z" + data[i + 1 :])
    refused(invoke(["merge", p0, p1, "-o", out]), str(inp), "changed after the parts were made")
    assert not out.exists()
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".partial")]
    # Told not to read the input (it is elsewhere), the unchanged parts merge.
    r = invoke(["merge", p0, p1, "-o", out, "--no-input-check"])
    assert r.exit_code == 0, r.output


# ----------------------------------------------------------------- concurrent first use


@pytest.mark.slow
@pytest.mark.real
def test_four_first_uses_at_once_on_an_empty_cache_all_succeed(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    env = {**os.environ, "MLX_SLM_HOME": str(home), "MLX_SLM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    inp = tmp_path / "in.txt"
    inp.write_text("I was charged twice\nThe app crashes on start\n")
    cmd = [
        sys.executable,
        "-m",
        "mlx_slm.cli",
        "classify",
        str(inp),
        "--model",
        "smollm2-135m",
        "-l",
        "billing,technical",
    ]
    procs = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(4)]
    results = [p.communicate(timeout=900) for p in procs]
    for p, (_out, err) in zip(procs, results):
        assert p.returncode == 0, err.decode()[-3000:]
        assert b"Traceback" not in err
    assert len({out for out, _ in results}) == 1 and results[0][0].count(b"\n") == 2
    errs = b"".join(err for _, err in results).decode()
    assert errs.count("converting smollm2-135m to MLX float16 (once)") == 1  # one conversion, the others waited
    assert "waiting for another process converting smollm2-135m" in errs
    assert is_converted(home / "models" / "smollm2-135m-float16")
    leftovers = [p for p in (home / "models").iterdir() if p.name != "smollm2-135m-float16"]
    assert leftovers == []


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
