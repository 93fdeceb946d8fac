"""Reading items and writing predictions: JSONL, CSV, plain text, stdin/stdout.

Every input row becomes exactly one `Row`: either with text, or with an `error` that
names the line and the fix. Nothing is dropped or reordered here; the CLI writes one
output row per input row, in input order.
"""

from __future__ import annotations

import csv
import io
import json
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Sequence

FORMATS = ("jsonl", "csv", "text")


@dataclass
class Row:
    line: int  # 1-based line in the input (CSV: the line where the record starts)
    id: Any
    text: str | None = None
    error: str | None = None


def guess_format(path: str | None, first: bytes = b"") -> str:
    if path and path != "-":
        ext = Path(path).suffix.lower()
        if ext in (".jsonl", ".ndjson", ".json"):
            return "jsonl"
        if ext in (".csv", ".tsv"):
            return "csv"
        return "text"
    return "jsonl" if first.lstrip()[:1] == b"{" else "text"


def _bad_utf8(s: str) -> bool:
    try:
        s.encode("utf-8")
        return False
    except UnicodeEncodeError:
        return True


def _open_binary(path: str | None) -> IO[bytes]:
    return sys.stdin.buffer if path in (None, "-") else open(path, "rb")


def read_rows(
    path: str | None,
    fmt: str | None = None,
    text_field: str = "text",
    id_field: str = "id",
    text_column: str = "text",
    id_column: str | None = "id",
) -> Iterator[Row]:
    """Stream rows from a file or stdin ('-'), checking each one; never raises on bad rows."""
    raw = _open_binary(path)
    if not hasattr(raw, "peek"):  # e.g. a BytesIO standing in for stdin
        raw = io.BufferedReader(raw)  # type: ignore[arg-type]
    fmt = fmt or guess_format(path, raw.peek(256)[:256])  # type: ignore[attr-defined]
    if fmt not in FORMATS:
        raise ValueError(f"unknown input format {fmt!r}; use one of {', '.join(FORMATS)}")
    # surrogateescape keeps bad bytes visible, so each bad row is reported, not the whole file.
    text = io.TextIOWrapper(raw, encoding="utf-8", errors="surrogateescape", newline="")
    if fmt == "jsonl":
        it = _jsonl(text, text_field, id_field)
    elif fmt == "csv":
        it = _csv(text, text_column, id_column, delimiter="\t" if str(path).endswith(".tsv") else ",")
    else:
        it = _text(text)
    yield from _dedupe(it)


def _dedupe(rows: Iterator[Row]) -> Iterator[Row]:
    seen: dict[str, int] = {}
    for row in rows:
        if row.error is None:
            key = json.dumps(row.id) if not isinstance(row.id, str) else row.id
            if key in seen:
                row = Row(row.line, row.id, error=f"line {row.line}: duplicate id {row.id!r} (first seen on line {seen[key]}): ids must be unique")
            else:
                seen[key] = row.line
        yield row


def _lines(f: IO[str]) -> Iterator[tuple[int, str]]:
    for n, line in enumerate(f, 1):
        yield n, line.rstrip("\r\n")


def _jsonl(f: IO[str], text_field: str, id_field: str) -> Iterator[Row]:
    for n, line in _lines(f):
        if _bad_utf8(line):
            yield Row(n, n, error=f"line {n}: invalid UTF-8: save the file as UTF-8")
            continue
        if not line.strip():
            yield Row(n, n, error=f"line {n}: blank line: remove it, or put a JSON object with a {text_field!r} field there")
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            yield Row(n, n, error=f"line {n}: malformed JSON ({e.msg} at column {e.colno}): fix the line")
            continue
        if not isinstance(obj, dict):
            yield Row(n, n, error=f"line {n}: expected a JSON object like {{\"{text_field}\": \"...\"}}, got {type(obj).__name__}")
            continue
        rid = obj.get(id_field, n)
        if not isinstance(rid, (str, int)) or isinstance(rid, bool):
            yield Row(n, n, error=f"line {n}: field {id_field!r} must be a string or an integer")
            continue
        if text_field not in obj:
            fields = ", ".join(map(repr, obj)) or "none"
            yield Row(n, rid, error=f"line {n}: missing field {text_field!r} (fields present: {fields}); use --text-field to name it")
            continue
        t = obj[text_field]
        if not isinstance(t, str):
            yield Row(n, rid, error=f"line {n}: field {text_field!r} must be a string, got {type(t).__name__}")
        elif not t.strip():
            yield Row(n, rid, error=f"line {n}: field {text_field!r} is empty: give the item some text, or drop the row")
        else:
            yield Row(n, rid, t)


def _text(f: IO[str]) -> Iterator[Row]:
    for n, line in _lines(f):
        if _bad_utf8(line):
            yield Row(n, n, error=f"line {n}: invalid UTF-8: save the file as UTF-8")
        elif not line.strip():
            yield Row(n, n, error=f"line {n}: blank line: each line is one item, so remove blank lines")
        else:
            yield Row(n, n, line)


