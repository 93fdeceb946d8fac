"""The writers: JSONL, CSV or TSV row by row (`Writer`), Parquet whole when the run finishes
(`ParquetRows`, a typed table)."""

from __future__ import annotations

import csv
import json
import os
import re
import sys
from collections.abc import Sequence
from typing import IO, Any

from ...ground.errors import MissingExtra, OutputError
from ...ground.safefs import atomic_writer, open_nofollow, refuse_symlink
from ...text.records import flat_record
from .paths import delimiter, is_plain_file_target


class Writer:
    """JSONL, CSV or TSV, to a file or stdout; every record is flushed as it is written.

    Parquet (a file only) is columnar: its rows are kept and written as one table when the
    writer closes on a finished run (`close(complete=True)`), into a temporary file renamed
    into place, so a Parquet output appears only when complete. An older file at the path
    is removed when the writer opens (as the other formats truncate it), so an interrupted
    run (Ctrl-C, SIGKILL) leaves no Parquet file and no rows; Parquet outputs cannot be
    resumed."""

    def __init__(self, path: str | None, columns: Sequence[str], fmt: str = "jsonl", append: bool = False):
        self.fmt = fmt
        self.columns = list(columns)
        if fmt == "parquet":
            if path in (None, "-") or append:
                raise OutputError("Parquet is written to a file (-o FILE.parquet), whole, and cannot be appended to")
            self.parquet: ParquetRows | None = ParquetRows(self.columns)
            self.path = path
            require_pyarrow()
            refuse_symlink(path, "-o")
            try:  # the old output would outlive an interrupted run and pass for this one's
                os.unlink(path)
            except FileNotFoundError:
                pass
            except OSError as e:
                raise OutputError(f"-o {path}: cannot replace the file there ({e.strerror})") from None
            return
        self.parquet = None
        if path in (None, "-"):
            self.f: IO[str] = sys.stdout
            header = True
        else:
            flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC)
            try:
                if is_plain_file_target(path):  # a file: never through a link
                    fd = open_nofollow(path, flags, "-o")
                    header = not (append and os.fstat(fd).st_size > 0)
                    self.f = open(fd, "a" if append else "w", encoding="utf-8", newline="")
                else:  # a stream (/dev/null, a FIFO, a terminal), as stdout
                    header = True
                    self.f = open(path, "w", encoding="utf-8", newline="")
            except OSError as e:
                raise OutputError(f"-o {path}: cannot open it for writing ({e.strerror})") from None
        self.path = path
        if fmt != "jsonl":
            self.csv = csv.DictWriter(self.f, fieldnames=self.columns, delimiter=delimiter(fmt))
            if header:
                try:
                    self.csv.writeheader()
                    self.f.flush()
                except OSError as e:
                    err = self._failed(e)
                    self.close()
                    raise err from None

    def write(self, rec: dict[str, Any]) -> None:
        if self.parquet is not None:
            self.parquet.add(rec)
            return
        try:
            if self.fmt == "jsonl":
                self.f.write(json.dumps(rec, ensure_ascii=False) + "\n")
            else:
                self.csv.writerow(flat_record(rec))
            self.f.flush()
        except BrokenPipeError:
            raise  # the reader went away (`| head`): the CLI ends quietly
        except OSError as e:  # a full disk, a vanished mount
            raise self._failed(e) from None

    def _failed(self, e: OSError) -> OutputError:
        """The error for a write that failed (a full disk: ENOSPC, EFBIG, EDQUOT). The rows flushed
        before it are complete; the part still buffered is dropped here (the descriptor is pointed at
        /dev/null), so closing the file, or Python flushing stdout at exit, cannot raise a second
        time and put a traceback in place of this message."""
        try:
            fd = self.f.fileno()
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, fd)
            os.close(null)
        except (OSError, ValueError, AttributeError):
            pass
        where = self.path if self.path not in (None, "-") else "standard output"
        again = (
            "run again with --resume"
            if self.path not in (None, "-") and is_plain_file_target(self.path)
            else ("run again")
        )
        return OutputError(
            f"cannot write to {where} ({e.strerror or e}); what was written so far is complete row by row: "
            f"free space and {again}"
        )

    def close(self, complete: bool = True) -> None:
        """Close the output. Parquet is written here, and only for a run that finished
        (`complete`): an interrupted one leaves no file."""
        if self.parquet is not None:
            rows, self.parquet = self.parquet, None
            if complete:
                with atomic_writer(self.path, "wb", "-o") as f:  # type: ignore[arg-type]
                    rows.write(f)
            return
        if self.f is not sys.stdout:
            try:
                self.f.close()
            except OSError as e:  # the last flush on a full disk
                err = self._failed(e)
                self.f.close()
                raise err from None


