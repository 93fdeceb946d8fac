"""What the tests of a classify run from a file share (the job's, the output's, resume's, eval's):
40 workload tickets, the CLI run in-process, the tiny model's options, a JSONL input, and what a
killed run leaves behind."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from mlx_slm.cli import main
from mlx_slm.files.output import manifest_path
from mlx_slm.text.workload import tickets

TEXTS = [t for t, _ in tickets(40)]


def run(args, input=None):
    """`mlx-slm ARGS` in-process (exceptions not caught: a bug shows its traceback)."""
    return CliRunner().invoke(main, args, input=input, catch_exceptions=False)


def cli(model, *extra):
    """The options of a quiet run on `model` with labels a, b, c, then `extra`."""
    return ["--model", str(model), "--labels", "a,b,c", "-q", *extra]


def jsonl_input(path: Path, texts=TEXTS, extra_lines=()) -> Path:
    """`texts` as JSONL rows {"id": "t<i>", "text": ...} at `path`, with `extra_lines` (index, raw line) inserted."""
    lines = [json.dumps({"id": f"t{i}", "text": t}) for i, t in enumerate(texts)]
    for at, line in extra_lines:
        lines.insert(at, line)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def interrupted_copy(full: Path, part: Path, cut: int) -> None:
    """What a run killed after writing `cut` bytes leaves: the prefix and an incomplete manifest."""
    part.write_bytes(full.read_bytes()[:cut])
    doc = json.loads(manifest_path(str(full)).read_text())
    doc["complete"], doc["rows"] = False, None
    manifest_path(str(part)).write_text(json.dumps(doc))


def write_jsonl(path, texts, bad_line_at=None):
    """`texts` as JSONL rows {"id": "t<i>", "text": ...} at `path`, a broken line at `bad_line_at` if given."""
    lines = [json.dumps({"id": f"t{i}", "text": t}) for i, t in enumerate(texts)]
    if bad_line_at is not None:
        lines.insert(bad_line_at, "{broken")
    path.write_text("\n".join(lines) + "\n")