def _csv(f: IO[str], text_column: str, id_column: str | None, delimiter: str = ",") -> Iterator[Row]:
    reader = csv.reader(f, delimiter=delimiter, strict=True)
    try:
        header = next(reader)
    except StopIteration:
        return
    except csv.Error as e:
        yield Row(1, 1, error=f"line 1: malformed CSV header ({e})")
        return
    if text_column not in header:
        raise ValueError(
            f"CSV header has no column {text_column!r} (columns: {', '.join(header)}); use --text-column"
        )
    ti = header.index(text_column)
    ii = header.index(id_column) if id_column and id_column in header else None
    line = reader.line_num + 1
    while True:
        start = line
        try:
            rec = next(reader)
        except StopIteration:
            return
        except csv.Error as e:
            line = reader.line_num + 1
            yield Row(start, start, error=f"line {start}: malformed CSV ({e}): check its quotes")
            continue
        line = reader.line_num + 1
        rid: Any = rec[ii] if ii is not None and ii < len(rec) else start
        if any(_bad_utf8(c) for c in rec):
            yield Row(start, start, error=f"line {start}: invalid UTF-8: save the file as UTF-8")
        elif not rec:
            yield Row(start, start, error=f"line {start}: blank line: remove it")
        elif len(rec) != len(header):
            yield Row(start, rid, error=f"line {start}: {len(rec)} fields where the header has {len(header)}: check commas and quotes")
        elif ii is not None and not rid:
            yield Row(start, start, error=f"line {start}: empty {id_column!r}: give every row an id")
        elif not rec[ti].strip():
            yield Row(start, rid, error=f"line {start}: column {text_column!r} is empty: give the item some text, or drop the row")
        else:
            yield Row(start, rid, rec[ti])


# --------------------------------------------------------------------------- output

def result_record(row: Row, pred: Any | None) -> dict[str, Any]:
    """The output object for one input row (a prediction, or an error row)."""
    if row.error is not None or pred is None or pred.error is not None:
        err = row.error if row.error is not None else (pred.error if pred is not None else "not processed")
        if not err.startswith("line "):
            err = f"line {row.line}: {err}"
        return {"id": row.id, "line": row.line, "error": err}
    rec: dict[str, Any] = {"id": row.id, "label": pred.label, "probs": {k: round(v, 6) for k, v in pred.probs.items()}}
    if pred.truncated:
        rec["truncated"] = True
    return rec


class Writer:
    """JSONL or CSV, to a file or stdout; every record is flushed as it is written."""

    def __init__(self, path: str | None, labels: Sequence[str], append: bool = False):
        self.path = path
        self.labels = list(labels)
        self.fmt = "csv" if path and Path(path).suffix.lower() in (".csv", ".tsv") else "jsonl"
        if path in (None, "-"):
            self.f: IO[str] = sys.stdout
        else:
            new = not (append and os.path.exists(path) and os.path.getsize(path) > 0)
            self.f = open(path, "a" if append else "w", encoding="utf-8", newline="")
            self._csv_header_needed = new
        self.columns = ["id", "label", *(f"p_{lab}" for lab in self.labels), "truncated", "line", "error"]
        if self.fmt == "csv":
            self.csv = csv.DictWriter(self.f, fieldnames=self.columns, delimiter="\t" if str(path).endswith(".tsv") else ",")
            if path in (None, "-") or self._csv_header_needed:
                self.csv.writeheader()

    def write(self, rec: dict[str, Any]) -> None:
        if self.fmt == "jsonl":
            self.f.write(json.dumps(rec, ensure_ascii=False) + "\n")
        else:
            flat = {k: v for k, v in rec.items() if k != "probs"}
            for lab, p in rec.get("probs", {}).items():
                flat[f"p_{lab}"] = p
            self.csv.writerow(flat)
        self.f.flush()

    def close(self) -> None:
        if self.f is not sys.stdout:
            self.f.close()


def done_ids(path: str) -> set[str]:
    """Ids already present in an output file (for --resume); mends a torn last line."""
    p = Path(path)
    if not p.exists() or p.stat().st_size == 0:
        return set()
    data = p.read_bytes()
    if not data.endswith(b"\n"):  # interrupted mid-write: drop the partial last record
        cut = data.rfind(b"\n") + 1
        with open(p, "r+b") as f:
            f.truncate(cut)
        data = data[:cut]
    ids: set[str] = set()
    if p.suffix.lower() in (".csv", ".tsv"):
        reader = csv.DictReader(io.StringIO(data.decode("utf-8")), delimiter="\t" if p.suffix == ".tsv" else ",")
        for rec in reader:
            ids.add(str(rec["id"]))
    else:
        for line in data.decode("utf-8").splitlines():
            if line.strip():
                ids.add(str(json.loads(line)["id"]))
    return ids
