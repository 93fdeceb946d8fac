"""The readers (`files/readers.py`): JSONL, CSV, text lines and Parquet in input order with error rows
in place, property-based tests (Hypothesis), --pair-field/--pair-column read the same way by every
reader (issue 40), and one regression test per case of issue 10 (items 4, 5) and per class of
hostile input file (a one-line error naming the file, the line or field and the fix)."""

import csv
import io
import json
import os
import sys

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mlx_slm.cli import main
from mlx_slm.files.readers import STATE_OPTIONS, TEXT_OPTIONS, ReadSpec, guess_format, read_rows
from mlx_slm.ground.errors import UserError
from mlx_slm.ground.textfiles import BOM, InputError
from tests import hostile
from tests.hostile import invoke, refused, refused_cleanly, write

# READER_EXAMPLES=5000 for a longer search.
SETTINGS = settings(
    max_examples=int(os.environ.get("READER_EXAMPLES", 150)),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)


def read_bytes(data: bytes, fmt: str | None = None, name: str | None = None, tmp_path=None, **kw):
    """Rows of `data`, read from a file called `name`, or from stdin when `name` is None."""
    if name is not None:
        p = tmp_path / name
        p.write_bytes(data)
        return list(read_rows(str(p), fmt, **kw))
    old = sys.stdin
    sys.stdin = io.TextIOWrapper(io.BytesIO(data), encoding="utf-8")
    try:
        return list(read_rows("-", fmt, **kw))
    finally:
        sys.stdin = old


def physical_lines(data: bytes) -> list[bytes]:
    """The documented rule: drop a leading BOM; split on b"\\n"; a final newline ends the last line
    (it does not start an empty one); a b"\\r" right before a b"\\n" belongs to the line break."""
    body = data.removeprefix(BOM)
    if not body:
        return []
    parts = body.split(b"\n")
    if body.endswith(b"\n"):
        parts.pop()
        return [p.removesuffix(b"\r") for p in parts]
    return [p.removesuffix(b"\r") for p in parts[:-1]] + [parts[-1]]


def check_common(rows, first_line: int = 1):
    assert all((r.text is None) != (r.error is None) for r in rows), "every row has text or an error, not both"
    assert all(r.error.startswith(f"line {r.line}:") or r.error.startswith(f"lines {r.line}-") for r in rows if r.error)
    lines = [r.line for r in rows]
    assert lines == sorted(set(lines)), "rows in order, strictly increasing lines"
    ids = [(type(r.id), r.id) for r in rows if r.id is not None]
    assert len(ids) == len(set(ids)), "the ids rows carry are unique"
    assert all(r.id is None or (isinstance(r.id, (str, int)) and not isinstance(r.id, bool)) for r in rows)


# --------------------------------------------------------------------------- inputs as arbitrary byte lines

no_nl = st.binary(max_size=40).map(lambda b: b.replace(b"\n", b""))
json_line = st.fixed_dictionaries(
    {},
    optional={
        "id": st.one_of(st.integers(-3, 30), st.text(max_size=4), st.none(), st.booleans(), st.floats(allow_nan=False)),
        "text": st.one_of(st.text(max_size=10), st.integers()),
    },
).map(lambda d: json.dumps(d, ensure_ascii=False).encode())
csv_fragment = st.lists(
    st.sampled_from([b'"', b",", b"\r", b"a", b" ", b'""', b"x,y", b"\xff", b"\xe2\x80\xa8", b"\xc2\x85", b"1"]),
    max_size=8,
).map(b"".join)
line_bytes = st.one_of(no_nl, json_line, csv_fragment, st.just(b""))


@st.composite
def byte_inputs(draw, header: bytes | None = None):
    lines = draw(st.lists(line_bytes, max_size=12))
    if header is not None:
        lines = [header, *lines]
    sep = draw(st.sampled_from([b"\n", b"\r\n"]))
    data = sep.join(lines) + (sep if lines and draw(st.booleans()) else b"")
    return (BOM if draw(st.booleans()) else b"") + data


@SETTINGS
@given(byte_inputs())
def test_text_one_row_per_physical_line(tmp_path, data):
    rows = read_bytes(data, "text", "in.txt", tmp_path)
    expected = physical_lines(data)
    assert len(rows) == len(expected)
    assert [r.line for r in rows] == list(range(1, len(expected) + 1))
    check_common(rows)
    for r, b in zip(rows, expected):
        try:
            s = b.decode("utf-8")
        except UnicodeDecodeError:
            s = None
        if s is not None and s.strip():
            assert (r.id, r.text, r.explicit_id) == (r.line, s, False)
        else:
            assert r.error and r.id is None


