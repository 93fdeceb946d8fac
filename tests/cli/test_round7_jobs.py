"""Issue 47 (hostile round seven), the jobs / CLI / train / task part, on tiny random models: one
writer of a task at a time, a chat template that refuses a system turn, a task that follows its
weights to a new place, and the options and messages that misled."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from mlx_slm.cli import main
from mlx_slm.files.output import OutputLock
from mlx_slm.text.workload import tickets

ROWS = tickets(24)


def run(args, **kw):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False, **kw)


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return _jsonl(tmp_path_factory.mktemp("r7") / "train.jsonl", [{"text": t, "label": g} for t, g in ROWS])


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


# --------------------------------------------------------------------------- a chat template that refuses a system turn
# Mistral-v0.1's template (less its bos_token, which the tiny tokenizer has not): user and assistant
# turns alternating, anything else raised.
MISTRAL_V01 = (
    "{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token }}"
    "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}"
)


@pytest.fixture(scope="module")
def mistral_style(tmp_path_factory, tiny_qwen_mlx) -> Path:
    """The tiny model with a chat template that raises on a system message."""
    import shutil

    out = tmp_path_factory.mktemp("mistral") / "m"
    shutil.copytree(tiny_qwen_mlx, out)
    (out / "chat_template.jinja").write_text(MISTRAL_V01)
    return out


def test_the_system_text_goes_into_the_user_turn_where_the_template_refuses_it(mistral_style):
    from transformers import AutoTokenizer

    from mlx_slm.text.prompts import PromptFormat, prompt_messages, refuses_system, render, tokenize

    tok = AutoTokenizer.from_pretrained(str(mistral_style))
    assert refuses_system(tok)
    fmt = PromptFormat("Answer with one of: a, b.", "Ticket: {text}\nCategory:", examples=(("x", "a"),))
    msgs = prompt_messages(tok, fmt, "my card")
    assert [m["role"] for m in msgs] == ["user", "assistant", "user"]
    assert msgs[0]["content"] == "Answer with one of: a, b.\n\nTicket: x\nCategory:"
    assert render(tok, fmt, "my card").startswith("[INST] Answer with one of: a, b.\n\nTicket: x")
    # The reference path (Transformers' own apply_chat_template on the same messages) gets the same ids.
    ref = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
    ref = list(ref["input_ids"] if hasattr(ref, "keys") else ref)
    assert tokenize(tok, [render(tok, fmt, "my card")])[0] == ref


def test_a_template_that_takes_a_system_turn_is_left_alone(tiny_qwen_mlx):
    from transformers import AutoTokenizer

    from mlx_slm.text.prompts import PromptFormat, prompt_messages, refuses_system

    tok = AutoTokenizer.from_pretrained(str(tiny_qwen_mlx))
    assert not refuses_system(tok)
    assert prompt_messages(tok, PromptFormat("S", "{text}"), "t")[0] == {"role": "system", "content": "S"}


def test_classify_and_train_on_such_a_model_run_and_record_it(tmp_path, data, mistral_style):
    out = tmp_path / "o.jsonl"
    r = run(["classify", data, "--model", mistral_style, "-o", out, "--save-task", tmp_path / "zs.json"])
    assert r.exit_code == 0, r.output
    assert "refuses a system message" in r.stderr
    assert json.loads(Path(str(out) + ".mlx-slm.json").read_text())["settings"]["system_in_user_turn"] is True
    assert json.loads((tmp_path / "zs.json").read_text())["system_in_user_turn"] is True
    task = tmp_path / "head.json"
    r = run(["train", data, "--model", mistral_style, "--folds", "2", "--layers", "1", "--save-task", task, "-q"])
    assert r.exit_code == 0, r.output
    assert json.loads(task.read_text())["system_in_user_turn"] is True
    r = run(["classify", data, "--task", task, "-o", tmp_path / "o2.jsonl", "-q"])
    assert r.exit_code == 0, r.output


def test_a_template_that_refuses_the_user_turn_too_exits_2_saying_so(tmp_path, data, tiny_qwen_mlx):
    import shutil

    m = tmp_path / "m"
    shutil.copytree(tiny_qwen_mlx, m)
    (m / "chat_template.jinja").write_text("{{ raise_exception('no conversation suits me') }}")
    r = run(["classify", data, "--model", m, "-o", tmp_path / "o.jsonl"])
    assert r.exit_code == 2, r.output
    assert "the model's chat template refused the prompt (no conversation suits me)" in r.output
