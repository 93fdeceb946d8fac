"""The prompt-prefix KV cache (`engine/prefix_cache.py`): the shared head computed once, or a head per
row (`StackedPrefix`, a reranker's queries); the cache changes no score."""

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


def test_a_prefix_is_computed_once_and_stacked_heads_are_left_padded(engine):
    import numpy as np

    from mlx_slm.engine.prefix_cache import PrefixCache, StackedPrefix

    model = engine.model
    a, b = PrefixCache(model, [5, 6, 7, 8]), PrefixCache(model, [9, 10])
    assert len(a) == 4 and a.tokens == (5, 6, 7, 8) and a.mask is None
    k, v = a.kv[0]
    assert k.shape[0] == 1 and k.shape[2] == 4
    stacked = StackedPrefix([a, b])
    assert len(stacked) == 4 and stacked.lengths.tolist() == [4, 2]
    assert np.array(stacked.mask).tolist() == [[True] * 4, [False, False, True, True]]
    sk, _ = stacked.kv[0]
    assert sk.shape[0] == 2 and sk.shape[2] == 4
    np.testing.assert_array_equal(np.array(sk[1, :, 2:]), np.array(b.kv[0][0][0]))  # b's keys, after the padding
    np.testing.assert_array_equal(np.array(a.kv[0][0]), np.array(k))  # a head's own cache is never written
    with pytest.raises(ValueError, match="empty prefix"):
        PrefixCache(model, [])
