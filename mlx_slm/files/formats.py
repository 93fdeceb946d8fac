"""What format an input is (JSONL, CSV, text) and its physical lines: the extension's word, else
a sniff of its first lines; `readers` reads it so (see its docstring for the rules).

A JSON array document (its first line "[", "[{...", or a whole array) is JSONL to the sniffer, so
`readers` refuses it as a whole (`JSON_ARRAY_FIX`) rather than read one error row a line, or
lines of text."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from ..ground.textfiles import BOM

FORMATS = ("jsonl", "csv", "text", "parquet")
SNIFF_BYTES = 64 * 1024  # how much of stdin (or a file of unknown type) the format sniffer may buffer
SNIFF_LINES = 32


# --------------------------------------------------------------------------- physical lines

_Line = tuple[int, bytes, bytes]  # (1-based number, content without terminator, terminator b"\n" | b"\r\n" | b"")


def physical_lines(raw: Iterable[bytes]) -> Iterator[_Line]:
    """Split a binary stream on b"\\n" only (iterating a binary file does exactly that), streaming."""
    for n, b in enumerate(raw, 1):
        if n == 1 and b.startswith(BOM):
            b = b[len(BOM) :]
            if not b:  # nothing but a BOM: an empty input
                return
        if b.endswith(b"\r\n"):
            yield n, b[:-2], b"\r\n"
        elif b.endswith(b"\n"):
            yield n, b[:-1], b"\n"
        else:
            yield n, b, b""


# --------------------------------------------------------------------------- format


def is_json_object(s: str) -> bool:
    try:
        return isinstance(json.loads(s), dict)
    except (ValueError, RecursionError):
        return False


def json_array_start(s: str) -> bool:
    """`s` (an input's first line) opens a JSON array document: a lone "[", "[" then an object, or a
    whole array on one line. "[URGENT] charged twice" is text, not this."""
    t = s.strip()
    if not t.startswith("["):
        return False
    if t == "[" or t[1:].lstrip().startswith('{"'):
        return True
    try:
        return isinstance(json.loads(t), list)
    except (ValueError, RecursionError):
        return False


# JSONL is one object a line; a JSON array of them is the common mistake (an export, `json.dump`).
JSON_ARRAY_FIX = (
    "the input is one JSON array, not JSON Lines (one JSON object a line): convert it, e.g. "
    "jq -c '.[]' FILE > FILE.jsonl (plain text whose first line starts so: --format text)"
)


def csv_header(s: str, text_column: str) -> str | None:
    """The delimiter if `s` reads as a CSV header of 2+ columns that names `text_column`."""
    for delim in (",", "\t"):
        try:
            cols = next(csv.reader([s], delimiter=delim, strict=True), [])
        except csv.Error:
            continue
        if len(cols) >= 2 and text_column in cols:
            return delim
    return None


def sniff(lines: Sequence[tuple[int, str]], text_column: str = "text") -> str:
    """jsonl, csv or text from the first lines of an input (numbered, decoded, BOM already dropped)."""
    nonblank = [(n, s) for n, s in lines if s.strip()]
    if not nonblank:
        return "text"
    n0, first = nonblank[0]
    if is_json_object(first):  # not just a leading '{': "{URGENT} charged twice" is text
        return "jsonl"
    if n0 == 1 and json_array_start(first):  # read as JSONL, which refuses it saying how to convert it
        return "jsonl"
    if n0 == 1 and csv_header(first, text_column):
        return "csv"
    objects = sum(is_json_object(s) for _, s in nonblank)
    return "jsonl" if 2 * objects > len(nonblank) else "text"


def guess_format(path: str | None, first: bytes = b"", text_column: str = "text") -> str:
    """The input format from a path's extension, else from the input's first bytes."""
    if path and path != "-":
        ext = Path(path).suffix.lower()
        if ext in (".jsonl", ".ndjson", ".json"):
            return "jsonl"
        if ext in (".csv", ".tsv"):
            return "csv"
        if ext in (".txt", ".text"):
            return "text"
        if ext == ".parquet":
            return "parquet"
    lines = [(n, b.decode("utf-8", "replace")) for n, b, _ in physical_lines(io.BytesIO(first))]
    return sniff(lines, text_column)


KNOWN_EXTENSIONS = (".jsonl", ".ndjson", ".json", ".csv", ".tsv", ".txt", ".text", ".parquet")


def peek_lines(stream: Iterator[bytes], text_column: str) -> tuple[list[tuple[int, str]], Iterator[bytes]]:
    """Read just enough of `stream` to sniff its format; give back those lines and the whole stream.

    Stops at the first non-blank line when that one decides (it is a JSON object, or is line 1
    and a CSV header), else after `SNIFF_LINES` non-blank lines or `SNIFF_BYTES` bytes, or at
    the end of the input. (So a slow pipe of plain text waits for that many lines before the
    first row; `--format text` skips the sniffing.)
    """
    buf: list[bytes] = []
    size = 0
    nonblank = 0
    for b in stream:
        buf.append(b)
        size += len(b)
        if b.strip(b" \t\r\n" + BOM):
            nonblank += 1
            if nonblank == 1:
                s = b.removeprefix(BOM).decode("utf-8", "replace").rstrip("\r\n")
                if is_json_object(s) or (len(buf) == 1 and (csv_header(s, text_column) or json_array_start(s))):
                    break
            if nonblank >= SNIFF_LINES:
                break
        if size >= SNIFF_BYTES:
            break
    decoded = [(n, b.decode("utf-8", "replace")) for n, b, _ in physical_lines(buf)]
    return decoded, chain(buf, stream)


def chain(head: list[bytes], rest: Iterator[bytes]) -> Iterator[bytes]:
    yield from head
    yield from rest
