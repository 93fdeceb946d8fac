"""Reading items: JSONL, CSV, plain text, from files or stdin (writing is in `files/output/`).

Every input row becomes exactly one `Row`: either with text, or with an `error` that
names the line and the fix. Nothing is dropped or reordered here; the CLI writes one
output row per input row, in input order.

How input is decoded
--------------------
* Bytes are UTF-8. A UTF-8 byte order mark at the start of the input (file or stdin,
  every format) is dropped. A line that is not valid UTF-8 becomes an error row.
* Lines end only at ``\\n`` or ``\\r\\n``. A lone ``\\r``, U+2028, U+2029, U+0085, ``\\x0b`` or
  ``\\x0c`` is part of the line's text, never a line break. A newline at the very end of
  the input ends the last line; it does not start another one: ``b"a\\nb\\n"`` and
  ``b"a\\nb"`` are two lines, ``b"a\\nb\\n\\n"`` is three (the third blank: an error row), and
  an empty input (or one that holds only a BOM) has no rows. A ``\\r`` at the very end of an
  input without a final newline is part of the last line.
* JSONL and text: one row per physical line, so rows out == lines in.
* CSV: the first line is the header (it must name the text column, else `InputError`);
  then one row per record. A record spans several lines only while a quoted field is
  open. A record that cannot be parsed (a stray quote, or a quote still open at the end of
  the input or after `CSV_MAX_RECORD_LINES` lines / `CSV_MAX_RECORD_CHARS` characters)
  becomes an error row for the line it starts on, and reading goes on at the next
  physical line, so one bad quote never swallows the rest of the file. ``Row.line`` is
  the line a record starts on and ``Row.last_line`` the one it ends on; consecutive rows
  cover every line after the header, none lost, none twice. The delimiter is a tab for
  ``.tsv``, a comma for ``.csv``, else whichever of the two makes the header name the
  text column.
* Format: given (``fmt``, the CLI's ``--format``), or from the file's extension
  (``.jsonl``/``.ndjson``/``.json``: JSONL; ``.csv``/``.tsv``, any case: CSV, tab-separated
  for ``.tsv``; ``.txt``/``.text``: text). Stdin and other files are sniffed from their first
  lines (at most `SNIFF_BYTES`): JSONL if the first non-blank line starts with ``{`` or
  most of the sniffed non-blank lines are JSON objects; CSV if the first line is a header
  of two or more columns (comma- or tab-separated) that names the text column; else text.
* A JSON array document (its first line "[", "[{...", or a whole array) read as JSONL is
  refused as a whole (`InputError`, saying how to convert it), not read as one error row a line;
  sniffed, it is JSONL (so refused), not text. "[URGENT] ..." is text.

Ids
---
* An explicit id is taken as given: in JSONL the id field, a non-empty string or an
  integer (not a bool, float, null, list or object: those make the row an error row); in
  CSV the id column, always a string. ``Row.explicit_id`` is True for these.
* A row with no explicit id (no id field in its JSON object, no id column in the CSV,
  every text-format line) gets its 1-based line number, an ``int``, as id.
* Ids compare by type and value: ``1`` and ``"1"`` are different ids.
* Two rows with equal ids (both explicit, or an explicit id equal to another row's
  line-number id) make the later row an error row naming both lines; its id becomes
  None. So the non-None ids of the rows read are all distinct.
* Error rows for lines where no id could be read (malformed JSON, not an object, an
  invalid or empty id, bad UTF-8 in a JSONL or text line or in a CSV id, a blank line, a
  CSV record that does not parse or has the wrong number of fields) have ``id=None``,
  never the line number, so an error row can never collide with a real id. Error rows
  whose id was read (e.g. the text is missing, empty, or not valid UTF-8) keep it, and
  that id counts for the duplicate check like any other.
"""

from __future__ import annotations

import csv
import json
import os
import sys
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Any

