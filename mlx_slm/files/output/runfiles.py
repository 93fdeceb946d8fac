"""The files a run reads, in one table, joined to the rule that no output may be one of them.

`classify in.jsonl --questions q.jsonl -o q.jsonl` replaced the questions with the output: the
"output may not be an input" rule listed the input and a few options, by hand, in each command,
and each list left out another file. Here every option that reads a file is named once (`READS`,
by the parameter name `jobs.plan.TaskOptions` and the commands share), and `check_run_files` refuses
any output (`-o`, `--save-task`, `--json`, a plot) that is any of them, through any path, symlink,
hard link or redirected stdin, before anything is opened. A file a run writes beside an output
is named here too (`adapters_file`: a fine-tuned task's adapters), and checked with the outputs.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .paths import Read, check_outputs

# Every option of a task that reads a file: (parameter name, the option as typed).
READS: tuple[tuple[str, str], ...] = (
    ("task_file", "--task"),
    ("labels_file", "--labels-file"),
    ("examples_file", "--examples"),
    ("questions_file", "--questions"),
    ("calibration_data", "--calibration-data"),
    ("none_data", "--none-data"),  # train --none-threshold auto's held-out texts
    ("decisions_file", "--decisions"),  # train --decisions' questions (eval reads its own with INPUT)
)


def files_read(options: Any, *more: tuple[str, str | None]) -> list[Read]:
    """(option, path) for every file a run reads: each of `READS` that `options` (a `TaskOptions`,
    or a dict of the parameters) gives, and `more`, the command's own (("INPUT", path),
    ("--predictions", path), ...). INPUT '-' is standard input (a file behind `< FILE` counts)."""
    get = options.get if isinstance(options, dict) else lambda k: getattr(options, k, None)
    reads: list[Read] = [(flag, get(name)) for name, flag in READS if get(name)]
    if get("task_file"):
        reads += task_files(str(get("task_file")))
    reads += [(flag, path) for flag, path in more if path is not None]
    return reads


def task_files(task_file: str) -> list[Read]:
    """The files a task file names that a run reads with it: a fine-tuned task's adapters
    (relative to the task's folder). Read leniently: a task that cannot be read names nothing
    here (the task's own reader says what is wrong with it)."""
    try:
        with open(task_file, "rb") as f:
            section = json.loads(f.read(1 << 24)).get("finetune")
        name = section.get("adapters")
    except Exception:  # noqa: BLE001 - not a task, not JSON, no such section: nothing named
        return []
    if not isinstance(name, str) or not name:
        return []
    side = Path(name) if Path(name).is_absolute() else Path(task_file).resolve().parent / name
    return [("--task's adapters", str(side))]


def check_run_files(reads: Sequence[Read], writes: Sequence[tuple[str, str | None]]) -> None:
    """Before any work: every output is writable, none is a file the run reads, none is another."""
    check_outputs(reads, writes)


ADAPTERS_SUFFIX = ".adapters.safetensors"


def adapters_file(save_task: str | Path, sha256: str) -> Path:
    """Where a fine-tuned task saved at `save_task` keeps its adapters: beside it, named by the
    task file's whole name and the adapters' own sha256 (`task.json.1a2b3c4d5e6f7a8b.adapters.safetensors`).
    A new fine-tune is a new file, so the task being replaced and the adapters it names stay whole
    until the new pair is; `intents.v1` and `intents.v2` (or `t` and `t.json`) never share one; and
    two tasks naming one file name the same bytes. `check_run_files` checks it with the outputs
    (never a file the run reads, nor another output)."""
    p = Path(save_task)
    return p.with_name(f"{p.name}.{sha256[:16]}{ADAPTERS_SUFFIX}")
