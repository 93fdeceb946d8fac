"""The `mlx-slm` group (`cli/__init__.py`): help exits 0, a user's error is one line and exit 2, a bug
shows its traceback and says it is one (exit 70); `python -m mlx_slm.cli` runs it; every command's
--save-task is locked as an output is."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from mlx_slm.cli import main
from mlx_slm.files.output import OutputLock
from tests.train_cli import run, train_file


def cli(model, *extra):
    return ["--model", str(model), "--labels", "a,b,c", "-q", *extra]


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


# One writer of a task at a time (hostile round seven, issue 47): every command's --save-task is locked as an
# output is.


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return train_file(tmp_path_factory)


# --------------------------------------------------------------------------- a lost task
@pytest.mark.parametrize("command", ["train", "classify", "eval"])
def test_a_second_writer_of_a_task_fails_naming_the_file_and_the_other_writer(tmp_path, data, tiny_qwen_mlx, command):
    """Two runs saving one --save-task at once both said "task saved" and one was lost: the task is
    locked as an output is, so the second stops at once (exit 2) naming the file and the holder."""
    task = tmp_path / "task.json"
    task.write_text("the first writer's")
    args = {
        "train": ["train", data, "--model", tiny_qwen_mlx, "--folds", "2", "--layers", "1", "--save-task", task],
        "classify": ["classify", data, "--model", tiny_qwen_mlx, "-o", tmp_path / "o.jsonl", "--save-task", task],
        "eval": ["eval", data, "--model", tiny_qwen_mlx, "--save-task", task],
    }[command]
    with OutputLock(str(task), create=False, option="--save-task"):  # another run holds it
        r = run(args)
    assert r.exit_code == 2, r.output
    assert f"{task} is being written by another mlx-slm run (pid {os.getpid()}" in r.output
    assert "choose another --save-task" in r.output
    assert task.read_text() == "the first writer's"


def test_the_task_lock_is_let_go_when_the_run_ends(tmp_path, data, tiny_qwen_mlx):
    task = tmp_path / "task.json"
    for _ in range(2):  # the second run finds no holder: the first let go
        r = run(["train", data, "--model", tiny_qwen_mlx, "--folds", "2", "--layers", "1", "--save-task", task, "-q"])
        assert r.exit_code == 0, r.output
    assert json.loads(task.read_text())["labels"] and not Path(str(task) + ".lock").exists()


@pytest.mark.slow
def test_two_train_processes_on_one_task_one_fails(tmp_path, data, tiny_qwen_mlx):
    """The reported case, as two processes: exactly one saves the task, the other exits 2."""
    task = tmp_path / "task.json"
    cmd = [sys.executable, "-m", "mlx_slm.cli", "train", str(data), "--model", str(tiny_qwen_mlx), "--folds", "2",
           "--layers", "1,2", "--save-task", str(task)]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for _ in range(2)]  # fmt: skip
    got = [(p.wait(timeout=600), p.stderr.read()) for p in procs]
    codes = sorted(c for c, _ in got)
    if codes == [0, 0]:  # the first finished before the second began: nothing was lost
        pytest.skip("the runs did not overlap")
    assert codes == [0, 2], got
    err = next(e for c, e in got if c == 2)
    assert "is being written by another mlx-slm run" in err and str(task) in err