from ..ground.errors import UsageError
from ..ground.textfiles import (
    InputError,
    has_lone_surrogate,
    json_error,
    open_problem,
)
from ..text.labels import gold_problem as label_problem
from .formats import (  # noqa: F401 (guess_format, KNOWN_EXTENSIONS, SNIFF_*: read from here too)
    FORMATS,
    JSON_ARRAY_FIX,
    KNOWN_EXTENSIONS,
    SNIFF_BYTES,
    SNIFF_LINES,
    csv_header,
    guess_format,
    json_array_start,
    peek_lines,
    physical_lines,
    sniff,
)
from .labelfiles import read_label_descriptions, read_labels_file  # noqa: F401 (their old home)

CSV_MAX_RECORD_LINES = 10_000  # a quoted field still open after this many lines is reported as unterminated
CSV_MAX_RECORD_CHARS = 1 << 20  # ... or this many characters; also the longest CSV field read
UNIQUE_FIX = "give every row a unique id, or none"


@dataclass
class Row:
    line: int  # 1-based physical line where the record starts
    id: Any  # str | int, or None on an error row whose id could not be read (see the module docstring)
    text: str | None = None
    error: str | None = None
    explicit_id: bool = False  # the id was given in the input (not the line number)
    last_line: int = 0  # physical line where the record ends (CSV records may span lines); 0: same as `line`
    gold: Any = None  # the gold label's field/column, when one was asked for (eval, calibration data);
    # with several fields asked for (eval of several questions, read once), {field: value}
    pair: str | None = None  # a second text (`text_pair`: an NLI hypothesis, a reranker's document), when given

    @property
    def item(self) -> Any:
        """What a classifier takes for this row: its text, or (text, pair)."""
        return self.text if self.pair is None else (self.text, self.pair)

    def __post_init__(self) -> None:
        if not self.last_line:
            self.last_line = self.line


Gold = str | tuple[str, ...] | None  # the gold field read with each row: one, several (a dict a row), or none


def _gold_value(gold: Gold, get: Any) -> Any:
    """A row's gold: `get(field)` for one field, {field: get(field)} for several, None for none."""
    if not gold:
        return None
    return get(gold) if isinstance(gold, str) else {g: get(g) for g in gold}


def _lines(raw: Iterable[bytes]) -> Iterator[tuple[int, str | None, str]]:
    """(line number, decoded text or None if not UTF-8, error detail) per physical line."""
    for n, b, _ in physical_lines(raw):
        try:
            yield n, b.decode("utf-8"), ""
        except UnicodeDecodeError as e:
            yield n, None, f"byte 0x{b[e.start]:02x} at byte {e.start + 1}"


def _utf8_error(n: int, detail: str = "") -> str:
    return f"line {n}: invalid UTF-8{f' ({detail})' if detail else ''}: save the file as UTF-8"


def _open_binary(path: str | None) -> IO[bytes]:
    if path in (None, "-"):
        return sys.stdin.buffer
    try:
        return open(str(path), "rb")
    except OSError as e:
        raise InputError(open_problem(str(path), e, "the input")) from None


# The options that name the text's field and column, as the command run calls them: most commands'
# (--text-field, --text-column), and decide's, whose texts are states (`ReadSpec.text_options`).
TEXT_OPTIONS = ("--text-field", "--text-column")
STATE_OPTIONS = ("--state-field", "--state-column")


