"""Reading an output back: the one reader of the output format. Resume (`scan_output`), merge
(sharding.py) and `eval --predictions` (evaluate.py) all read rows through `read_records`."""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...ground.errors import OutputError
from .paths import delimiter
from .writers import parquet_records, require_pyarrow

_BOM = b"\xef\xbb\xbf"
_BAD_BYTE = re.compile("[\udc80-\udcff]")  # a byte that is not UTF-8, as surrogateescape keeps it


@dataclass(frozen=True)
class Record:
    """One row of an output file, as `read_records` finds it.

    `problem` says why the row is not an output record (None when it is), and `flaw`
    which sort of problem: "utf8", "json", "object", "id" or "fields". The reader does not
    raise for it: each caller raises in its own words, when it chooses (merge checks a
    part's checksum first)."""

    row: int  # 1, 2, ... in file order; 0 is the CSV/TSV header
    line: int  # the file's line where the row starts (Parquet: the row)
    end: int  # byte offset just past the row, its line end included
    raw: bytes  # the row's exact bytes (b"" for Parquet)
    fields: dict[str, Any]  # JSONL: the object; CSV/TSV: column -> text; Parquet: typed values
    values: list[str] | None = None  # CSV/TSV: the fields in order (row 0: the column names)
    torn: bool = False  # the file's last row, cut short (no line end, or it ends inside quotes)
    problem: str | None = None
    flaw: str | None = None


class RecordError(OutputError):
    """An output file that cannot be read on, row by row (broken CSV quoting, not Parquet)."""

    def __init__(self, path: str, row: int, line: int, why: str):
        self.path, self.row, self.line, self.why = path, row, line, why
        super().__init__(f"{path}: row {row} (line {line}) cannot be read ({why})")


def read_records(
    path: str, fmt: str, data: bytes | None = None, *, lenient: bool = False, strict_csv: bool = False
) -> Iterator[Record]:
    """The rows of an output file (`data`: its bytes, read from `path` if not given), in order.

    JSONL: one JSON object with an `id` per line; only `\\n` ends a line, so ids holding
    U+2028 or U+0085 read back as written. CSV/TSV: as Python's csv module writes them
    (a record may span lines inside quotes), a header first (row 0; a UTF-8 BOM before it
    is skipped), every row with the header's number of fields. Parquet: `parquet_records`.
    A torn last row is returned, marked `torn`. `lenient` (for files made by hand, as
    `eval --predictions` takes): blank lines are skipped, a JSONL object needs no id and a
    CSV row may have fewer fields than the header. `strict_csv`: the csv module's strict
    quoting. Raises `RecordError` where the file cannot be read on."""
    if data is None:
        try:
            data = Path(path).read_bytes()
        except OSError as e:
            raise OutputError(f"cannot read back {path} ({e.strerror})") from None
    if fmt == "jsonl":
        return _jsonl_records(data, lenient)
    if fmt == "parquet":
        return _parquet_records(path, data)
    return _csv_records(path, data, delimiter(fmt), lenient, strict_csv)


def _jsonl_records(data: bytes, lenient: bool) -> Iterator[Record]:
    pos = line = row = 0
    while pos < len(data):
        nl = data.find(b"\n", pos)
        end = len(data) if nl < 0 else nl + 1
        raw, body = data[pos:end], data[pos : end if nl < 0 else nl]
        pos, line = end, line + 1
        if lenient and not body.strip():
            continue
        row += 1
        fields: dict[str, Any] = {}
        problem = flaw = None
        try:
            value = json.loads(body.decode("utf-8"))
        except UnicodeDecodeError as e:
            problem, flaw = f"invalid UTF-8 (byte 0x{body[e.start]:02x})", "utf8"
        except RecursionError:
            problem, flaw = "nested too deeply", "json"
        except ValueError as e:
            problem, flaw = str(e), "json"
        else:
            if not isinstance(value, dict):
                problem, flaw = f"a JSON {type(value).__name__}, not an object", "object"
            elif "id" not in value and not lenient:
                problem, flaw = "an object without an id", "id"
            else:
                fields = value
        yield Record(row, line, end, raw, fields, torn=nl < 0, problem=problem, flaw=flaw)


def _csv_records(path: str, data: bytes, delim: str, lenient: bool, strict: bool) -> Iterator[Record]:
    bom = _BOM if data.startswith(_BOM) else b""
    try:
        text, clean = data[len(bom) :].decode("utf-8"), True
    except UnicodeDecodeError:  # kept byte for byte; the rows holding a bad byte say so
        text, clean = data[len(bom) :].decode("utf-8", "surrogateescape"), False
    f = io.StringIO(text, newline="")
    reader = csv.reader(f, delimiter=delim, strict=strict)
    header: list[str] | None = None
    pos, offset, line, row = 0, 0, 1, 0
    while True:
        try:
            values = next(reader)
        except StopIteration:
            return
        except csv.Error as e:
            raise RecordError(path, row + (header is not None), max(reader.line_num, 1), str(e)) from None
        chunk_end = f.tell()
        chunk = text[pos:chunk_end]
        raw = chunk.encode("utf-8", "surrogateescape")
        if header is None:
            raw = bom + raw
        start_line, end = line, offset + len(raw)
        pos, offset, line = chunk_end, end, line + chunk.count("\n")
        torn = chunk_end == len(text) and (not raw.endswith(b"\n") or raw.count(b'"') % 2 == 1)
        problem = flaw = None
        if not clean and (bad := _BAD_BYTE.search(chunk)):
            problem, flaw = f"invalid UTF-8 (byte 0x{ord(bad.group()) - 0xDC00:02x})", "utf8"
        if header is None:
            header = values
            yield Record(0, start_line, end, raw, {}, values, torn, problem, flaw)
            continue
        if lenient and not values:
            continue  # a blank line
        row += 1
        if problem is None and (len(values) > len(header) or (len(values) < len(header) and not lenient)):
            problem, flaw = f"{len(values)} fields where the header has {len(header)}", "fields"
        yield Record(row, start_line, end, raw, dict(zip(header, values)), values, torn, problem, flaw)


def _parquet_records(path: str, data: bytes) -> Iterator[Record]:
    require_pyarrow()
    import pyarrow.parquet as pq  # lazy: pyarrow is optional (the ray extra) and slow to import

    try:
        recs = parquet_records(pq.read_table(io.BytesIO(data)))
    except Exception as e:  # noqa: BLE001 - pyarrow raises several kinds for a bad file
        raise RecordError(path, 1, 1, str(e)) from None
    for i, rec in enumerate(recs, 1):
        yield Record(i, i, len(data), b"", rec)
