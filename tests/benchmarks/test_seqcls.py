"""The sequence-classification benchmark (benchmarks/seqcls.py): its BANKING77 draw, and a run end to end
on a tiny model (slow: Transformers in a child)."""

from __future__ import annotations

import json

import pytest

from benchmarks import rerank, seqcls
from tests.benchmarks.banking77 import fake_banking77


def test_banking77_draws_distinct_intents_and_a_fixed_share_of_their_own(tmp_path):
    root = fake_banking77(tmp_path / "b77")
    qs = rerank.banking77(root, 4, 12, 3, seed=1)
    assert len({q.intent for q in qs}) == 4
    for q in qs:
        assert len(q.docs) == 12 and sum(q.same) == 3 and len(set(q.docs)) == 12
        assert q.text.startswith("test message")
    again = rerank.banking77(root, 4, 12, 3, seed=1)
    assert [(q.text, q.docs) for q in again] == [(q.text, q.docs) for q in qs]
    assert [q.docs for q in rerank.banking77(root, 4, 12, 3, seed=2)] != [q.docs for q in qs]
    with pytest.raises(SystemExit, match="--same"):
        rerank.banking77(root, 2, 4, 5)
    with pytest.raises(SystemExit, match="9 intents"):
        rerank.banking77(root, 10, 4, 1)
    with pytest.raises(SystemExit, match="--banking77"):
        rerank.banking77(tmp_path / "nowhere", 2, 4, 1)


@pytest.fixture(scope="module")
def tiny_yesno(tmp_path_factory):
    """A tiny qwen2 whose tokenizer has `yes` and `no` as tokens, converted (float32)."""
    from mlx_slm.weights.convert import convert
    from tests.conftest import make_tiny

    hf = make_tiny(tmp_path_factory.mktemp("hf-yn"), "qwen2", words=("yes", "no", "billing", "technical", "account"))
    return convert(hf, tmp_path_factory.mktemp("mlx-yn") / "m", dtype="float32", progress=None)


@pytest.mark.slow
def test_seqcls_benchmark_end_to_end(tiny_yesno, tmp_path, monkeypatch):
    monkeypatch.setenv("MLX_SLM_HOME", str(tmp_path / "home"))  # our conversion of the checkpoint goes there
    out, cache = tmp_path / "res", tmp_path / "cache"
    args = ["--model", str(tiny_yesno), "--n", "5", "--batch", "4", "--cache", str(cache), "--out", str(out)]
    assert seqcls.main(args) == 0
    (built,) = cache.iterdir()  # built once, renamed into place
    assert json.loads((built / "config.json").read_text())["architectures"] == ["Qwen2ForSequenceClassification"]
    res = json.loads((out / "seqcls.json").read_text())
    rows = {r["row"]: r for r in res["rows"]}
    assert list(rows) == ["ours", "pipeline-b1", "pipeline-b4"]
    assert res["checkpoint"]["labels"] == ["billing", "technical", "account"]
    for r in rows.values():
        assert r["labels_equal"] == "5/5" and r["max_prob_diff"] < 1e-4
    assert rows["ours"]["processed_tokens"] == rows["ours"]["planned_tokens"]
    assert rows["pipeline-b1"]["processed_tokens"] == res["prompt_tokens"]
    assert res["full_run"]["tickets"] == 96
    # A second run finds the checkpoint built (same folder, nothing new).
    assert seqcls.main([*args[:-1], str(tmp_path / "res2"), "--head", "labels"]) == 0
    assert [p.name for p in cache.iterdir()] == [built.name]