@dataclass(frozen=True)
class ReadSpec:
    """How a command reads its inputs, resolved once from its options (`--format`, the text, id
    and pair fields and columns, the gold field): the one value `read_rows` takes.

    `gold`: the gold label's field (or several: each row's gold is then a dict), read once
    (`with_gold`). `pair`: the field (JSONL, Parquet) or column (CSV) of a second text, read where
    present; a CSV column named must be in the header, and with `pair_required` (the field was
    named) a Parquet column in the schema and a JSONL row's field in the row (else its error row);
    `for_input` resolves both for one input from `pair_field`/`pair_column` and `pair_typed`.
    `id_required`: an id column named on the command line must exist. `states` (`decide`): a
    JSONL/Parquet row's text is the first of these fields it has, any JSON value but null.
    `text_options`: the command's options for the text's field and column, which its messages name."""

    fmt: str | None = None
    text_field: str = "text"
    id_field: str = "id"
    text_column: str = "text"
    id_column: str | None = "id"
    gold: Gold = None
    id_required: bool = False
    pair: str | None = None
    pair_required: bool = False
    states: tuple[str, ...] = ()
    pair_field: str = "text_pair"  # JSONL/Parquet: a second text, read where a row has it
    pair_column: str | None = None  # CSV/TSV: the column of a second text (none unless named)
    pair_typed: frozenset[str] = frozenset()  # which of pair_field, pair_column were typed
    gold_field: str = "label"  # the gold label's field a command reads (eval, --calibration-data)
    text_options: tuple[str, str] = TEXT_OPTIONS  # decide: STATE_OPTIONS

    def with_gold(self, gold: Gold = None) -> ReadSpec:
        """This spec reading the gold field(s) too (none given: `gold_field`)."""
        return replace(self, gold=self.gold_field if gold is None else gold)

    def for_input(self, path: str | None) -> ReadSpec:
        """`pair` and `pair_required` for `path`, the one rule of every command that reads a
        second text: the CSV/TSV column named by --pair-column, else the JSONL/Parquet field
        (--pair-field, default text_pair, read where a row has it). A field or column typed must be
        there (a CSV header's or Parquet schema's column, each JSONL row's field, as the readers
        check); an option the input's format cannot use is refused by name."""
        fmt = self.fmt or (guess_format(path, b"", self.text_column) if path not in (None, "-") else None)
        typed = sorted(self.pair_typed)
        flags = ", ".join("--" + k.replace("_", "-") for k in typed)
        if fmt == "text" and typed:
            raise UsageError(f"{flags}: a text file holds one text a line, no second text: drop it")
        if fmt in ("csv", "tsv") and "pair_field" in typed:
            raise UsageError("--pair-field names a JSONL/Parquet field; a CSV/TSV's second text is its --pair-column")
        if fmt in ("csv", "tsv"):
            return replace(self, pair=self.pair_column, pair_required=True)
        return replace(self, pair=self.pair_column or self.pair_field, pair_required=bool(typed))


# `read_rows`' arguments before `ReadSpec`, in their order (a caller may still give them one by one).
_OLD_ARGS = ("fmt", "text_field", "id_field", "text_column", "id_column", "gold", "id_required", "pair")
_OLD_ARGS += ("pair_required", "states")


def read_rows(path: str | None, spec: ReadSpec | str | None = None, *old: Any, **named: Any) -> Iterator[Row]:
    """Stream rows from a file or stdin ('-' or None), read as `spec` says (its fields one by one
    still work), checking each one; never raises on bad rows. `InputError` (a `ValueError`) for the
    input as a whole: an unknown format, or a CSV header that does not name the text column."""
    if not isinstance(spec, ReadSpec):  # the old arguments (format, fields, ...), one by one
        spec = ReadSpec(**dict(zip(_OLD_ARGS, (spec, *old), strict=False)), **named)
    elif old or named:
        raise TypeError("read_rows(path, spec): the reading options are the spec's (ReadSpec), not beside it")
    return _read(path, spec)


