"""--pair-field/--pair-column read the same way by every reader (issue 40): a field or column
typed must be there (a CSV header's column, a Parquet schema's, each JSONL row's field: its error
row naming it), the default text_pair is read where a row has it, and an option the input's
format cannot use is refused by name (`TaskOptions.read_pair`, for classify, eval, train and
calibration data alike)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from mlx_slm.cli import main
from mlx_slm.files.readers import read_rows


def run(args):
    return CliRunner().invoke(main, [str(a) for a in args])


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