@SETTINGS
@given(byte_inputs())
def test_jsonl_one_row_per_physical_line(tmp_path, data):
    rows = read_bytes(data, "jsonl", "in.jsonl", tmp_path)
    expected = physical_lines(data)
    assert len(rows) == len(expected)
    assert [r.line for r in rows] == list(range(1, len(expected) + 1))
    check_common(rows)
    for r, b in zip(rows, expected):
        try:
            obj = json.loads(b.decode("utf-8"))
        except ValueError:
            obj = None
        if not isinstance(obj, dict):
            assert r.error and r.id is None  # no id could be read
        elif r.text is not None:
            assert r.text == obj["text"]
            assert r.id == obj.get("id", r.line) and r.explicit_id == ("id" in obj)


@SETTINGS
@given(byte_inputs(header=b"id,text"), st.sampled_from(["in.csv", "in.CSV", None]))
def test_csv_rows_cover_every_line(tmp_path, data, name):
    rows = read_bytes(data, "csv" if name is None else None, name, tmp_path)
    n = len(physical_lines(data))  # line 1 is the header
    check_common(rows)
    assert len(rows) <= n - 1
    if n > 1:  # consecutive rows cover lines 2..n, none lost, none twice
        assert rows[0].line == 2 and rows[-1].last_line == n
        assert all(b.line == a.last_line + 1 for a, b in zip(rows, rows[1:]))
        assert all(r.last_line >= r.line for r in rows)
    else:
        assert rows == []
    for r in rows:
        if r.error is None:
            assert isinstance(r.id, str) and r.explicit_id and r.text.strip()
        if r.last_line > r.line:  # a record spans lines only inside a quoted field
            assert r.error is not None or "\n" in r.id + r.text


@SETTINGS
@given(byte_inputs(header=b"id,text"))
def test_csv_lines_without_quotes_are_one_row_each(tmp_path, data):
    data = data.replace(b'"', b"'")
    rows = read_bytes(data, None, "in.csv", tmp_path)
    assert [r.line for r in rows] == list(range(2, len(physical_lines(data)) + 1))


@SETTINGS
@given(byte_inputs())
def test_sniffed_stdin_never_raises(data):
    rows = read_bytes(data)
    check_common(rows)
    assert len(rows) <= len(physical_lines(data))


# --------------------------------------------------------------------------- round trips

nonblank_text = st.text(min_size=1, max_size=30).filter(lambda t: t.strip())
ident = st.one_of(st.integers(), st.text(min_size=1, max_size=12))


@SETTINGS
@given(
    st.lists(st.tuples(ident, nonblank_text), max_size=15, unique_by=lambda p: (type(p[0]), p[0])),
    st.booleans(),
    st.booleans(),
    st.sampled_from(["\n", "\r\n"]),
)
def test_jsonl_round_trip(tmp_path, items, bom, trailing, nl):
    data = nl.join(json.dumps({"id": i, "text": t}, ensure_ascii=False) for i, t in items)
    data = ("\ufeff" if bom else "") + data + (nl if trailing and items else "")
    for name in ("in.jsonl", None):  # a file, and stdin (sniffed)
        rows = read_bytes(data.encode(), None, name, tmp_path)
        assert [(r.id, type(r.id), r.text) for r in rows] == [(i, type(i), t) for i, t in items]
        assert all(r.explicit_id and r.error is None for r in rows)


@SETTINGS
@given(st.lists(st.tuples(st.one_of(st.none(), ident), nonblank_text), max_size=15))
def test_jsonl_ids_optional_and_collisions_flagged(tmp_path, items):
    data = "\n".join(
        json.dumps({"text": t} if i is None else {"id": i, "text": t}, ensure_ascii=False) for i, t in items
    )
    rows = read_bytes(data.encode(), "jsonl", "in.jsonl", tmp_path)
    seen: dict = {}
    assert len(rows) == len(items)
    for n, (r, (i, t)) in enumerate(zip(rows, items), 1):
        rid = n if i is None else i
        key = (type(rid), rid)
        assert r.explicit_id == (i is not None)
        if key in seen:
            assert r.id is None and f"duplicate id {rid!r}" in r.error and f"line {seen[key]}" in r.error
            assert "give every row a unique id, or none" in r.error
        else:
            seen[key] = n
            assert (r.id, type(r.id), r.text) == (rid, type(rid), t)


