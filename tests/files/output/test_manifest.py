"""Output integrity (issue 10): never destroy input, one writer per output, exact resume,
and a CLI that fails clearly. Each test here failed before the fix it guards."""

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from mlx_slm.cli import main
from mlx_slm.files.output import MANIFEST_SUFFIX, OutputLock, csv_columns, manifest_path, plan_resume, scan_output
from mlx_slm.text.workload import tickets

TEXTS = [t for t, _ in tickets(40)]


def run(args, input=None):
    return CliRunner().invoke(main, args, input=input, catch_exceptions=False)


def cli(model, *extra):
    return ["--model", str(model), "--labels", "a,b,c", "-q", *extra]


def jsonl_input(path: Path, texts=TEXTS, extra_lines=()) -> Path:
    lines = [json.dumps({"id": f"t{i}", "text": t}) for i, t in enumerate(texts)]
    for at, line in extra_lines:
        lines.insert(at, line)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


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


# ----------------------------------------------------------------- 3. resume: ours, exactly


def _interrupted_copy(full: Path, part: Path, cut: int) -> None:
    """What a run killed after writing `cut` bytes leaves: the prefix and an incomplete manifest."""
    part.write_bytes(full.read_bytes()[:cut])
    doc = json.loads(manifest_path(str(full)).read_text())
    doc["complete"], doc["rows"] = False, None
    manifest_path(str(part)).write_text(json.dumps(doc))


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
        _interrupted_copy(full, part, cut)
        r = run(["classify", str(inp), "-o", str(part), "--resume", *args])
        assert r.exit_code == r_full.exit_code, (cut, r.output)
        assert part.read_bytes() == data, f"cut at byte {cut}"
    # A complete output resumes to itself, with the same status, computing nothing.
    r = run(["classify", str(inp), "-o", str(full), "--resume", *args])
    assert r.exit_code == 1 and full.read_bytes() == data


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
        assert r.exit_code == 2 and "labels" in r.output and "['a', 'b', 'c']" in r.output
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
    p = subprocess.Popen([*args, "-o", str(part)], stderr=subprocess.PIPE, text=True)
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


# ----------------------------------------------------------------- 6-9. the CLI fails clearly


@pytest.mark.parametrize("cmd", [[], ["classify"], ["eval"], ["convert"], ["parity"], ["doctor"], ["models"]])
def test_help_exits_0_without_an_error_line(cmd):
    r = CliRunner().invoke(main, [*cmd, "--help"])
    assert r.exit_code == 0, r.output
    assert "Usage:" in r.output and "error" not in r.output.lower().split("usage:")[0]
    assert "mlx-slm: error" not in r.output


def test_a_bug_shows_its_traceback_and_says_it_is_a_bug(tiny_qwen_mlx, monkeypatch):
    from mlx_slm.kinds.base import OnePrompt

    def boom(*a, **k):
        raise KeyError("internal")

    monkeypatch.setattr(OnePrompt, "items", boom)  # where every one-prompt kind tokenizes its texts
    r = CliRunner().invoke(main, ["classify", *cli(tiny_qwen_mlx)], input="hello\n")
    assert r.exit_code == 70
    assert "Traceback" in r.output and "KeyError" in r.output and "this is a bug" in r.output


def test_unknown_output_extension_is_an_error_unless_a_format_is_given(tiny_qwen_mlx, tmp_path):
    r = CliRunner().invoke(main, ["classify", "-o", str(tmp_path / "o.out"), *cli(tiny_qwen_mlx)], input="hi\n")
    assert r.exit_code == 2 and "--output-format" in r.output and not (tmp_path / "o.out").exists()
    r = run(["classify", "-o", str(tmp_path / "o.out"), "--output-format", "csv", *cli(tiny_qwen_mlx)], input="hi\n")
    assert r.exit_code == 0 and (tmp_path / "o.out").read_text().startswith("id,label,")


def test_parity_on_an_empty_input_is_a_user_error(tiny_qwen_mlx, tmp_path):
    empty = tmp_path / "e.jsonl"
    empty.write_text("")
    r = CliRunner().invoke(
        main,
        [
            "parity",
            "--model",
            str(tiny_qwen_mlx),
            "--reference",
            str(tiny_qwen_mlx),
            "--input",
            str(empty),
            "--labels",
            "a,b,c",
        ],
    )
    assert r.exit_code == 2 and "no text" in r.output and "Traceback" not in r.output


def test_a_folder_that_is_not_a_model_says_so_and_failed_conversions_leave_nothing(tmp_path, tiny_qwen_hf):
    from mlx_slm.weights.convert import ConversionError, convert

    empty = tmp_path / "notamodel"
    empty.mkdir()
    r = CliRunner().invoke(main, ["classify", "--model", str(empty), "-q"], input="hi\n")
    assert r.exit_code == 2 and f"no config.json in {empty}" in r.output and "converting" not in r.output
    # An architecture we do not run: the conversion fails after it started, and cleans up.
    bad = tmp_path / "bad"
    bad.mkdir()
    for f in tiny_qwen_hf.iterdir():
        (bad / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((bad / "config.json").read_text())
    cfg["model_type"] = "mamba"
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConversionError, match="mamba"):
        convert(bad, tmp_path / "out" / "m", progress=None)
    assert list((tmp_path / "out").iterdir()) == []


