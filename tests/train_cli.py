"""What the tests of `mlx-slm train` from the command line share (the command's own and none-of-these'):
24 workload tickets as labelled rows, the CLI run in-process, and a one-epoch LoRA's options."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from mlx_slm.cli import main
from mlx_slm.text.workload import tickets

ROWS = tickets(24)
FT = ["--finetune", "lora", "--epochs", "1", "--adapt-layers", "1", "--val-fraction", "0", "-q"]
# A fine-tune that learns something on the tiny model in seconds, on 20 tickets of each team.
FAST = ["--adapt-layers", "2", "--epochs", "3", "--lr", "1e-3", "--head-lr", "1e-2", "--val-fraction", "0.2", "-q"]
TUNE_ROWS = tickets(60)


def run(args, **kw):
    """`mlx-slm ARGS` in-process, each argument as a string (paths welcome)."""
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False, **kw)


def write_rows(path: Path, rows: list[dict]) -> Path:
    """`rows` as JSONL at `path`."""
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def train_file(tmp_path_factory) -> Path:
    """ROWS as a training file {"text", "label"} in a fresh folder."""
    return write_rows(tmp_path_factory.mktemp("train") / "train.jsonl", [{"text": t, "label": g} for t, g in ROWS])


def labelled(n_per: int = 8) -> list[tuple[str, str]]:
    """The first `n_per` workload tickets of each team, as (text, team), team by team."""
    teams = ("billing", "technical", "account")
    by: dict[str, list[str]] = {lab: [] for lab in teams}
    for t, lab in tickets(200):
        if len(by[lab]) < n_per:
            by[lab].append(t)
    return [(t, lab) for lab in teams for t in by[lab]]
