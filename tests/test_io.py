import pytest

from mlx_slm.io import InputError, read_rows
from mlx_slm.output import Writer, csv_columns, scan_output


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
