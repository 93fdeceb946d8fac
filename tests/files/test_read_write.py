import pytest

from mlx_slm.files.output import Writer, csv_columns, scan_output
from mlx_slm.files.readers import read_rows
from mlx_slm.ground.textfiles import InputError


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


def test_writer_and_scan_output_jsonl(tmp_path):
    out = tmp_path / "o.jsonl"
    w = Writer(str(out), csv_columns(["x", "y"]))
    w.write({"id": 1, "label": "x", "probs": {"x": 0.9, "y": 0.1}})
    w.write({"id": None, "line": 2, "error": "line 2: boom"})
    w.write({"id": "a\u2028b\u0085c", "label": "y", "probs": {"x": 0.1, "y": 0.9}})
    w.close()
    with open(out, "a") as f:
        f.write('{"id": 3, "lab')  # torn last record
    rows, header_end = scan_output(str(out), "jsonl", csv_columns(["x", "y"]))
    assert [(r.id, r.error) for r in rows] == [(1, False), (None, True), ("a\u2028b\u0085c", False)]
    assert header_end == 0 and rows[-1].end == out.read_bytes().rfind(b"\n") + 1


def test_writer_csv(tmp_path):
    out = tmp_path / "o.csv"
    w = Writer(str(out), csv_columns(["x", "y"]), fmt="csv")
    w.write({"id": 1, "label": "x", "probs": {"x": 0.9, "y": 0.1}})
    w.write({"id": "multi\nline\rid", "line": 3, "error": 'line 3: a "quoted" error'})
    w.close()
    lines = out.read_text().splitlines()
    assert lines[0] == "id,label,p_x,p_y,truncated,line,error"
    assert lines[1].startswith("1,x,0.9,0.1")
    rows, header_end = scan_output(str(out), "csv", csv_columns(["x", "y"]))
    assert [(r.id, r.error) for r in rows] == [("1", False), ("multi\nline\rid", True)]
    with open(out, "ab") as f:
        f.write(b'2,"torn\n')  # an open quote at the end: not a complete row
    assert len(scan_output(str(out), "csv", csv_columns(["x", "y"]))[0]) == 2


RECORDS = [
    {"id": "multi\nline\rid", "line": 3, "error": 'line 3: a "quoted" error'},
    {"id": "a\u2028b\u0085c", "label": "y", "probs": {"x": 0.1, "y": 0.9}},
    {"id": 1, "label": "x", "probs": {"x": 0.9, "y": 0.1}},
]


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "tsv", "parquet"])
def test_read_records_gives_each_row_its_exact_bytes_and_fields(tmp_path, fmt):
    """The one reader of the output format (resume, merge, eval): every row with its bytes
    (they join back into the file), its fields, and a torn last row marked as such."""
    if fmt == "parquet":
        pytest.importorskip("pyarrow")
    from mlx_slm.files.output import read_records

    out = tmp_path / f"o.{fmt}"
    w = Writer(str(out), csv_columns(["x", "y"]), fmt=fmt)
    for rec in RECORDS:
        w.write(rec)
    w.close()
    data = out.read_bytes()
    got = list(read_records(str(out), fmt))
    rows = [r for r in got if r.row > 0]
    assert not any(r.problem or r.torn for r in got)
    want_ids = [r["id"] for r in RECORDS] if fmt in ("jsonl", "parquet") else [str(r["id"]) for r in RECORDS]
    assert [r.fields["id"] for r in rows] == want_ids
    assert [r.row for r in rows] == [1, 2, 3]
    if fmt == "parquet":
        assert rows[2].fields["p_x"] == 0.9 and rows[0].fields["error"] == RECORDS[0]["error"]
        return
    assert b"".join(r.raw for r in got) == data and got[-1].end == len(data)
    assert [r.end for r in got] == [len(b"".join(r.raw for r in got[: i + 1])) for i in range(len(got))]
    if fmt != "jsonl":
        assert got[0].row == 0 and got[0].values == csv_columns(["x", "y"])
        assert rows[0].line == 2 and rows[1].line == 4  # the first row spans lines 2-3 (a quoted newline)
    torn = list(read_records(str(out), fmt, data[:-3]))
    assert torn[-1].torn and not any(r.torn for r in torn[:-1]) and len(torn) == len(got)


def test_read_records_names_what_is_wrong_with_a_row():
    from mlx_slm.files.output import RecordError, read_records

    got = list(read_records("o.jsonl", "jsonl", b'[1]\n{"id": 1}\n\xff\n{"x": 1}\nnot json\n'))
    assert [r.flaw for r in got] == ["object", None, "utf8", "id", "json"]
    assert got[2].problem == "invalid UTF-8 (byte 0xff)" and got[0].problem == "a JSON list, not an object"
    lenient = list(read_records("o.jsonl", "jsonl", b'{"x": 1}\n\n{"id": 2}', lenient=True))
    assert [(r.line, r.problem, r.torn) for r in lenient] == [(1, None, False), (3, None, True)]
    got = list(read_records("o.csv", "csv", b"\xef\xbb\xbfid,error\r\na\r\nb,\xff\r\nc,,x\r\n"))
    assert got[0].values == ["id", "error"] and got[0].raw.startswith(b"\xef\xbb\xbf")
    assert [r.flaw for r in got[1:]] == ["fields", "utf8", "fields"]
    lenient = list(read_records("o.csv", "csv", b"id,error\r\na\r\n\r\nc,,x\r\n", lenient=True))
    assert [(r.line, r.flaw) for r in lenient[1:]] == [(2, None), (4, "fields")]
    with pytest.raises(RecordError, match=r"o.csv: row 2 \(line 3\)"):
        list(read_records("o.csv", "csv", b'id,error\r\na,\r\n"b"c,\r\n', strict_csv=True))