@SETTINGS
@given(
    st.lists(st.tuples(st.text(min_size=1, max_size=12), nonblank_text), max_size=15, unique_by=lambda p: p[0]),
    st.booleans(),
    st.sampled_from(["\n", "\r\n"]),
    st.sampled_from([",", "\t"]),
)
def test_csv_round_trip(tmp_path, items, bom, nl, delim):
    buf = io.StringIO(newline="")
    # With "\n" line ends, Python 3.11's writer leaves a field with "\r" unquoted, and a text ending in
    # "\r" in the last column then reads as a "\r\n" line end: the file itself is ambiguous. Quote all.
    w = csv.writer(buf, delimiter=delim, lineterminator=nl, quoting=csv.QUOTE_ALL if nl == "\n" else csv.QUOTE_MINIMAL)
    w.writerow(["id", "text"])
    w.writerows(items)
    data = (BOM if bom else b"") + buf.getvalue().encode()
    rows = read_bytes(data, None, "in.csv" if delim == "," else "in.tsv", tmp_path)
    assert [(r.id, r.text) for r in rows] == items
    assert all(r.explicit_id and r.error is None for r in rows)
    assert read_bytes(data, None, None) == rows  # stdin: sniffed as CSV, delimiter found from the header


# --------------------------------------------------------------------------- regressions (issue 10, items 4 and 5)


def test_bom_on_jsonl_first_record(tmp_path):
    data = BOM + b'{"id": "a", "text": "first"}\n{"id": "b", "text": "second"}\n'
    for name in ("in.jsonl", None):
        rows = read_bytes(data, None, name, tmp_path)
        assert [(r.id, r.text, r.error) for r in rows] == [("a", "first", None), ("b", "second", None)]


def test_bom_on_csv_header_keeps_the_id_column(tmp_path):
    data = BOM + b"id,text\nx7,hello\ny9,world\n"
    for name in ("in.csv", None):
        rows = read_bytes(data, None, name, tmp_path)
        assert [(r.id, r.text, r.explicit_id) for r in rows] == [("x7", "hello", True), ("y9", "world", True)]


def test_bom_only_input_has_no_rows(tmp_path):
    for fmt in ("jsonl", "csv", "text"):
        assert read_bytes(BOM, fmt, None) == []
        assert read_bytes(BOM, fmt, "in.txt", tmp_path) == []


@pytest.mark.parametrize("head", [b"\n", b"   \n\n", b"\r\n", BOM + b"\n", b"oops, not json\n"])
def test_stdin_jsonl_detected_past_a_blank_or_bad_first_line(head):
    data = head + b"".join(b'{"id": %d, "text": "item %d"}\n' % (i, i) for i in range(10))
    rows = read_bytes(data)
    assert [r.text for r in rows if r.error is None] == [f"item {i}" for i in range(10)]
    assert all(r.error and r.id is None for r in rows[: len(rows) - 10])


def test_stdin_sniffing():
    assert read_bytes(b"just some words\nmore words\n")[1].text == "more words"
    assert [r.text for r in read_bytes(b"a,text\n1,x\n")] == ["x"]  # a CSV header naming the text column
    assert [r.text for r in read_bytes(b"text\nsolo\n")] == ["text", "solo"]  # one column is not sniffed as CSV
    assert [r.text for r in read_bytes(b"a,text\n1,x\n", "text")] == ["a,text", "1,x"]  # --format wins
    assert guess_format("-", b'\n{"text": "x"}\n') == "jsonl"
    assert guess_format("x.TSV") == "csv" and guess_format("x.Jsonl") == "jsonl" and guess_format("x.txt") == "text"


def test_file_of_unknown_type_is_sniffed(tmp_path):
    rows = read_bytes(b'{"id": 1, "text": "a"}\n', None, "data", tmp_path)
    assert (rows[0].id, rows[0].text) == (1, "a")


def test_tsv_extension_any_case(tmp_path):
    rows = read_bytes(b"id\ttext\n1\thello, world\n", None, "in.TSV", tmp_path)
    assert [(r.id, r.text) for r in rows] == [("1", "hello, world")]