def _read(path: str | None, spec: ReadSpec) -> Iterator[Row]:
    fmt, text_column = spec.fmt, spec.text_column
    fields = (
        spec.text_field,
        spec.id_field,
        spec.gold,
        spec.pair,
        spec.pair_required,
        spec.states,
        spec.text_options[0],
    )
    if fmt is not None and fmt not in FORMATS:
        raise InputError(f"unknown input format {fmt!r}; use one of {', '.join(FORMATS)}")
    stdin = path in (None, "-")
    ext = "" if stdin else Path(str(path)).suffix.lower()
    if not stdin and os.path.isdir(str(path)):
        raise InputError(f"the input {path} is a folder, not a file: give the path of a file in it")
    if fmt == "parquet" or (fmt is None and ext == ".parquet"):
        if stdin:
            raise InputError("Parquet cannot be read from standard input: give the file's path")
        yield from _dedupe(_parquet(str(path), *fields))
        return
    raw = _open_binary(path)
    try:
        stream: Iterator[bytes] = iter(raw)
        if fmt is None:
            if ext in KNOWN_EXTENSIONS:
                fmt = guess_format(path, b"", text_column)
            else:
                head, stream = peek_lines(stream, text_column)
                fmt = sniff(head, text_column)
        if fmt == "jsonl":
            it = _jsonl(stream, *fields)
        elif fmt == "csv":
            it = _csv(stream, spec, {".csv": ",", ".tsv": "\t"}.get(ext))
        else:
            it = _text(stream)
        yield from _dedupe(it)
    finally:
        if not stdin:
            raw.close()


# --------------------------------------------------------------------------- ids


def _dedupe(rows: Iterator[Row]) -> Iterator[Row]:
    """Flag a row whose id equals an earlier row's id (by type and value); see the module docstring."""
    seen: dict[tuple[str, Any], tuple[int, bool]] = {}
    for row in rows:
        if row.id is not None:
            key = (type(row.id).__name__, row.id)
            prev = seen.get(key)
            if prev is None:
                seen[key] = (row.line, row.explicit_id)
            else:
                first_line, first_explicit = prev
                if row.explicit_id and first_explicit:
                    why = f"also the id of line {first_line}"
                elif row.explicit_id:
                    why = f"also the id of line {first_line}, which has no id of its own and so is numbered by its line"
                elif first_explicit:
                    why = f"this row has no id, so its id is its line number, but line {first_line} gives that id"
                else:  # two line numbers cannot be equal; kept for completeness
                    why = f"also the id of line {first_line}"
                err = f"line {row.line}: duplicate id {row.id!r} ({why}): {UNIQUE_FIX}"
                if row.error is not None:
                    err += "; also: " + row.error.removeprefix(f"line {row.line}: ")
                row = Row(row.line, None, error=err, explicit_id=row.explicit_id, last_line=row.last_line)
        yield row


# --------------------------------------------------------------------------- JSONL and text


def _jsonl(
    raw: Iterable[bytes],
    text_field: str,
    id_field: str,
    gold: Gold = None,
    pair: str | None = None,
    pair_required: bool = False,
    states: tuple[str, ...] = (),
    option: str = TEXT_OPTIONS[0],
) -> Iterator[Row]:
    for n, line, detail in _lines(raw):
        if line is None:
            yield Row(n, None, error=_utf8_error(n, detail))
            continue
        if not line.strip():
            yield Row(
                n,
                None,
                error=f"line {n}: blank line: remove it, or put a JSON object with a {text_field!r} field there",
            )
            continue
        if n == 1 and json_array_start(line):  # every line would be an error row: the input refused as a whole
            raise InputError(JSON_ARRAY_FIX)
        try:
            obj = json.loads(line)
        except (ValueError, RecursionError) as e:  # JSONDecodeError, an over-long integer, nesting too deep
            yield Row(n, None, error=f"line {n}: malformed JSON ({json_error(e)}): fix the line")
            continue
        if not isinstance(obj, dict):
            yield Row(
                n,
                None,
                error=f'line {n}: expected a JSON object like {{"{text_field}": "..."}}, got {type(obj).__name__}',
            )
            continue
        field = next((f for f in states if f in obj), states[0]) if states else text_field  # decide: state, else text
        yield _record_row(n, obj, _Fields(field, id_field, gold, pair, pair_required, bool(states), option))


