"""`mlx-slm embed` (`cli/embed.py`): JSONL, Parquet and .npy by the extension, in input order, error rows as
classify writes them (exit 1), the prompt and size options, and the refusals (exit 2) naming
the option and the fix."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.embed_cli import run, want  # folder, inp: fixtures (conftest.py)


def test_jsonl_in_order_with_error_rows(folder, inp):
    r = run(["embed", str(inp), "--model", str(folder), "--prompt-name", "query"])
    assert r.exit_code == 1, r.output
    out = [json.loads(x) for x in r.stdout.splitlines()]
    assert [o["id"] for o in out] == ["t0", "empty", "t1", "t2", None]
    assert out[1] == {
        "id": "empty",
        "line": 2,
        "error": "line 2: field 'text' is empty: give the item some text, or drop the row",
    }
    assert out[4]["line"] == 5 and "malformed JSON" in out[4]["error"]
    got = np.array([o["embedding"] for o in out if "embedding" in o], dtype=np.float32)
    np.testing.assert_allclose(
        got, want(folder, prompt_name="query"), atol=1e-6
    )  # mean pooling: as the folder (normalized)
    assert "texts/s" in r.stderr and "the prompt's head saved" in r.stderr and "1 row(s) failed" not in r.stdout


@pytest.mark.parametrize(
    "extra, words",
    [
        (["--prompt-name", "nope"], "--prompt-name 'nope'"),
        (["--dimensions", "65"], "--dimensions 65: give an integer from 1 to 64"),
        (["--dimensions", "0"], "must be an integer from 1"),
        (["--prompt", "a", "--prompt-name", "query"], "not both"),
        (["-o", "out.txt"], "unknown extension '.txt'"),
    ],
)
def test_refusals_exit_2(folder, inp, tmp_path, extra, words):
    extra = [str(tmp_path / x) if x == "out.txt" else x for x in extra]
    r = run(["embed", str(inp), "--model", str(folder), *extra])
    assert r.exit_code == 2 and words in r.output, r.output


def test_a_sequence_classifier_does_not_embed(tiny_arch, inp):
    r = run(["embed", str(inp), "--model", str(tiny_arch.seqcls_mlx("qwen2", 3))])
    assert r.exit_code == 2 and "no pooling config" in r.output and "sequence classifier" in r.output


def test_classify_on_an_embedding_folder_says_it_embeds(folder, inp):
    r = run(["classify", str(inp), "--model", str(folder), "--labels", "a,b"])
    assert r.exit_code == 2 and "bare backbone without an LM head" in r.output and "mlx-slm embed" in r.output


def test_doctor_says_how_a_model_embeds(folder, tiny_arch):
    r = run(["doctor", "--model", str(folder)])
    assert "embeddings     sentence-transformers: mean pooling, 64 values, normalized" in r.stdout
    assert "none (a bare backbone" in r.stdout
    r = run(["doctor", "--model", str(tiny_arch.mlx("qwen2"))])
    assert "embeddings     a causal LM: the last token's final-norm hidden state" in r.stdout