@pytest.mark.parametrize("fmt,name", [("text", "in.txt"), ("jsonl", "in.jsonl"), ("csv", "in.csv")])
def test_lone_cr_and_unicode_breaks_stay_inside_one_item(tmp_path, fmt, name):
    text = "one\rtwo\u2028three\u2029four\x85five\x0bsix\x0cseven"
    if fmt == "text":
        data = text.encode() + b"\nnext\r\n"
    elif fmt == "jsonl":
        data = (json.dumps({"text": text}, ensure_ascii=False) + "\n" + json.dumps({"text": "next"}) + "\r\n").encode()
    else:
        data = b"id,text\n" + b"1," + text.encode() + b"\n2,next\r\n"
    rows = read_bytes(data, None, name, tmp_path)
    assert [r.text for r in rows] == [text, "next"]


def test_unicode_line_separators_in_jsonl_ids_round_trip(tmp_path):
    ids = ["a\u2028b", "c\x85d", "e\rf", "g\u2029h"]
    data = "".join(json.dumps({"id": i, "text": "t"}, ensure_ascii=False) + "\n" for i in ids).encode()
    assert [r.id for r in read_bytes(data, None, "in.jsonl", tmp_path)] == ids


def test_unterminated_csv_quote_is_one_error_row_and_later_rows_survive(tmp_path):
    data = b'id,text\n1,fine\n2,"never closed\n3,still here\n4,and here\n'
    rows = read_bytes(data, None, "in.csv", tmp_path)
    assert [r.line for r in rows] == [2, 3, 4, 5]
    assert (rows[0].id, rows[0].text) == ("1", "fine")
    assert rows[1].id is None and rows[1].error.startswith("line 3: a quoted field opened on this line is never closed")
    assert "reading went on at line 4" in rows[1].error
    assert [(r.id, r.text) for r in rows[2:]] == [("3", "still here"), ("4", "and here")]


def test_csv_quote_open_past_the_cap_is_reported(tmp_path, monkeypatch):
    import mlx_slm.files.readers as mio

    monkeypatch.setattr(mio, "CSV_MAX_RECORD_LINES", 5)
    data = b'id,text\n1,"open\n' + b"".join(b"%d,x\n" % i for i in range(2, 12)) + b'99,"closed\nhere"\n'
    rows = read_bytes(data, None, "in.csv", tmp_path)
    assert "still open after 5 lines" in rows[0].error
    assert [r.id for r in rows[1:]] == [str(i) for i in range(2, 12)] + ["99"]
    assert rows[-1].text == "closed\nhere" and (rows[-1].line, rows[-1].last_line) == (13, 14)


def test_csv_stray_quote_is_an_error_row_with_its_line(tmp_path):
    rows = read_bytes(b'id,text\n1,"a"b\n2,ok\n', None, "in.csv", tmp_path)
    assert rows[0].error.startswith("line 2: malformed CSV") and rows[0].id is None
    assert (rows[1].id, rows[1].text) == ("2", "ok")


def test_csv_long_field_is_read(tmp_path):
    long = "x" * 500_000  # over the csv module's default field limit (128 KiB)
    rows = read_bytes(f"id,text\n1,{long}\n".encode(), None, "in.csv", tmp_path)
    assert rows[0].text == long


def test_int_and_string_ids_are_distinct(tmp_path):
    data = b'{"id": 1, "text": "a"}\n{"id": "1", "text": "b"}\n{"id": 1, "text": "c"}\n'
    rows = read_bytes(data, None, "in.jsonl", tmp_path)
    assert [(r.id, type(r.id)) for r in rows[:2]] == [(1, int), ("1", str)]
    assert rows[2].id is None and "duplicate id 1 (also the id of line 1)" in rows[2].error
    assert "give every row a unique id, or none" in rows[2].error


def test_explicit_id_equal_to_a_line_number_default_is_flagged(tmp_path):
    # line 1 has no id (so id 1); line 2 says id 1
    rows = read_bytes(b'{"text": "a"}\n{"id": 1, "text": "b"}\n', None, "in.jsonl", tmp_path)
    assert (rows[0].id, rows[0].explicit_id) == (1, False)
    assert rows[1].id is None and rows[1].explicit_id
    assert "duplicate id 1" in rows[1].error and "line 1" in rows[1].error and "no id of its own" in rows[1].error
    # line 1 says id 2; line 2 has no id (so id 2)
    rows = read_bytes(b'{"id": 2, "text": "a"}\n{"text": "b"}\n', None, "in.jsonl", tmp_path)
    assert rows[0].id == 2 and rows[1].id is None
    assert "duplicate id 2" in rows[1].error and "this row has no id" in rows[1].error and "line 1" in rows[1].error