def require_pyarrow() -> Any:
    try:
        import pyarrow  # lazy: optional (the ray extra), slow to import; missing: MissingExtra names the pip command
        import pyarrow.parquet  # noqa: F401  # lazy: as above
    except ImportError:
        raise MissingExtra(
            "Parquet output needs pyarrow: pip install 'mlx-slm[ray]' (or pyarrow), or write .jsonl/.csv"
        ) from None
    return pyarrow


INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


def column_type(c: str) -> str:
    """A flat column's type, "float", "bool", "int" or "string" (the `id` aside): the one rule the
    Parquet writer types its columns by and merge reads CSV/TSV parts back by. Probabilities
    (`p_<label>`, `raw_p_<label>`, a question's `name.p_<label>`, `name.expected`, `name.abstain`)
    are floats, and a one-output head's `score` and raw `logit`; `truncated`, `abstained` and a
    question's `name.abstained` booleans; `line` an integer."""
    if (
        c.startswith(("p_", "raw_p_"))
        or c in ("score", "logit")
        or re.match(r"[^.]+\.(p_|raw_p_|expected$|abstain$)", c)
    ):
        return "float"
    if c in ("truncated", "abstained") or re.fullmatch(r"[^.]+\.abstained", c):
        return "bool"
    return "int" if c == "line" else "string"


def id_columns(ids: Sequence[Any]) -> list[tuple[str, Any]]:
    """The Parquet columns of a run's ids, typed so each reads back as it was given: `id` int64
    when every id is an integer int64 holds, string when every id is a string; when both kinds
    come (or an integer beyond int64: JSON integers have no bound), `id` is a string column and
    `id_is_int` (bool) says which were integers, so `1` and `"1"` stay apart and every id is
    exact (`parquet_records` reads them back). Every Parquet output writes its ids here."""
    pa = require_pyarrow()
    ints = [isinstance(v, int) and not isinstance(v, bool) for v in ids]
    strs = [isinstance(v, str) for v in ids]
    # Not int64 (which would raise at the very end of a run): exact as text, flagged.
    wide = any(i and not INT64_MIN <= v <= INT64_MAX for v, i in zip(ids, ints))
    if not any(strs) and not wide:
        return [("id", pa.array(list(ids), pa.int64()))]
    if not any(ints):
        return [("id", pa.array(list(ids), pa.string()))]
    return [
        ("id", pa.array([None if v is None else str(v) for v in ids], pa.string())),
        ("id_is_int", pa.array([i if v is not None else None for v, i in zip(ids, ints)], pa.bool_())),
    ]


class ParquetRows:
    """Output records gathered into typed columns, written as one Parquet table.

    Types: the ids as `id_columns` types them (line numbers included); `p_*`/`raw_p_*` float64,
    `truncated`/`abstained` bool, `line` int64 (error rows), a one-output head's `score`
    and `logit` float64, `label`, `labels` (a multi-label head's, joined by ';'), `calibration`,
    `error` string; a missing value is null."""

    def __init__(self, columns: Sequence[str]):
        self.columns = list(columns)
        self.data: dict[str, list[Any]] = {c: [] for c in self.columns}

    def add(self, rec: dict[str, Any]) -> None:
        flat = flat_record(rec)
        for c in self.columns:
            self.data[c].append(flat.get(c))

    def __len__(self) -> int:
        return len(self.data[self.columns[0]]) if self.columns else 0

    def table(self) -> Any:
        pa = require_pyarrow()
        arrays, names = [], []
        for c in self.columns:
            vals = self.data[c]
            if c == "id":
                for name, array in id_columns(vals):
                    names.append(name)
                    arrays.append(array)
                continue
            kind = column_type(c)  # a question's columns too: `name.p_<label>`, ... (names hold no dot)
            typ = {"float": pa.float64(), "bool": pa.bool_(), "int": pa.int64()}.get(kind, pa.string())
            if kind == "bool":
                vals = [bool(v) for v in vals]
            arrays.append(pa.array(vals, typ))
            names.append(c)
        return pa.Table.from_arrays(arrays, names=names)

    def write(self, f: Any) -> None:
        import pyarrow.parquet as pq  # lazy: pyarrow is optional (the ray extra) and slow to import

        pq.write_table(self.table(), f)


def parquet_records(table: Any) -> list[dict[str, Any]]:
    """A Parquet output's rows as output records (typed ids restored), for merge and checks."""
    cols = table.to_pydict()
    is_int = cols.pop("id_is_int", None)
    if is_int is not None:
        cols["id"] = [int(v) if flag else v for v, flag in zip(cols["id"], is_int)]
    n = table.num_rows
    return [{k: cols[k][i] for k in cols} for i in range(n)]