def _parquet(
    path: str,
    text_field: str,
    id_field: str,
    gold: Gold = None,
    pair: str | None = None,
    pair_required: bool = False,
    states: tuple[str, ...] = (),
    option: str = TEXT_OPTIONS[0],
) -> Iterator[Row]:
    """Parquet rows (the fields as in JSONL; "line" is the 1-based row number), streamed."""
    try:
        import pyarrow.parquet as pq  # lazy: pyarrow is optional (the ray extra) and slow to import
    except ImportError:
        raise InputError("reading Parquet needs pyarrow: pip install 'mlx-slm[ray]' (or pyarrow)") from None
    try:
        f = pq.ParquetFile(path)
        names = f.schema_arrow.names
    except Exception as e:  # noqa: BLE001 - pyarrow raises several kinds for a bad file
        raise InputError(f"{path} is not a readable Parquet file ({e})") from None
    if states:
        text_field = next((f for f in states if f in names), states[0])
    if text_field not in names:
        raise InputError(f"{path} has no column {text_field!r} (it has {', '.join(names)}): use {option}")
    if pair and pair_required and pair not in names:
        raise InputError(f"{path} has no column {pair!r} (it has {', '.join(names)}): fix --pair-field")
    golds = (gold,) if isinstance(gold, str) else (gold or ())
    cols = [c for c in (id_field, text_field, *golds, pair) if c and c in names]
    n = 0
    batches = f.iter_batches(batch_size=8192, columns=list(dict.fromkeys(cols)))
    while True:
        # A damaged page (bad compression, a wrong length, a bad checksum) surfaces here, as
        # one of several pyarrow (or OS) errors: the file as a whole is refused.
        try:
            batch = next(batches, None)
            records = None if batch is None else batch.to_pylist()
        except Exception as e:  # noqa: BLE001 - OSError, ArrowInvalid, ArrowException, ...
            raise InputError(
                f"{path}: rows from row {n + 1} on cannot be read ({str(e) or 'pyarrow gave no reason'}): "
                "the Parquet file is damaged; write it again"
            ) from None
        if records is None:
            return
        for obj in records:
            n += 1
            yield _record_row(n, obj, _Fields(text_field, id_field, gold, pair, any_value=bool(states), option=option))


def _pair_problem(n: int, v: Any, name: str) -> str | None:
    """Why a second text cannot be read (not a string, not valid Unicode), or None."""
    if v is None or isinstance(v, str) and not has_lone_surrogate(v):
        return None
    if isinstance(v, str):
        return f"line {n}: field {name!r} holds an unpaired surrogate escape (not valid Unicode): fix the text"
    return f"line {n}: field {name!r} (the second text of a pair) must be a string, got {type(v).__name__}"


@dataclass(frozen=True)
class _Fields:
    """How a record's fields are read: the text's and id's, the gold, a second text (`pair`, needed or
    not), `any_value` (decide's states: any JSON value but null), the option naming the text's field."""

    text_field: str
    id_field: str
    gold: Gold
    pair: str | None = None
    pair_required: bool = False
    any_value: bool = False
    option: str = TEXT_OPTIONS[0]


