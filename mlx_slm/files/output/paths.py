"""Output formats and paths: the format an output is written in, and never writing over an input."""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Sequence
from pathlib import Path

from ...ground.errors import OutputError, UsageError
from ...ground.safefs import refuse_symlink

OUTPUT_FORMATS = ("jsonl", "csv", "tsv", "parquet")


def delimiter(fmt: str) -> str:
    """The field separator of a delimited output format ("csv" or "tsv")."""
    return "\t" if fmt == "tsv" else ","


_EXTENSIONS = {
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "jsonl",
    ".csv": "csv",
    ".tsv": "tsv",
    ".parquet": "parquet",
    ".pq": "parquet",
}


def output_format(path: str | None, explicit: str | None = None) -> str:
    """The output's format: `explicit`, else from the extension; an unknown extension is an error."""
    if explicit:
        if explicit not in OUTPUT_FORMATS:
            raise OutputError(f"output format {explicit!r} is not one of {', '.join(OUTPUT_FORMATS)}")
        return explicit
    if path in (None, "-"):
        return "jsonl"
    ext = Path(path).suffix.lower()
    if ext not in _EXTENSIONS:
        raise OutputError(
            f"-o {path}: unknown output extension {ext or '(none)'!r}; use .jsonl, .csv, .tsv or .parquet, "
            "or say which with --output-format jsonl|csv|tsv|parquet"
        )
    return _EXTENSIONS[ext]


def same_file(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def is_plain_file_target(output: str | None) -> bool:
    """True for an output that is (or will be) a regular file: it gets a lock and a manifest.

    stdout ('-'), /dev/null, a FIFO or a terminal are written as streams, like stdout.
    """
    if output in (None, "-"):
        return False
    try:
        return stat.S_ISREG(os.stat(output).st_mode)
    except FileNotFoundError:
        return True


def check_writable(path: str, what: str = "-o") -> None:
    """Fail before any work if the file cannot be created where it is asked for (or is a link)."""
    refuse_symlink(path, what)
    if os.path.isdir(path):  # --plots names a folder; every other output is a file
        if what != "--plots":
            raise OutputError(f"{what} {path} is a folder: give a file path")
        if not os.access(path, os.W_OK | os.X_OK):
            raise OutputError(f"{what} {path}: the folder is not writable")
        return
    if what != "-o" and os.path.exists(path) and not os.path.isfile(path):  # written whole, then renamed
        raise OutputError(
            f"{what} {path} is not a regular file (a device, a FIFO or a socket): it is written whole and renamed "
            "into place; give a file path"
        )
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise OutputError(f"{what} {path}: the folder {parent} does not exist: create it first")
    if not os.access(parent, os.W_OK):
        raise OutputError(f"{what} {path}: the folder {parent} is not writable")


def check_new_folder(path: str, what: str = "-o") -> None:
    """Fail before any work unless `path` can be a new folder written whole (a checkpoint `export`
    writes): a new folder in an existing, writable one, or an empty folder; never a link, a file
    or a folder that holds anything."""
    refuse_symlink(path, what)
    if os.path.exists(path) and not os.path.isdir(path):
        raise OutputError(f"{what} {path} exists and is not a folder: give a new (or empty) folder")
    if os.path.isdir(path):
        try:
            held = sorted(os.listdir(path))
        except OSError as e:
            raise OutputError(f"{what} {path} cannot be read ({e.strerror}): give a new (or empty) folder") from None
        if held:
            shown = ", ".join(held[:3]) + (" ..." if len(held) > 3 else "")
            raise OutputError(
                f"{what} {path} is a folder that is not empty ({shown}): give a new (or empty) folder; nothing in "
                "it is replaced"
            )
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise OutputError(f"{what} {path}: the folder {parent} does not exist: create it first")
    if not os.access(parent, os.W_OK):
        raise OutputError(f"{what} {path}: the folder {parent} is not writable")


Read = str | None | tuple[str, str | None]  # a path, or (the option that reads it, the path); None: stdin


def refuse_input_as_output(output: str, inputs: Sequence[Read], flag: str = "-o") -> None:
    """Raise if `output` is (a path, symlink or hard link to) any input; checked before opening it.

    An input is a path or (the option that reads it, the path), so the message names the option
    (`runfiles.files_read` gives them all). `None` or '-' stands for stdin: when stdin is a
    regular file (`< FILE`), that file counts."""
    try:
        out_st = os.stat(output)
    except FileNotFoundError:
        return  # a new file cannot be an input (an input must exist)
    for item in inputs:
        what, inp = item if isinstance(item, tuple) else (None, item)
        if inp in (None, "-"):
            try:
                in_st = os.fstat(sys.stdin.fileno())
            except (OSError, ValueError, AttributeError):  # stdin closed or replaced (tests)
                continue
            where = "standard input"
        else:
            try:
                in_st = os.stat(inp)
            except OSError:
                continue
            where = f"the {what} file {inp}" if what and what.startswith("-") else f"the input {inp}"
        if same_file(out_st, in_st):
            link = inp not in (None, "-") and os.path.realpath(inp) != os.path.realpath(output)
            raise OutputError(
                f"{flag} {output} is {where} (the same file{', through a link' if link else ''}): "
                "writing it would destroy the input; choose another output file"
            )


def check_outputs(inputs: Sequence[Read], outputs: Sequence[tuple[str, str | None]]) -> None:
    """Before any work: every file we will write is writable, none is an input, none is another."""
    seen: dict[str, str] = {}
    for flag, path in outputs:
        if not path or path == "-":
            continue
        refuse_input_as_output(path, inputs, flag)  # first: "it is your input" says more than "it is a link"
        check_writable(path, flag)
        real = str(Path(path).resolve())
        if real in seen:
            raise UsageError(f"{flag} {path} is also {seen[real]}: give each output its own file")
        seen[real] = f"{flag} {path}"
