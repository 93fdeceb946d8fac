"""One writer per output and the manifest beside it (`files/output/manifest.py`): a second writer
exits 2 naming the holder, a killed holder's lock is taken over, the settings and the input's sha256
that decide the rows are pinned, and `--resume` refuses an output that is not ours or was made with
other settings, untouched. From output integrity (issue 10): each test failed before the fix it guards."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from mlx_slm.cli import main
from mlx_slm.files.output import OutputLock, manifest_path
from mlx_slm.text.workload import tickets
from tests.classify_run import TEXTS, cli, jsonl_input, run

# ----------------------------------------------------------------- 2. one writer per output


def test_second_writer_exits_2_naming_the_holder(tiny_qwen_mlx, tmp_path):
    inp = jsonl_input(tmp_path / "in.jsonl")
    out = tmp_path / "o.jsonl"
    with OutputLock(str(out)):
        r = CliRunner().invoke(main, ["classify", str(inp), "-o", str(out), *cli(tiny_qwen_mlx)])
        assert r.exit_code == 2
        assert f"pid {os.getpid()}" in r.output and "another mlx-slm run" in r.output
        assert out.read_bytes() == b""  # the holder's (empty) file, untouched
        # Another path to the same file meets the same lock (a hard link); a symlink is never
        # written through at all (issue 18).
        for alias in (tmp_path / "sym.jsonl", tmp_path / "hard.jsonl"):
            alias.symlink_to(out) if alias.name.startswith("sym") else os.link(out, alias)
            r = CliRunner().invoke(main, ["classify", str(inp), "-o", str(alias), *cli(tiny_qwen_mlx)])
            want = "is a symbolic link" if alias.name.startswith("sym") else "another mlx-slm run"
            assert r.exit_code == 2 and want in r.output, r.output
            alias.unlink()
    # Released: the lock file is gone and the next run proceeds.
    assert not Path(str(out) + ".lock").exists()
    assert run(["classify", str(inp), "-o", str(out), *cli(tiny_qwen_mlx)]).exit_code == 0
    assert not Path(str(out) + ".lock").exists()


def test_lock_is_released_when_the_holder_is_killed(tmp_path):
    out = tmp_path / "o.jsonl"
    code = f"from mlx_slm.files.output import OutputLock; import time\nwith OutputLock({str(out)!r}):\n print('held', flush=True); time.sleep(60)"
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "held"
    with pytest.raises(Exception, match="another mlx-slm run"):
        with OutputLock(str(out)):
            pass
    p.kill()
    p.wait()
    with OutputLock(str(out)):  # the kernel dropped the dead holder's flock
        pass


def test_resume_refuses_other_settings_naming_the_field(tiny_qwen_mlx, tmp_path):
    inp = jsonl_input(tmp_path / "in.jsonl", TEXTS[:6])
    for ext in ("jsonl", "csv"):
        out = tmp_path / f"o.{ext}"
        assert run(["classify", str(inp), "-o", str(out), *cli(tiny_qwen_mlx)]).exit_code == 0
        before = out.read_bytes()
        r = CliRunner().invoke(
            main,
            [
                "classify",
                str(inp),
                "-o",
                str(out),
                "--resume",
                "--model",
                str(tiny_qwen_mlx),
                "--labels",
                "a,b,x",
                "-q",
            ],
        )
        assert r.exit_code == 2 and "labels" in r.output and '["a", "b", "c"]' in r.output
        assert out.read_bytes() == before
    inp.write_text(inp.read_text() + json.dumps({"text": "one more"}) + "\n")
    r = CliRunner().invoke(
        main, ["classify", str(inp), "-o", str(tmp_path / "o.jsonl"), "--resume", *cli(tiny_qwen_mlx)]
    )
    assert r.exit_code == 2 and "input_size" in r.output


def test_resume_refuses_a_file_that_is_not_ours_without_touching_it(tiny_qwen_mlx, tmp_path):
    inp = jsonl_input(tmp_path / "in.jsonl", TEXTS[:6])
    other = tmp_path / "notes.jsonl"
    other.write_bytes(b'{"id": "t0", "note": "mine"}\n{"id": "t1", "note": "tor')  # no newline at the end
    before = other.read_bytes()
    r = CliRunner().invoke(main, ["classify", str(inp), "-o", str(other), "--resume", *cli(tiny_qwen_mlx)])
    assert r.exit_code == 2 and "not written by mlx-slm" in r.output and "untouched" in r.output
    assert other.read_bytes() == before
    # Ours, but from another input: the ids say so.
    out = tmp_path / "o.jsonl"
    assert run(["classify", str(inp), "-o", str(out), *cli(tiny_qwen_mlx)]).exit_code == 0
    rows = out.read_text().splitlines(keepends=True)
    out.write_text(rows[0].replace('"t0"', '"zz"') + "".join(rows[1:3]))
    doc = json.loads(manifest_path(str(out)).read_text())
    doc["complete"] = False
    manifest_path(str(out)).write_text(json.dumps(doc))
    r = CliRunner().invoke(main, ["classify", str(inp), "-o", str(out), "--resume", *cli(tiny_qwen_mlx)])
    assert r.exit_code == 2 and "'zz'" in r.output and "not the output of this input" in r.output


def test_streams_get_no_lock_or_manifest_and_a_closed_pipe_is_quiet(tiny_qwen_mlx, tmp_path):
    r = run(["classify", "-o", os.devnull, "--output-format", "jsonl", *cli(tiny_qwen_mlx)], input="hello\n")
    assert r.exit_code == 0 and not os.path.exists(os.devnull + ".lock")
    texts = [t for t, _ in tickets(200)]
    p = subprocess.Popen(
        [sys.executable, "-m", "mlx_slm.cli", "classify", "--format", "text", *cli(tiny_qwen_mlx)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    p.stdin.write(("\n".join(texts) + "\n").encode())
    p.stdin.close()
    assert json.loads(p.stdout.readline())["id"] == 1
    p.stdout.close()  # like `| head -1`
    err = p.stderr.read().decode()
    assert p.wait(timeout=300) == 141 and "Traceback" not in err


def _edit_in_place(path: Path) -> None:
    """One text changed, the size and the ids kept."""
    data = path.read_text()
    i = data.index('"text": "') + len('"text": "')
    path.write_text(data[:i] + ("X" if data[i] != "X" else "Y") + data[i + 1 :])


@pytest.mark.parametrize("ext", ["jsonl", "csv"])
def test_resume_refuses_an_input_edited_in_place_at_the_same_size(tiny_qwen_mlx, tmp_path, ext):
    """Issue 26: the manifest pinned only the input's path and size, so a resume after an
    edit in place kept rows of the old content. It pins the input's sha256 now."""
    inp = jsonl_input(tmp_path / "in.jsonl", TEXTS[:6])
    out = tmp_path / f"o.{ext}"
    assert run(["classify", str(inp), "-o", str(out), *cli(tiny_qwen_mlx)]).exit_code == 0
    settings = json.loads(manifest_path(str(out)).read_text())["settings"]
    import hashlib

    assert settings["input_sha256"] == hashlib.sha256(inp.read_bytes()).hexdigest()
    before, size = out.read_bytes(), inp.stat().st_size
    _edit_in_place(inp)
    assert inp.stat().st_size == size
    r = CliRunner().invoke(main, ["classify", str(inp), "-o", str(out), "--resume", *cli(tiny_qwen_mlx)])
    assert r.exit_code == 2, r.output
    assert str(inp) in r.output and "edited in place" in r.output and "without --resume" in r.output
    assert out.read_bytes() == before
    # A manifest of an older mlx-slm (no input_sha256) cannot be checked: refused, saying so.
    doc = json.loads(manifest_path(str(out)).read_text())
    del doc["settings"]["input_sha256"]
    manifest_path(str(out)).write_text(json.dumps(doc))
    r = CliRunner().invoke(main, ["classify", str(inp), "-o", str(out), "--resume", *cli(tiny_qwen_mlx)])
    assert r.exit_code == 2 and "older mlx-slm" in r.output and out.read_bytes() == before
    assert run(["classify", str(inp), "-o", str(out), *cli(tiny_qwen_mlx)]).exit_code == 0  # the way out


def test_a_manifest_says_when_its_input_was_not_hashed(tiny_qwen_mlx, tmp_path):
    out = tmp_path / "o.jsonl"
    assert run(["classify", "-", "-o", str(out), *cli(tiny_qwen_mlx)], input="hello\nworld\n").exit_code == 0
    settings = json.loads(manifest_path(str(out)).read_text())["settings"]
    assert settings["input"] == "-" and settings["input_sha256"] is None
    assert "standard input" in settings["input_not_hashed"]


def test_a_parquet_output_is_locked_without_being_created(tmp_path):
    """A Parquet output appears only when complete: its lock holds the lock file alone, and a
    second run on it is refused naming the holder."""
    out = tmp_path / "o.parquet"
    with OutputLock(str(out), create=False):
        assert not out.exists() and Path(str(out) + ".lock").exists()
        with pytest.raises(Exception, match=f"another mlx-slm run \\(pid {os.getpid()}"):
            with OutputLock(str(out), create=False):
                pass
    assert not out.exists() and not Path(str(out) + ".lock").exists()


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
