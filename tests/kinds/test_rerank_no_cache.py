"""A reranker with the query cache off runs each (query, document) prompt whole, as the
benchmark's `ours-no-cache` row needs (benchmarks/rerank.py), with the same scores."""

from __future__ import annotations

import pytest

from mlx_slm.classifier.classifier import Classifier
from mlx_slm.engine.engine import Engine

QUERIES = ("my card was charged twice", "how do I reset my password")
DOCS = (
    "I see a duplicate payment on my card statement",
    "the app logs me out after an update",
    "please send me a refund for the second charge",
    "I forgot my password and the reset link expired",
)


@pytest.fixture(scope="module")
def tiny_reranker(tmp_path_factory):
    """A tiny qwen2 whose tokenizer has `yes` and `no` as tokens of their own (float32, converted)."""
    from mlx_slm.weights.convert import convert
    from tests.conftest import make_tiny

    hf = make_tiny(tmp_path_factory.mktemp("hf-yn"), "qwen2", words=("yes", "no"))
    return convert(hf, tmp_path_factory.mktemp("mlx-yn") / "m", dtype="float32", progress=None)


def test_query_cache_off_runs_each_prompt_whole(tiny_reranker):
    items = [(q, d) for q in QUERIES for d in DOCS]
    engine = Engine.load(str(tiny_reranker))
    on = Classifier(engine, reranker="qwen3").run(items)
    cached = [p.value for p in on]
    # A fresh engine (its own, empty prefix cache), one prompt per batch: nothing padded, nothing shared.
    alone = Engine(engine.model, engine.tokenizer, engine.path)
    off = Classifier(alone, reranker="qwen3", use_prefix_cache=False, batch_size=1).run(items)
    whole = [p.value for p in off]
    assert on.stats.prefix_saved_tokens > 0
    assert off.stats.prefix_saved_tokens == 0 and off.stats.padding_tokens == 0
    assert off.stats.processed_tokens == off.stats.prompt_tokens == on.stats.prompt_tokens
    assert off.stats.batches == len(items)
    assert max(abs(a - b) for a, b in zip(cached, whole)) < 1e-5