def test_error_rows_of_unreadable_lines_have_no_id(tmp_path):
    data = b'{broken\n[1]\n\n{"id": "x", "text": "bad \xff"}\n{"id": 2.5, "text": "a"}\n{"id": null, "text": "a"}\n{"id": "", "text": "a"}\n{"id": "k"}\n{"id": "k2", "text": " "}\n'
    rows = read_bytes(data, None, "in.jsonl", tmp_path)
    assert [r.id for r in rows] == [None] * 7 + ["k", "k2"]  # the last two: the id was read, the text is missing/empty
    assert "invalid UTF-8 (byte 0xff" in rows[3].error
    assert "got float" in rows[4].error and "got null" in rows[5].error and "is empty" in rows[6].error
    # an error row with line number 3 and a real row whose id is 3 no longer collide
    rows = read_bytes(b'{"id": 3, "text": "a"}\n\n{broken\n', None, "in.jsonl", tmp_path)
    assert [r.id for r in rows] == [3, None, None] and rows[0].error is None
    rows = read_bytes(b"id,text\n1,x\n\n2,a,b\n", None, "in.csv", tmp_path)
    assert [r.id for r in rows] == ["1", None, None]


def test_error_row_ids_are_checked_for_duplicates(tmp_path):
    rows = read_bytes(b'{"id": "a"}\n{"id": "a", "text": "x"}\n', None, "in.jsonl", tmp_path)
    assert rows[0].id == "a" and "missing field" in rows[0].error
    assert rows[1].id is None and "duplicate id 'a'" in rows[1].error


def test_jsonl_unpaired_surrogate_escape_is_an_error_row(tmp_path):
    rows = read_bytes(b'{"id": 1, "text": "a\\ud800"}\n{"id": "\\udc80", "text": "b"}\n', None, "in.jsonl", tmp_path)
    assert rows[0].id == 1 and "surrogate" in rows[0].error
    assert rows[1].id is None and "surrogate" in rows[1].error


def test_csv_header_problems_are_input_errors(tmp_path):
    with pytest.raises(InputError, match="--text-column"):
        read_bytes(b"id,body\n1,x\n", None, "in.csv", tmp_path)
    with pytest.raises(InputError, match="--text-column"):
        read_bytes(b"id,text\n1,x\n", None, "in.tsv", tmp_path)  # commas in a .tsv
    with pytest.raises(InputError, match="2 times"):
        read_bytes(b"text,text\n1,x\n", None, "in.csv", tmp_path)
    with pytest.raises(InputError, match="unknown input format"):
        read_bytes(b"x\n", "yaml", None)
    assert issubclass(InputError, ValueError)


def test_trailing_newline_rule(tmp_path):
    for fmt in ("text", "jsonl"):
        assert len(read_bytes(b"a\nb\n", fmt, None)) == 2
        assert len(read_bytes(b"a\nb", fmt, None)) == 2
        rows = read_bytes(b"a\nb\n\n", fmt, None)
        assert len(rows) == 3 and "blank line" in rows[2].error
        assert read_bytes(b"", fmt, None) == []


def run(args, input=None):
    return CliRunner().invoke(main, [str(a) for a in args], input=input, catch_exceptions=False)


def cli(model, *extra):
    return ["--model", str(model), "--labels", "a,b,c", "-q", *extra]


def test_stdin_sniffing_and_editor_files(tiny_qwen_mlx, tmp_path):
    r = run(["classify", *cli(tiny_qwen_mlx)], input="{URGENT} charged twice\nthe app crashes\n")
    out = [json.loads(x) for x in r.stdout.splitlines()]
    assert r.exit_code == 0 and [o["id"] for o in out] == [1, 2]  # text, not malformed JSON
    labels = tmp_path / "labels.txt"
    labels.write_bytes("\ufeffa\nb\nc\n".encode())
    r = run(["classify", "--model", str(tiny_qwen_mlx), "--labels-file", str(labels), "-q"], input="hello\n")
    assert set(json.loads(r.stdout)["probs"]) == {"a", "b", "c"}


def rows_of(tmp_path, name, data: bytes, **kw):
    p = tmp_path / name
    p.write_bytes(data)
    return list(read_rows(str(p), **kw))