def _record_row(n: int, obj: dict[str, Any], f: _Fields) -> Row:
    """One record (a JSON object, a Parquet row) checked: its Row, or its error row (also when
    `f.pair_required` and a JSON object has no `pair` field)."""
    text_field, id_field, gold, pair = f.text_field, f.id_field, f.gold, f.pair
    pair_required, any_value, option = f.pair_required, f.any_value, f.option
    explicit = id_field in obj
    rid: Any = obj[id_field] if explicit else n
    if explicit:
        if not isinstance(rid, (str, int)) or isinstance(rid, bool):
            kind = "null" if rid is None else type(rid).__name__
            return Row(
                n,
                None,
                error=f"line {n}: field {id_field!r} must be a string or an integer, got {kind}: fix it, or leave the field out to number rows by line",
                explicit_id=True,
            )
        if rid == "":
            return Row(
                n,
                None,
                error=f"line {n}: field {id_field!r} is empty: give the row an id, or leave the field out to number rows by line",
                explicit_id=True,
            )
        if isinstance(rid, str) and has_lone_surrogate(rid):
            return Row(
                n,
                None,
                error=f"line {n}: field {id_field!r} holds an unpaired surrogate escape (not valid Unicode): fix the id",
                explicit_id=True,
            )
    if text_field not in obj:
        fields = ", ".join(map(repr, obj)) or "none"
        fix = f"give the row its state, or name its field with {option}" if any_value else f"use {option} to name it"
        why = f"line {n}: missing field {text_field!r} (fields present: {fields}); {fix}"
        return Row(n, rid, error=why, explicit_id=explicit)
    t = obj[text_field]
    if any_value and t is not None and not isinstance(t, str):
        return Row(n, rid, t, explicit_id=explicit, gold=_gold_value(gold, obj.get))
    if not isinstance(t, str):
        return Row(
            n,
            rid,
            error=f"line {n}: field {text_field!r} must be a string"
            + (", an object or an array (the state), got null" if any_value else f", got {type(t).__name__}"),
            explicit_id=explicit,
        )
    elif not t.strip():
        return Row(
            n,
            rid,
            error=f"line {n}: field {text_field!r} is empty: give the item some text, or drop the row",
            explicit_id=explicit,
        )
    elif has_lone_surrogate(t):
        return Row(
            n,
            rid,
            error=f"line {n}: field {text_field!r} holds an unpaired surrogate escape (not valid Unicode): fix the text",
            explicit_id=explicit,
        )
    second = obj.get(pair) if pair else None
    why = _pair_problem(n, second, str(pair))
    if pair and pair_required and pair not in obj:
        fields = ", ".join(map(repr, obj))
        why = (
            f"line {n}: no field {pair!r} (fields present: {fields}): give the row its second text, or fix --pair-field"
        )
    if why:
        return Row(n, rid, error=why, explicit_id=explicit)
    return Row(n, rid, t, explicit_id=explicit, gold=_gold_value(gold, obj.get), pair=second or None)


def _text(raw: Iterable[bytes]) -> Iterator[Row]:
    for n, line, detail in _lines(raw):
        if line is None:
            yield Row(n, None, error=_utf8_error(n, detail))
        elif not line.strip():
            yield Row(n, None, error=f"line {n}: blank line: each line is one item, so remove blank lines")
        else:
            yield Row(n, n, line)


# --------------------------------------------------------------------------- CSV

# The csv module ends a record at any "\r" outside quotes; our lines end only at "\n"/"\r\n",
# so a lone "\r" inside a line is swapped for a stand-in while parsing and put back after.
# U+D800 cannot come out of decoding (surrogateescape only makes U+DC80..U+DCFF).
_CR = "\ud800"


class _Source:
    """Decoded physical lines with push-back, for re-reading after a record fails to parse."""

    def __init__(self, raw: Iterable[bytes]):
        self.it = physical_lines(raw)
        self.back: deque[tuple[int, str, str]] = deque()

    def next(self) -> tuple[int, str, str] | None:
        if self.back:
            return self.back.popleft()
        nxt = next(self.it, None)
        if nxt is None:
            return None
        n, b, term = nxt
        return n, b.decode("utf-8", "surrogateescape"), term.decode("ascii")

    def push_back(self, lines: list[tuple[int, str, str]]) -> None:
        self.back.extendleft(reversed(lines))


@dataclass
class _Record:
    line: int
    last_line: int
    fields: list[str] | None  # None: did not parse
    error: str = ""


