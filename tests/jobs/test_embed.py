"""An embed job (`jobs/embed.py`): every text of an input file to its vector, in input order, written as
.npy or Parquet (its ids typed as classify's writer types them)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from mlx_slm.classifier.embedder import Embedder
from mlx_slm.engine.engine import Engine
from tests.embed_cli import TEXTS, run, want  # folder, inp: fixtures (conftest.py)


def test_npy_and_parquet(folder, inp, tmp_path):
    npy, pq = tmp_path / "v.npy", tmp_path / "v.parquet"
    r = run(["embed", str(inp), "--model", str(folder), "-o", str(npy), "--dimensions", "8", "-q"])
    assert r.exit_code == 1 and "row 'empty': line 2" in r.stderr
    arr = np.load(npy)
    assert arr.shape == (5, 8) and arr.dtype == np.float32 and np.isnan(arr[[1, 4]]).all()
    full = want(folder)
    short = full[:, :8] / np.linalg.norm(full[:, :8], axis=1, keepdims=True)
    np.testing.assert_allclose(arr[[0, 2, 3]], short, atol=1e-6)
    r = run(["embed", str(inp), "--model", str(folder), "-o", str(pq), "--no-normalize", "--prompt", "Q: ", "-q"])
    import pyarrow.parquet as papq

    t = papq.read_table(pq).to_pylist()
    assert [x["id"] for x in t] == ["t0", "empty", "t1", "t2", None] and t[1]["embedding"] is None
    np.testing.assert_allclose(
        np.array([x["embedding"] for x in t if x["embedding"]]),
        Embedder(Engine.load(str(folder))).encode(TEXTS, prompt="Q: ", normalize=False),
        atol=1e-6,
    )


@pytest.mark.parametrize(
    "ids, columns",
    [
        ([1, "1", 2], {"id": ["1", "1", "2"], "id_is_int": [True, False, True]}),  # issue 47: both came back "1"
        ([1, 2, 3], {"id": [1, 2, 3]}),
        (["a", "b", "c"], {"id": ["a", "b", "c"]}),
    ],
)
def test_parquet_ids_keep_their_type_as_classify_s(folder, tmp_path, ids, columns):
    """The ids go through classify's writer's typing (`files.output.id_columns`): `1` and "1" stay
    apart (`id_is_int`), and read back as given (`parquet_records`)."""
    import pyarrow.parquet as papq

    from mlx_slm.files.output import parquet_records

    inp, out = tmp_path / "in.jsonl", tmp_path / "v.parquet"
    inp.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in zip(ids, TEXTS)))
    r = run(["embed", str(inp), "--model", str(folder), "-o", str(out), "-q"])
    assert r.exit_code == 0, r.output
    table = papq.read_table(out)
    assert {k: table.column(k).to_pylist() for k in columns} == columns
    assert [rec["id"] for rec in parquet_records(table)] == ids
    assert str(table.schema.field("embedding").type.value_type) == "float"