def test_jsonl_good_and_bad_rows_keep_order(tmp_path):
    data = (
        b'{"id": "a", "text": "hello"}\n'
        b'{"id": "b", "text": "  "}\n'
        b"{not json}\n"
        b'{"id": "c"}\n'
        b'{"id": "a", "text": "again"}\n'
        b"\n"
        b'{"id": "e", "text": "bad \xff byte"}\n'
        b"[1, 2]\n"
        b'{"text": "no id"}\n'
    )
    rows = rows_of(tmp_path, "in.jsonl", data)
    assert [r.line for r in rows] == list(range(1, 10))
    assert rows[0].text == "hello" and rows[0].error is None
    assert "empty" in rows[1].error
    assert "malformed JSON" in rows[2].error
    assert "missing field 'text'" in rows[3].error and "--text-field" in rows[3].error
    assert "duplicate id 'a'" in rows[4].error
    assert "blank line" in rows[5].error
    assert "invalid UTF-8" in rows[6].error
    assert "expected a JSON object" in rows[7].error
    assert rows[8].id == 9 and rows[8].text == "no id"  # id defaults to the line number
    # error rows keep an id that was read; lines whose id could not be read (and duplicates) get None
    assert [r.id for r in rows] == ["a", "b", None, "c", None, None, None, None, 9]
    assert [r.explicit_id for r in rows] == [True, True, False, True, True, False, False, False, False]
    assert all(r.error.startswith(f"line {r.line}:") for r in rows if r.error)


def test_jsonl_custom_fields(tmp_path):
    rows = rows_of(tmp_path, "in.jsonl", b'{"key": 7, "body": "x"}\n', text_field="body", id_field="key")
    assert (rows[0].id, rows[0].text) == (7, "x")


def test_csv_rows(tmp_path):
    data = b'id,text\n1,hello\n2,"multi\nline"\n3,\n4,"a",extra\n5,"bad \xfe"\n'
    rows = rows_of(tmp_path, "in.csv", data)
    assert rows[0].text == "hello" and rows[0].id == "1"
    assert rows[1].text == "multi\nline"
    assert "empty" in rows[2].error and rows[2].line == 5
    assert "fields where the header has 2" in rows[3].error
    assert "invalid UTF-8" in rows[4].error
    assert (rows[1].line, rows[1].last_line) == (3, 4)
    assert [r.id for r in rows] == ["1", "2", "3", None, "5"]  # a misaligned record's id is not trusted


def test_csv_missing_text_column_is_a_clear_error(tmp_path):
    with pytest.raises(InputError, match="--text-column"):
        rows_of(tmp_path, "in.csv", b"id,body\n1,x\n")


def test_text_lines(tmp_path):
    rows = rows_of(tmp_path, "in.txt", b"one\n\ntwo\r\n")
    assert [(r.id, r.text) for r in rows[::2]] == [(1, "one"), (3, "two")]
    assert "blank line" in rows[1].error and rows[1].id is None


# --pair-field/--pair-column read the same way by every reader (issue 40).


@pytest.fixture
def files(tmp_path):
    jsonl = tmp_path / "in.jsonl"
    jsonl.write_text(json.dumps({"text": "a"}) + "\n" + json.dumps({"text": "b", "text_pair": "c"}) + "\n")
    csv = tmp_path / "in.csv"
    csv.write_text("text\na\n")
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    parquet = tmp_path / "in.parquet"
    pq.write_table(pa.table({"text": ["a", "b"]}), str(parquet))
    return jsonl, csv, parquet


def test_the_readers_agree_on_a_named_field(files):
    from mlx_slm.ground.textfiles import InputError

    jsonl, csv, parquet = files
    rows = list(read_rows(str(jsonl), pair="nope", pair_required=True))
    assert all("no field 'nope'" in r.error and "--pair-field" in r.error for r in rows)
    assert [r.pair for r in read_rows(str(jsonl), pair="text_pair")] == [None, "c"]  # the default: where present
    with pytest.raises(InputError, match="no column 'nope'.*--pair-field"):
        list(read_rows(str(parquet), pair="nope", pair_required=True))
    with pytest.raises(InputError, match="no column 'nope'.*--pair-column"):
        list(read_rows(str(csv), pair="nope"))


