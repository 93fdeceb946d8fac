"""Every command's `--help`, word for word: a refactor of the CLI must leave what users read unchanged.

The expected texts are in tests/data/help/ (one file a command, at a 100-column terminal). A change
to an option's help on purpose updates its file: `python tests/cli/test_help_text.py --write`.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from mlx_slm.cli import main

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
