"""A user's bad input, examples or labels file (a folder, bad bytes, wrong fields, a corrupt
Parquet page) is a one-line error naming the file, the line or field and the fix (exit 2),
never a traceback (exit 70). One test per class of hostile input."""

from __future__ import annotations

import json

import pytest

from mlx_slm.ground.errors import UserError
from tests.hostile import cli, refused, write


def test_input_path_that_is_a_folder(tmp_path):
    from mlx_slm.files.readers import read_rows
    from mlx_slm.ground.textfiles import InputError

    d = tmp_path / "d"
    d.mkdir()
    with pytest.raises(InputError, match="is a folder"):
        list(read_rows(str(d)))
    refused(cli("classify", str(d), "-o", str(tmp_path / "o.jsonl"), "--model", "no-such-model"), "is a folder")
    refused(cli("eval", str(d), "--predictions", str(write(tmp_path / "p.jsonl", ""))), "is a folder")


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
    refused(cli("classify", str(inp), "--labels-file", str(lf), "--model", "no-such-model"), "line 2", "UTF-8")
    exf = write(tmp_path / "ex.jsonl", b'{"text": "x\xff", "label": "billing"}\n')
    refused(cli("classify", str(inp), "--examples", str(exf), "--model", "no-such-model"), "line 1", "UTF-8")


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
