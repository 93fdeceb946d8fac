"""What every command shares (`cli/base.py`): `Command`'s help, in sections, word for word (a refactor
of the CLI must leave what users read unchanged), the escapes in --system and --template, and every
argument's text checked once at the door.

The expected texts are in tests/data/help/ (one file a command, at a 100-column terminal). A change
to an option's help on purpose updates its file: `python tests/cli/test_base.py --write`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from mlx_slm.cli import main
from mlx_slm.text.workload import tickets
from tests.classify_run import run, write_jsonl
from tests.hostile import invoke, refused_cleanly, write

HELP = Path(__file__).resolve().parents[1] / "data" / "help"


def commands() -> list[list[str]]:
    """Every command's path under the group ([] is the group itself)."""
    out: list[list[str]] = [[]]
    for name, cmd in main.commands.items():
        out.append([name])
        if isinstance(cmd, click.Group):
            out += [[name, sub] for sub in cmd.commands]
    return out


def help_text(path: list[str]) -> str:
    result = CliRunner().invoke(main, [*path, "--help"], terminal_width=100)
    assert result.exit_code == 0, result.output
    return result.output


def golden(path: list[str]) -> Path:
    return HELP / ("-".join(["mlx-slm", *path]) + ".txt")


@pytest.mark.parametrize("path", commands(), ids=lambda p: " ".join(p) or "mlx-slm")
def test_help_is_unchanged(path: list[str]) -> None:
    assert help_text(path) == golden(path).read_text(encoding="utf-8")


def test_every_recorded_help_is_a_command() -> None:
    # a command removed or renamed leaves its file behind: that is a change users see too
    assert {golden(p).name for p in commands()} == {p.name for p in HELP.glob("*.txt")}


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    for p in commands():
        golden(p).write_text(help_text(p), encoding="utf-8")


@pytest.mark.parametrize("path", commands(), ids=lambda p: " ".join(p) or "mlx-slm")
def test_every_option_is_in_its_commands_help(path):
    """An option in a section the help does not print would be there and unseen (decide's Answers
    options once were): every option's first flag shows."""
    cmd = main
    for name in path:
        cmd = cmd.commands[name]  # type: ignore[attr-defined]
    text = help_text(path)
    missing = [p.opts[0] for p in cmd.params if isinstance(p, click.Option) and not p.hidden and p.opts[0] not in text]
    assert not missing, missing


TEXTS = [t for t, _ in tickets(12)]


def test_template_and_system_escapes_on_the_command_line(tiny_qwen_mlx, tmp_path):
    inp = tmp_path / "in.jsonl"
    write_jsonl(inp, TEXTS[:3])
    task = tmp_path / "task.json"
    args = ["classify", str(inp), "--model", str(tiny_qwen_mlx), "--labels", "a,b,c", "-q", "-o", str(tmp_path / "o")]
    r = run([*args[:-1], str(tmp_path / "o.jsonl"), "--template", r"Email: {text}\nRoute:", "--system",
             r"Route it.\tBe brief. C:\\new", "--save-task", str(task)])  # fmt: skip
    assert r.exit_code == 0, r.output
    t = json.loads(task.read_text())
    assert t["template"] == "Email: {text}\nRoute:" and t["system"] == "Route it.\tBe brief. C:\\new"
    r = run(["classify", "--help"])
    assert r"\n is a newline" in " ".join(r.output.split())


def test_help_groups_options_into_sections_and_serve_shows_only_its_own():
    out = run(["classify", "--help"]).output
    for title in ("Input", "Output", "Task and model", "Labels and prompt", "Calibration", "Batching", "Scale-out"):
        assert f"\n{title} options:\n" in out
    assert "\nOptions:\n" not in out
    serve = run(["serve", "--help"]).output
    assert "\nServer options:\n" in serve and "\nLimits options:\n" in serve
    for flag in ("--window", "--save-task", "--format", "--id-field", "--id-column", "--shard", "--resume"):
        assert flag not in serve
    # In serve the text and gold fields name --calibration-data's, and say so by their section.
    assert serve.index("Calibration data options:") < serve.index("--text-field")


# All text checked once at the door (issue 33, item 3): an argument that is not UTF-8 and a lone
# surrogate escape in a JSON file a run reads are exit 2 naming the option, or the file and its line.


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
