"""The rerank benchmark (benchmarks/rerank.py): its pure pieces (the token floor, with the sequence
classifier's padded plan beside it, agreement and quality), and a run end to end on a tiny model
(slow: Transformers in a child). The seqcls benchmark is in test_seqcls.py."""

from __future__ import annotations

import json

import numpy as np
import pytest

from benchmarks import rerank, seqcls
from tests.benchmarks.banking77 import fake_banking77


def test_token_floor_counts_each_head_once_and_the_plans_pad_batches():
    head_a, head_b = (1, 2, 3), (4, 5)
    ids = [[1, 2, 3, 9], [1, 2, 3, 9, 9, 9], [4, 5, 7, 7]]
    heads = [head_a, head_a, head_b]
    assert rerank.floor_tokens(ids, heads) == 3 + 2 + (1 + 3 + 2)
    # One batch over every query's documents: the rests (1, 3, 2) padded to 3, after both heads.
    assert rerank.planned_tokens(ids, heads, 32, None) == 5 + 3 * 3
    # Whole prompts, batches of 2 after sorting (4, 4 | 6).
    assert rerank.planned_tokens(ids, [()] * 3, 2, None) == 2 * 4 + 6
    assert seqcls.in_order_padded([3, 9, 2, 2], 2) == 2 * 9 + 2 * 2
    assert seqcls.in_order_padded([3, 9, 2], 1) == 14


def test_agreement_and_quality():
    ref = np.array([0.9, 0.1, 0.5, 0.2, 0.8, 0.3])
    groups = [np.arange(3), np.arange(3, 6)]
    same = rerank.agreement(ref + 1e-7, ref, groups)
    assert same["top1_equal"] == same["order_equal"] == 2 and same["min_kendall_tau"] == 1.0
    assert same["max_abs_diff"] == pytest.approx(1e-7)
    swapped = ref.copy()
    swapped[[3, 5]] = swapped[[5, 3]]  # the second query's two last documents change places
    got = rerank.agreement(swapped, ref, groups)
    assert (
        got["top1_equal"] == 2 and got["order_equal"] == 1 and got["min_kendall_tau"] == pytest.approx(1 / 3, abs=1e-4)
    )
    assert rerank.kendall_tau(ref, -ref) == -1.0
    qs = [
        rerank.Query("q", "a", ["x"] * 3, [True, False, False]),
        rerank.Query("r", "b", ["y"] * 3, [False] * 2 + [True]),
    ]
    assert rerank.quality(ref, qs) == {"same_intent_first": 1, "queries": 2, "same_intent_share_at_k": 0.5}


@pytest.fixture(scope="module")
def tiny_yesno(tmp_path_factory):
    """A tiny qwen2 whose tokenizer has `yes` and `no` as tokens, converted (float32)."""
    from mlx_slm.weights.convert import convert
    from tests.conftest import make_tiny

    hf = make_tiny(tmp_path_factory.mktemp("hf-yn"), "qwen2", words=("yes", "no", "billing", "technical", "account"))
    return convert(hf, tmp_path_factory.mktemp("mlx-yn") / "m", dtype="float32", progress=None)


@pytest.mark.slow
def test_rerank_benchmark_end_to_end(tiny_yesno, tmp_path):
    data = fake_banking77(tmp_path / "b77", train_per_intent=64)
    out = tmp_path / "res"
    args = ["--model", str(tiny_yesno), "--banking77", str(data), "--queries", "2", "--docs", "6", "--same", "2"]
    assert rerank.main([*args, "--item-docs", "3", "--out", str(out)]) == 0
    res = json.loads((out / "rerank.json").read_text())
    rows = {r["row"]: r for r in res["rows"]}
    assert list(rows) == ["ours", "ours-no-cache", "hf-sorted", "hf-item"]
    assert rows["hf-item"]["documents"] == 6 and rows["ours"]["documents"] == 12
    for r in rows.values():
        assert r["vs_transformers"]["max_abs_diff"] < 1e-4 and r["vs_one_at_a_time"]["max_abs_diff"] < 1e-4
    for name in ("ours", "ours-no-cache", "hf-sorted"):  # what ran is what the plan says
        assert rows[name]["processed_tokens"] == rows[name]["planned_tokens"]
    assert (
        rows["ours"]["stats"]["prefix_saved_tokens"] > 0 and rows["ours-no-cache"]["stats"]["prefix_saved_tokens"] == 0
    )
    assert rows["ours"]["processed_tokens"] < rows["ours-no-cache"]["processed_tokens"]
    assert rows["ours"]["x_floor"] >= 1.0 and res["floor_tokens"] > res["head_tokens"] > 0
    assert res["full_run"]["planned_tokens"]["ours"] >= res["full_run"]["floor_tokens"] > 0
    assert "| ours |" in (out / "rerank.md").read_text() and (out / "rerank.png").stat().st_size > 1000
