"""All text checked once at the door (issue 33, item 3): an argument that is not UTF-8 (a byte the
system could not decode reaches Python's argv as a surrogate escape) and a lone surrogate escape
("\\ud800") in a JSON file a run reads are exit 2 naming the option, or the file and its line,
never a traceback from the tokenizer, the manifest or a task file written later.

From hostile round five (issue 33), "text at the door"; was tests/test_text_at_the_door.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import click
import pytest

from mlx_slm.cli import main
from tests.hostile import invoke, refused_cleanly, write

BAD = "x\udcff"  # the byte 0xff as Python's argv holds it


def _text_parameters():
    """(command, parameter) for every text or path parameter of every command."""
    out = []
    for cname, cmd in sorted(main.commands.items()):
        if cname == "bench":  # hands its arguments to the benchmark harness as they are
            continue
        for p in cmd.params:
            if isinstance(p.type, (click.types.StringParamType, click.Path)) and p.name != "help":
                out.append((cname, p))
    return out


PARAMS = _text_parameters()


@pytest.mark.parametrize(("command", "param"), PARAMS, ids=[f"{c}-{p.name}" for c, p in PARAMS])
def test_every_text_argument_that_is_not_utf8_is_refused_naming_it(command, param, tmp_path):
    """The value holds the byte 0xff; a path parameter that must exist gets a real file of that name."""
    value = str(tmp_path / f"f{BAD}.jsonl")
    if isinstance(param.type, click.Path) and param.type.exists:
        if param.type.file_okay:
            write(Path(value), '{"text": "hi", "label": "a"}\n')
        else:
            os.mkdir(value)
    elif not isinstance(param.type, click.Path):
        value = BAD
    args = [value] if isinstance(param, click.Argument) else [max(param.opts, key=len), value]
    positional = {
        "eval": "in.jsonl",
        "train": "in.jsonl",
        "merge": "p.jsonl",
        "convert": "src",
        "export": "in.jsonl",
    }.get(command)
    need = [positional] if positional and not isinstance(param, click.Argument) else []
    required = {
        "train": ("--save-task", "t.json"),
        "merge": ("--output", "m.jsonl"),
        "convert": ("--out", "out"),
        "export": ("--output", "outdir"),
    }
    if command in required and required[command][0] not in param.opts:
        need += list(required[command])
    write(tmp_path / "in.jsonl", '{"text": "hi", "label": "a"}\n')
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        r = invoke([command, *args, *need])
    finally:
        os.chdir(cwd)
    name = max(param.opts, key=len) if isinstance(param, click.Option) else param.human_readable_name
    refused_cleanly(r, name, "not valid UTF-8", "0xff")


def test_a_real_argv_byte_that_is_not_utf8_is_one_line_and_exit_2(tmp_path):
    """As a shell passes it: `--labels $'a\\xff,b'` (the argv bytes decoded by Python itself)."""
    data = write(tmp_path / "in.jsonl", '{"text": "hi"}\n')
    cmd = [sys.executable, "-m", "mlx_slm.cli", "classify", str(data), "--model", str(tmp_path / "m")]
    for extra in (
        [b"--labels", b"a\xff,b"],
        [b"--system", b"s\xfe"],
        [b"-o", os.fsencode(str(tmp_path)) + b"/o\xff.jsonl"],
    ):
        r = subprocess.run([os.fsencode(c) for c in cmd] + extra, capture_output=True, cwd=Path(__file__).parents[2])
        err = r.stderr.decode("utf-8", "replace")
        assert r.returncode == 2 and "Traceback" not in err and "not valid UTF-8" in err, err
    assert not list(tmp_path.glob("o*.jsonl"))


LONE = "\\ud800"  # a JSON escape of half a surrogate pair


@pytest.mark.parametrize(
    ("option", "name", "content", "line"),
    [
        ("--labels-file", "labels.jsonl", f'{{"label": "a"}}\n{{"label": "b{LONE}"}}\n', 2),
        ("--labels-file", "descr.jsonl", f'{{"label": "a"}}\n{{"label": "b", "description": "d{LONE}"}}\n', 2),
        ("--questions", "q.jsonl", f'{{"name": "team", "question": "Which {LONE} team?", "labels": ["a", "b"]}}\n', 1),
        ("--questions", "q.json", f'[\n{{"name": "t", "question": "Which?", "labels": ["a", "b{LONE}"]}}\n]\n', 2),
        ("--examples", "ex.jsonl", f'{{"text": "fine", "label": "a"}}\n{{"text": "x{LONE}", "label": "a"}}\n', 2),
        ("--task", "task.json", None, 3),
    ],
)
def test_a_lone_surrogate_in_a_file_a_run_reads_names_the_file_and_line(option, name, content, line, tmp_path):
    data = write(tmp_path / "in.jsonl", '{"text": "hi"}\n')
    if content is None:  # a task of questions, one question's wording holding the escape
        q = {"name": "team", "question": "Which team?", "kind": "choice", "labels": ["a", "b"]}
        doc = {"format": "mlx-slm.task", "version": 1, "model": "m", "labels": [], "template": "{text}",
               "questions": [q]}  # fmt: skip
        content = json.dumps(doc, indent=0).replace("Which team?", f"Which {LONE} team?")
        line = content[: content.index(LONE)].count("\n") + 1
    f = write(tmp_path / name, content)
    labels = [] if option in ("--questions", "--task") else ["--labels", "a,b"]
    r = invoke(["classify", data, "--model", tmp_path / "no-model", *labels, option, f])
    refused_cleanly(r, option if option != "--task" else "task file", f"{f} line {line}", "surrogate")
    assert "no-model" not in r.output  # before the model is looked for
