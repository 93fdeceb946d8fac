"""Reading an output back (`files/output/reader.py`): the one reader of the output format, every row
with its exact bytes and fields, a torn last row marked, a bad row named."""

import pytest

from mlx_slm.files.output import Writer, csv_columns

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