def _next_record(src: _Source, delimiter: str) -> _Record | None:
    """Parse one CSV record from the next physical line on, joining lines only while a quote is open."""
    first = src.next()
    if first is None:
        return None
    taken = [first]
    size = len(first[1])
    why_stopped = ""

    def feed() -> Iterator[str]:
        nonlocal size, why_stopped
        yield first[1].replace("\r", _CR) + first[2]
        while True:
            if len(taken) >= CSV_MAX_RECORD_LINES or size >= CSV_MAX_RECORD_CHARS:
                why_stopped = f"still open after {len(taken):,} lines ({size:,} characters)"
                return
            nxt = src.next()
            if nxt is None:
                why_stopped = "still open at the end of the input"
                return
            taken.append(nxt)
            size += len(nxt[1])
            yield nxt[1].replace("\r", _CR) + nxt[2]

    n = first[0]
    try:
        rec = next(csv.reader(feed(), delimiter=delimiter, strict=True), [])
    except csv.Error as e:
        src.push_back(taken[1:])
        if "field larger than field limit" in str(e):
            msg = (
                f"line {n}: a field longer than {csv.field_size_limit():,} characters "
                f"(or a quote opened on this line and never closed): shorten it, or close the quote"
            )
        elif why_stopped:
            msg = (
                f"line {n}: a quoted field opened on this line is never closed ({why_stopped}): "
                f'close the quote, or write a quote inside a quoted field as ""; reading went on at line {n + 1}'
            )
        elif len(taken) > 1:
            msg = (
                f"line {n}: malformed CSV ({e} on line {taken[-1][0]}, inside a quoted field opened on line {n}): "
                f'check its quotes (a quote inside a quoted field is written ""); reading went on at line {n + 1}'
            )
        else:
            msg = f'line {n}: malformed CSV ({e}): check its quotes (a quote inside a quoted field is written "")'
        return _Record(n, n, None, msg)
    return _Record(n, taken[-1][0], [f.replace(_CR, "\r") for f in rec])


def _csv(raw: Iterable[bytes], spec: ReadSpec, delimiter: str | None = ",") -> Iterator[Row]:
    """CSV rows; `delimiter` None: comma or tab, whichever makes the header name the text column."""
    text_column, id_column, gold, pair = spec.text_column, spec.id_column, spec.gold, spec.pair
    if csv.field_size_limit() < CSV_MAX_RECORD_CHARS:  # the csv module's default is 128 KiB
        csv.field_size_limit(CSV_MAX_RECORD_CHARS)
    src = _Source(raw)
    first = src.next()
    if first is None:
        return
    if delimiter is None:
        delimiter = csv_header(first[1], text_column) or ","
    src.push_back([first])
    head = _next_record(src, delimiter)
    assert head is not None
    if head.fields is None:
        raise InputError(f"malformed CSV header: {head.error}")
    header = head.fields
    ti, ii, gi = _csv_columns(header, delimiter, text_column, id_column, gold, spec.id_required, spec.text_options[1])
    if pair and pair not in header:
        raise InputError(
            f"CSV header has no column {pair!r} (columns: {', '.join(map(repr, header))}): fix --pair-column"
        )
    pi = header.index(pair) if pair else None
    while True:
        nxt = src.next()
        if nxt is None:
            return
        n = nxt[0]
        if not nxt[1].strip():
            yield Row(n, None, error=f"line {n}: blank line: remove it")
            continue
        src.push_back([nxt])
        r = _next_record(src, delimiter)
        assert r is not None
        row = _csv_row(n, r, len(header), (ti, ii, gi), spec)
        if pi is not None and row.error is None and r.fields is not None:
            row.pair = r.fields[pi] or None
        yield row