def test_a_system_prompt_over_the_context_fails_at_once_or_gives_error_rows(tiny_qwen_mlx, tmp_path):
    long_system = "Please read carefully. " * 600  # far over the tiny model's 1,024 positions
    r = CliRunner().invoke(main, ["classify", *cli(tiny_qwen_mlx), "--system", long_system], input="a\nb\n")
    assert r.exit_code == 2 and "shorten --system" in r.output and r.stdout.strip() == ""
    r = run(["classify", *cli(tiny_qwen_mlx), "--system", long_system, "--truncate", "tail"], input="a\nb\n")
    out = [json.loads(x) for x in r.stdout.splitlines()]
    assert r.exit_code == 1 and len(out) == 2 and all("shorten --system" in o["error"] for o in out)


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
        _interrupted_copy(full, part, cut)
        doc = json.loads(manifest_path(str(part)).read_text())
        assert doc["fitted_calibrator"]["method"] == "batch"
        r = run(["classify", str(inp), "-o", str(part), "--resume", *args])
        assert r.exit_code == 1 and part.read_bytes() == data, cut


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


def test_stdin_sniffing_and_editor_files(tiny_qwen_mlx, tmp_path):
    r = run(["classify", *cli(tiny_qwen_mlx)], input="{URGENT} charged twice\nthe app crashes\n")
    out = [json.loads(x) for x in r.stdout.splitlines()]
    assert r.exit_code == 0 and [o["id"] for o in out] == [1, 2]  # text, not malformed JSON
    labels = tmp_path / "labels.txt"
    labels.write_bytes("\ufeffa\nb\nc\n".encode())
    r = run(["classify", "--model", str(tiny_qwen_mlx), "--labels-file", str(labels), "-q"], input="hello\n")
    assert set(json.loads(r.stdout)["probs"]) == {"a", "b", "c"}


def test_eval_predictions_from_another_input_are_refused(tiny_qwen_mlx, tmp_path):
    gold = tmp_path / "g.jsonl"
    gold.write_text(
        "".join(json.dumps({"id": f"g{i}", "text": t, "label": "a"}) + "\n" for i, t in enumerate(TEXTS[:4]))
    )
    other = jsonl_input(tmp_path / "other.jsonl", TEXTS[:4])
    preds = tmp_path / "p.jsonl"
    assert run(["classify", str(other), "-o", str(preds), *cli(tiny_qwen_mlx)]).exit_code == 0
    r = CliRunner().invoke(main, ["eval", str(gold), "--labels", "a,b,c", "--predictions", str(preds)])
    assert r.exit_code == 2 and "not the output for this input" in r.output


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


def test_eval_refuses_predictions_of_another_input_with_line_number_ids(tiny_qwen_mlx, tmp_path):
    """Issue 26: ids that are line numbers match in any input of that length; the
    predictions' manifest says which content they were made from."""
    gold = tmp_path / "g.jsonl"
    gold.write_text("".join(json.dumps({"text": t, "label": "a"}) + "\n" for t in TEXTS[:4]))
    preds = tmp_path / "p.jsonl"
    assert run(["classify", str(gold), "-o", str(preds), *cli(tiny_qwen_mlx)]).exit_code == 0
    ok = run(["eval", str(gold), "--labels", "a,b,c", "--predictions", str(preds)])
    assert ok.exit_code == 0 and "accuracy" in ok.output
    _edit_in_place(gold)
    r = CliRunner().invoke(main, ["eval", str(gold), "--labels", "a,b,c", "--predictions", str(preds)])
    assert r.exit_code == 2, r.output
    assert "not the output for this input" in r.output and f"mlx-slm classify {gold} -o {preds}" in r.output
    # An unfinished output is refused, naming the way out.
    m = manifest_path(str(preds))
    doc = json.loads(m.read_text())
    m.write_text(json.dumps({**doc, "complete": False}))
    r = CliRunner().invoke(main, ["eval", str(gold), "--labels", "a,b,c", "--predictions", str(preds)])
    assert r.exit_code == 2 and "unfinished" in r.output and "--resume" in r.output
    # Without a manifest (predictions made otherwise), rows are checked by id only.
    m.unlink()
    assert run(["eval", str(gold), "--labels", "a,b,c", "--predictions", str(preds)]).exit_code == 0


def test_a_resumed_batch_calibrated_run_does_not_call_its_items_labelled(tiny_qwen_mlx, tmp_path):
    """Issue 26: the summary of a resumed batch run said "6 labelled items" (batch uses no labels)."""
    inp = jsonl_input(tmp_path / "in.jsonl", TEXTS[:12])
    args = ["--model", str(tiny_qwen_mlx), "--labels", "a,b,c", "--window", "4", "--calibrate", "batch"]
    full = tmp_path / "full.jsonl"
    assert run(["classify", str(inp), "-o", str(full), *args, "--warmup", "6", "-q"]).exit_code == 0
    written, _ = scan_output(str(full), "jsonl", csv_columns(["a", "b", "c"], raw=True))
    part = tmp_path / "part.jsonl"
    _interrupted_copy(full, part, written[7].end)
    r = CliRunner().invoke(main, ["classify", str(inp), "-o", str(part), "--resume", *args, "--warmup", "6"])
    assert r.exit_code == 0, r.output
    assert "the prior the interrupted run fitted, from the first 6 items of this input" in r.output
    assert "labelled" not in r.output and part.read_bytes() == full.read_bytes()


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
