"""Exact resume: the rows already written, checked against the input's ids, and where to
restart (the start of the last unfinished window)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from ...ground.errors import OutputError
from ...ground.safefs import open_nofollow
from .reader import RecordError, read_records


@dataclass(frozen=True)
class Written:
    """One complete output row as found in the file."""

    id: Any  # JSONL: as written (typed); CSV: the string ('' for none)
    error: bool
    end: int  # byte offset just past this row


def scan_output(path: str, fmt: str, columns: Sequence[str]) -> tuple[list[Written], int]:
    """The complete rows of an output file and the byte offset where its header ends.

    A torn last row (the run died mid-write) is not returned."""
    fix = "the file was changed by something else: start again without --resume"
    rows: list[Written] = []
    header_end = 0
    expected = list(columns)
    try:
        for rec in read_records(path, fmt):
            if rec.torn:
                break
            if rec.problem:
                raise OutputError(f"{path}: row {rec.row} is not an mlx-slm output record ({rec.problem}); {fix}")
            if rec.row == 0:
                if rec.values != expected:
                    raise OutputError(
                        f"{path}: its header {rec.values} is not {expected}: not an output of these settings"
                    )
                header_end = rec.end
                continue
            is_error = "error" in rec.fields if fmt == "jsonl" else bool(rec.fields.get("error"))
            rows.append(Written(rec.fields.get("id"), is_error, rec.end))
    except RecordError as e:
        raise OutputError(f"{path}: row {e.row} is not an mlx-slm output record ({e.why}); {fix}") from None
    return rows, header_end


def same_id(written: Any, input_id: Any, fmt: str) -> bool:
    if fmt in ("jsonl", "parquet"):
        return type(written) is type(input_id) and written == input_id
    return written == ("" if input_id is None else str(input_id))


def plan_resume(
    output: str,
    fmt: str,
    columns: Sequence[str],
    rows: Iterator[Any],
    window: int,
    complete_rows: int | None,
    *,
    all_rows: bool = False,
) -> tuple[int, int, int, list[Any]]:
    """Check the written rows against the input's first rows and choose where to restart.

    `complete_rows` is the row count a completed run recorded (None if it did not
    complete). Returns (bytes to keep, rows kept, error rows kept, input rows to run
    again). Rows after the start of the last unfinished window are run again, so that
    each item is batched with the same neighbours as in an uninterrupted run. A window
    holds `window` rows that run (error rows ride along), or `window` rows whatever they
    are (`all_rows`).
    """
    written, header_end = scan_output(output, fmt, columns)
    complete = complete_rows is not None
    if complete and len(written) != complete_rows:
        raise OutputError(
            f"{output} holds {len(written)} complete rows, but the run that wrote it finished with {complete_rows}: "
            "it was changed since; start again without --resume"
        )
    keep, keep_end, valid = 0, header_end, 0
    redo: list[Any] = []
    for i, w in enumerate(written):
        row = next(rows, None)
        if row is None:
            raise OutputError(
                f"{output} holds {len(written)} rows but the input has only {i}: it is not the output of this input "
                "(start again without --resume)"
            )
        if not same_id(w.id, row.id, fmt):
            raise OutputError(
                f"{output}: row {i + 1} has id {w.id!r} where input line {row.line} has id {row.id!r}: "
                "it is not the output of this input (start again without --resume)"
            )
        if all_rows or row.error is None:
            if valid % window == 0 and not complete:  # this row opens a window: a restart point
                keep, keep_end, redo = i, (written[i - 1].end if i else header_end), []
            valid += 1
        redo.append(row)
    if complete or valid % window == 0:  # the last window finished: keep everything
        keep, keep_end, redo = len(written), (written[-1].end if written else header_end), []
    kept_errors = sum(w.error for w in written[:keep])
    return keep_end, keep, kept_errors, redo


def plan_group_resume(
    output: str,
    key: str,
    units: Iterator[Any],
    unit_of: Callable[[Any], tuple[Any, bool]],
    window: int,
    complete_rows: int | None,
) -> tuple[int, int, int, list[Any]]:
    """`plan_resume` for an output whose input units give several rows each (a rerank query's
    ranked documents), JSON lines naming their unit in `key`. `unit_of(unit)`: its (id, alone):
    a unit `alone` (an error) has exactly one row, any other every row in a run of its id (ids
    are unique, so a run ends where the next unit's begins). A window holds `window` units that
    run (`alone` ones ride along). The last unit found may be cut short, so its window is run
    again unless the run completed. Returns (bytes to keep, rows kept, error rows kept, units to
    run again)."""
    fix = "it is not the output of this input (start again without --resume)"
    written = _group_rows(output, key)
    complete = complete_rows is not None
    if complete and len(written) != complete_rows:
        raise OutputError(
            f"{output} holds {len(written)} complete rows, but the run that wrote it finished with {complete_rows}: "
            "it was changed since; start again without --resume"
        )
    seen: list[Any] = []  # the units whose rows were found, in order
    ends: list[int] = []  # the row after each one's last
    starts: list[int] = []  # the units that open a window
    r, valid = 0, 0
    while r < len(written):
        unit = next(units, None)
        if unit is None:
            raise OutputError(f"{output} holds rows past the input's last unit: {fix}")
        uid, alone = unit_of(unit)
        if not same_id(written[r][0], uid, "jsonl"):
            raise OutputError(f"{output}: row {r + 1} has {key} {written[r][0]!r} where the input has {uid!r}: {fix}")
        r += 1
        while not alone and r < len(written) and same_id(written[r][0], uid, "jsonl"):
            r += 1
        if not alone:
            if valid % window == 0:
                starts.append(len(seen))
            valid += 1
        seen.append(unit)
        ends.append(r)
    last_alone = bool(seen) and unit_of(seen[-1])[1]  # an error's one row: it is whole
    if complete or (last_alone and valid % window == 0):  # every window found finished
        keep_units = len(seen)
    else:  # the last unit found may be unfinished: its window runs again
        keep_units = max((s for s in starts if s <= len(seen) - 1), default=0)
    keep_rows = ends[keep_units - 1] if keep_units else 0
    keep_end = written[keep_rows - 1][2] if keep_rows else 0
    return keep_end, keep_rows, sum(w[1] for w in written[:keep_rows]), seen[keep_units:]


def _group_rows(path: str, key: str) -> list[tuple[Any, bool, int]]:
    """The complete JSON lines of a grouped output: (the `key` field's value, an error row, end offset)."""
    fix = "the file was changed by something else: start again without --resume"
    rows: list[tuple[Any, bool, int]] = []
    try:
        for rec in read_records(path, "jsonl", lenient=True):
            if rec.torn:
                break
            if rec.problem:
                raise OutputError(f"{path}: row {rec.row} is not an mlx-slm output record ({rec.problem}); {fix}")
            rows.append((rec.fields.get(key), "error" in rec.fields, rec.end))
    except RecordError as e:
        raise OutputError(f"{path}: row {e.row} is not an mlx-slm output record ({e.why}); {fix}") from None
    return rows


def truncate_to(path: str, size: int) -> None:
    fd = open_nofollow(path, os.O_WRONLY, "-o")
    try:
        os.ftruncate(fd, size)
    finally:
        os.close(fd)