def _csv_columns(
    header: list[str],
    delimiter: str,
    text_column: str,
    id_column: str | None,
    gold: Gold,
    id_required: bool,
    option: str = TEXT_OPTIONS[1],
) -> tuple[int, int | None, dict[str, int]]:
    """The text, id and gold columns' indices in a CSV header (id and gold None when absent);
    a header that cannot be read this way is an `InputError` naming the fix (`option`: the
    command's option naming the text's column)."""
    if any(has_lone_surrogate(c) for c in header):
        raise InputError(_utf8_error(1) + " (in the CSV header)")
    if text_column not in header:
        raise InputError(
            f"CSV header has no column {text_column!r} (columns: {', '.join(map(repr, header)) or 'none'}, "
            f"read as {'tab' if delimiter == chr(9) else 'comma'}-separated); use {option}"
            + (" (decide reads a 'state' column, else 'text')" if option == STATE_OPTIONS[1] else "")
        )
    for col in (text_column, id_column):
        if col and header.count(col) > 1:
            raise InputError(f"CSV header names column {col!r} {header.count(col)} times: rename all but one")
    if id_required and id_column and id_column not in header:
        raise InputError(
            f"CSV header has no column {id_column!r} (columns: {', '.join(map(repr, header))}); "
            "name the id column with --id-column, or leave the option out to number rows by line"
        )
    ti = header.index(text_column)
    ii = header.index(id_column) if id_column and id_column in header else None
    golds = (gold,) if isinstance(gold, str) else (gold or ())
    gi = {g: header.index(g) for g in golds if g in header}  # each gold field's column (absent: no gold)
    return ti, ii, gi


def _csv_row(n: int, r: _Record, width: int, columns: tuple[int, int | None, dict[str, int]], spec: ReadSpec) -> Row:
    """One CSV record starting at line `n` (`r`, from `_next_record`) as a `Row`, or an error
    row naming its line; `width`: the header's number of columns; `columns`: the text's, the
    id's and each gold field's index (`_csv_columns`)."""
    (ti, ii, gi), text_column, id_column = columns, spec.text_column, spec.id_column
    span = f"line {n}" if r.last_line == n else f"lines {n}-{r.last_line}"
    if r.fields is None:
        return Row(n, None, error=r.error, last_line=r.last_line)
    rec = r.fields
    if len(rec) != width:
        return Row(
            n,
            None,
            error=f"{span}: {len(rec)} fields where the header has {width}: check commas and quotes",
            last_line=r.last_line,
        )
    explicit = ii is not None
    rid: Any = rec[ii] if ii is not None else n
    if ii is not None and has_lone_surrogate(rec[ii]):
        return Row(
            n, None, error=_utf8_error(n) + f" (in column {id_column!r})", explicit_id=True, last_line=r.last_line
        )
    if ii is not None and not rid:
        return Row(
            n,
            None,
            error=f"line {n}: empty {id_column!r}: give every row an id",
            explicit_id=True,
            last_line=r.last_line,
        )
    if any(has_lone_surrogate(c) for c in rec):
        return Row(n, rid, error=_utf8_error(n), explicit_id=explicit, last_line=r.last_line)
    if not rec[ti].strip():
        return Row(
            n,
            rid,
            error=f"line {n}: column {text_column!r} is empty: give the item some text, or drop the row",
            explicit_id=explicit,
            last_line=r.last_line,
        )
    gold_of = _gold_value(spec.gold, lambda g: rec[gi[g]] if g in gi else None)
    return Row(n, rid, rec[ti], explicit_id=explicit, last_line=r.last_line, gold=gold_of)


def gold_problem(row: Row, labels: Sequence[str], field: str) -> str | None:
    """Why a labelled row cannot be used (eval, calibration data), or None if it can: the
    gold-label rule of `labels.gold_problem`, on the gold as text, worded with the row's line.
    Only a gold that is absent is "no gold label"; a blank or spaced one is named by its repr."""
    if label_problem(None if row.gold is None else str(row.gold), labels) is None:
        return None
    if row.gold is None:
        return f"line {row.line}: no gold label in {field!r}: add it, or name its field with --gold-field"
    return f"line {row.line}: gold label {row.gold!r} is not one of the labels {list(labels)}: fix it, or add the label"