def test_classify_refuses_a_pair_field_it_cannot_read(files, tiny_seqcls_mlx):
    jsonl, csv, parquet = files
    m = ["--model", tiny_seqcls_mlx]
    r = run(["classify", jsonl, *m, "--pair-field", "nope"])
    rows = [json.loads(x) for x in r.stdout.splitlines()]
    assert r.exit_code == 1 and all("no field 'nope'" in x["error"] for x in rows), r.output
    r = run(["classify", parquet, *m, "--pair-field", "nope"])
    assert r.exit_code == 2 and "no column 'nope'" in r.output
    r = run(["classify", csv, *m, "--pair-field", "nope"])  # a CSV's pair is its --pair-column
    assert r.exit_code == 2 and "--pair-column" in r.output
    txt = csv.with_suffix(".txt")
    txt.write_text("a\n")
    r = run(["classify", txt, *m, "--pair-field", "x"])
    assert r.exit_code == 2 and "--pair-field" in r.output
    assert run(["classify", jsonl, *m, "-q"]).exit_code == 0  # text_pair, where a row has it


# A user's bad input, examples or labels file: a one-line error naming the file, the line or field and
# the fix (exit 2), never a traceback (exit 70). One test per class of hostile input.


def test_input_path_that_is_a_folder(tmp_path):
    from mlx_slm.files.readers import read_rows
    from mlx_slm.ground.textfiles import InputError

    d = tmp_path / "d"
    d.mkdir()
    with pytest.raises(InputError, match="is a folder"):
        list(read_rows(str(d)))
    refused(hostile.cli("classify", str(d), "-o", str(tmp_path / "o.jsonl"), "--model", "no-such-model"), "is a folder")
    refused(hostile.cli("eval", str(d), "--predictions", str(write(tmp_path / "p.jsonl", ""))), "is a folder")


def test_examples_and_labels_files_with_bad_bytes_or_fields(tmp_path):
    from mlx_slm.files.readers import read_labels_file
    from mlx_slm.text.prompts import PromptError, read_examples

    labels = ["billing", "technical"]
    ok = json.dumps({"text": "hi", "label": "billing"}) + "\n"
    bad_examples = {
        b'{"text": "x\xff", "label": "billing"}\n': "line 1: invalid UTF-8",
        (ok + "[1, 2]\n").encode(): "line 2: an example is a JSON object",
        (ok + '{"text": 5, "label": "billing"}\n').encode(): "line 2",
        (ok + "[" * 50_000 + "\n").encode(): "line 2: malformed JSON",
        (ok + '{"text": "hi", "label": "nope"}\n').encode(): "line 2: label 'nope' is not one of the labels",
        (ok + '{"text": "hi\\ud800", "label": "billing"}\n').encode(): "line 2: the example holds an unpaired",
        b"\n\n": "holds no examples",
    }
    for data, words in bad_examples.items():
        p = write(tmp_path / "ex.jsonl", data)
        with pytest.raises(PromptError) as e:
            read_examples(str(p), labels)
        assert str(p) in str(e.value) and words in str(e.value), str(e.value)
    assert read_examples(str(write(tmp_path / "ok.jsonl", b"\xef\xbb\xbf" + ok.encode())), labels) == (
        ("hi", "billing"),
    )
    lf = write(tmp_path / "labels.txt", b"billing\ntech\xffnical\n")
    with pytest.raises(UserError, match="labels.txt line 2: invalid UTF-8 \\(byte 0xff at column 5\\)"):
        read_labels_file(str(lf))
    assert read_labels_file(str(write(tmp_path / "l2.txt", b"\xef\xbb\xbfa\r\n\r\n b \n"))) == ["a", "b"]
    inp = write(tmp_path / "in.txt", "hello\n")
    refused(hostile.cli("classify", str(inp), "--labels-file", str(lf), "--model", "no-such-model"), "line 2", "UTF-8")
    exf = write(tmp_path / "ex.jsonl", b'{"text": "x\xff", "label": "billing"}\n')
    refused(hostile.cli("classify", str(inp), "--examples", str(exf), "--model", "no-such-model"), "line 1", "UTF-8")


