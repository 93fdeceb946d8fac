"""The files a run reads (`files/output/runfiles.py`): no output is one of them (issue 33, item 1:
`classify in.jsonl --questions q.jsonl -o q.jsonl` replaced the questions). Every option of every
command that reads a file (found from the commands themselves, so a new one joins) against every
output of that command (-o, --save-task, --json): exit 2 naming both, before anything is read or
written, the file untouched."""

from __future__ import annotations

import os

import click
import pytest

from mlx_slm.cli import main
from mlx_slm.files.output import READS
from tests.hostile import invoke, refused_cleanly, write

OUTPUTS = {"classify": ["--output", "--save-task"], "eval": ["--json", "--save-task"], "train": ["--save-task"],
           "merge": ["--output"], "rerank": ["--output"]}  # fmt: skip
POSITIONAL = {"classify": "INPUT", "eval": "INPUT", "train": "DATA", "merge": "PARTS", "rerank": "INPUT"}


def _reading_options(command: str) -> list[str]:
    """The options of `command` that read a file (a click.Path that must exist, files allowed)."""
    cmd = main.commands[command]
    return [
        max(p.opts, key=len)
        for p in cmd.params
        if isinstance(p, click.Option) and isinstance(p.type, click.Path) and p.type.exists and p.type.file_okay
    ]


CASES = [(c, r, o) for c in OUTPUTS for r in [POSITIONAL[c], *_reading_options(c)] for o in OUTPUTS[c]]


def test_the_table_names_every_option_that_reads_a_file():
    table = {flag for _, flag in READS}
    for command in ("classify", "eval", "serve", "train", "rerank"):
        own = {"--predictions", "--decisions"} if command == "eval" else set()  # eval's own, checked with INPUT
        assert set(_reading_options(command)) - table - own == set(), command


@pytest.mark.parametrize(("command", "reader", "output"), CASES, ids=[f"{c}{r}{o}" for c, r, o in CASES])
def test_no_output_may_be_a_file_the_run_reads(command, reader, output, tmp_path):
    data = write(tmp_path / "data.jsonl", '{"text": "hi", "label": "a"}\n')
    victim = write(tmp_path / "victim.jsonl", '{"precious": true}\n')
    reads = {reader: victim} if reader != POSITIONAL[command] else {}
    positional = victim if reader == POSITIONAL[command] else data
    args = [command, positional]
    for r, path in reads.items():
        args += [r, path]
    args += [output, victim]
    if command == "train" and output != "--save-task":
        args += ["--save-task", tmp_path / "t.json"]
    if command == "merge" and output != "--output":
        args += ["--output", tmp_path / "m.jsonl"]
    r = invoke([*args, "--model", tmp_path / "no-model"] if command != "merge" else args)
    shown = {"--output": "-o"}.get(output, output)
    refused_cleanly(r, f"{shown} {victim} is the", "destroy the input")
    if reader.startswith("--"):
        assert f"the {reader} file" in r.output
    assert victim.read_text() == '{"precious": true}\n'
    assert not (tmp_path / "victim.jsonl.lock").exists() and "no-model" not in r.output


def test_a_link_to_a_read_file_is_that_file(tmp_path):
    """Through a symlink or a hard link too (the rule compares files, not names)."""
    data = write(tmp_path / "in.jsonl", '{"text": "hi"}\n')
    q = write(tmp_path / "q.jsonl", '{"name": "team", "question": "Which?", "labels": ["a", "b"]}\n')
    os.symlink(q, tmp_path / "sym.jsonl")
    os.link(q, tmp_path / "hard.jsonl")
    for out in ("sym.jsonl", "hard.jsonl"):
        r = invoke(["classify", data, "--questions", q, "-o", tmp_path / out, "--model", tmp_path / "m"])
        refused_cleanly(r, "is the --questions file", "destroy the input")
    assert q.read_text().startswith('{"name": "team"')


def test_serve_checks_its_read_files_too(tmp_path):
    """serve writes no file, but its reads go through the same table (a folder given is named)."""
    from mlx_slm.files.output import files_read
    from mlx_slm.jobs.plan import TaskOptions

    o = TaskOptions(labels_file="l.txt", questions_file="q.jsonl", calibration_data="c.jsonl", task_file="t.json")
    got = dict(files_read(o, ("INPUT", "in.jsonl")))
    assert got == {"--labels-file": "l.txt", "--questions": "q.jsonl", "--calibration-data": "c.jsonl",
                   "--task": "t.json", "INPUT": "in.jsonl"}  # fmt: skip