def test_parquet_with_a_corrupt_data_page(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    from mlx_slm.files.readers import read_rows
    from mlx_slm.ground.textfiles import InputError

    p = tmp_path / "in.parquet"
    texts = [f"ticket number {i} about my invoice and the app" for i in range(2000)]
    pq.write_table(pa.table({"id": list(range(2000)), "text": texts}), p, compression="snappy", row_group_size=500)
    assert len(list(read_rows(str(p)))) == 2000
    data = bytearray(p.read_bytes())
    # Damage the middle of the file (data pages), leaving the footer (schema) readable.
    for i in range(len(data) // 3, len(data) // 3 + 200):
        data[i] ^= 0x5A
    write(p, bytes(data))
    try:
        rows = list(read_rows(str(p)))
    except InputError as e:
        assert str(p) in str(e) and "damaged" in str(e)
    else:  # whatever pyarrow could still decode is rows or error rows, never a traceback
        assert all(r.text is not None or r.error for r in rows)
    write(p, bytes(data[: len(data) // 2]))  # a torn file: no footer
    with pytest.raises(InputError, match="not a readable Parquet file"):
        list(read_rows(str(p)))


# The option a reader names is the command's own (hostile round eight, issue 53).


@pytest.mark.parametrize(
    "states, options", [((), TEXT_OPTIONS), (("state", "text"), STATE_OPTIONS), (("text",), TEXT_OPTIONS)]
)
def test_every_reader_names_the_commands_own_option(tmp_path, states, options):
    """decide's states (--state-field/--state-column), eval --decisions' (its --text-field/--text-column)
    and every other command's texts: each format's missing text names the option of the command run."""
    spec = ReadSpec(text_field=(states or ("text",))[0], states=states, text_options=options)
    csv, jsonl = tmp_path / "in.csv", tmp_path / "in.jsonl"
    csv.write_text("id,body\n1,hello\n")
    jsonl.write_text('{"id": 1, "body": "hello"}\n')
    with pytest.raises(UserError) as e:
        list(read_rows(str(csv), spec))
    assert options[1] in str(e.value) and ({*TEXT_OPTIONS, *STATE_OPTIONS} - {options[1]}).isdisjoint(
        str(e.value).split()
    )
    row = next(iter(read_rows(str(jsonl), spec)))
    assert options[0] in row.error and (STATE_OPTIONS if options == TEXT_OPTIONS else TEXT_OPTIONS)[0] not in row.error
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"id": [1], "body": ["hello"]}), tmp_path / "in.parquet")
    with pytest.raises(UserError) as e:
        list(read_rows(str(tmp_path / "in.parquet"), spec))
    assert f"use {options[0]}" in str(e.value)


@pytest.mark.parametrize(
    "command, suffix, option, says",
    [
        ("classify", ".jsonl", "--id-column", "use --id-field"),
        ("classify", ".jsonl", "--text-column", "use --text-field"),
        ("classify", ".csv", "--text-field", "use --text-column"),
        ("classify", ".txt", "--id-field", "plain text only: drop it"),
        ("eval", ".jsonl", "--id-column", "use --id-field"),
        ("train", ".jsonl", "--text-column", "use --text-field"),
    ],
)
def test_a_field_option_no_input_format_reads_is_refused(tmp_path, tiny_qwen_mlx, command, suffix, option, says):
    inp = tmp_path / f"in{suffix}"
    rows = [
        ("refund please", "billing"),
        ("charged twice", "billing"),
        ("app crashes", "tech"),
        ("login error", "tech"),
    ]
    if suffix == ".jsonl":
        inp.write_text(
            "".join(json.dumps({"id": i, "text": t, "label": lab}) + "\n" for i, (t, lab) in enumerate(rows))
        )
    elif suffix == ".csv":
        inp.write_text("id,text,label\n" + "".join(f"{i},{t},{lab}\n" for i, (t, lab) in enumerate(rows)))
    else:
        inp.write_text("".join(t + "\n" for t, _ in rows))
    extra = ["--save-task", tmp_path / "t.json"] if command == "train" else ["--labels", "billing,tech"]
    r = invoke([command, inp, "--model", tiny_qwen_mlx, option, "x", *extra, "-q"])
    refused_cleanly(r, option, says)


def test_field_options_of_either_file_are_taken(tmp_path, tiny_qwen_mlx):
    """--text-column reads the CSV INPUT while --calibration-data is JSONL: taken (each file its own)."""
    inp, cal = tmp_path / "in.csv", tmp_path / "cal.jsonl"
    inp.write_text("id,body\n1,refund please\n2,app crashes\n")
    cal.write_text(
        "".join(json.dumps({"text": t, "label": lab}) + "\n" for t, lab in [("a", "billing"), ("b", "tech")] * 2)
    )
    r = invoke(["classify", inp, "--model", tiny_qwen_mlx, "--labels", "billing,tech", "--text-column", "body",
                "--calibrate", "fit", "--calibration-data", cal, "-q"])  # fmt: skip
    assert r.exit_code == 0, r.output
