"""The engine (`engine/engine.py`): loaded weights, the prompt-prefix KV caches and the batched forward;
its features after a shared prefix equal Transformers' hidden states of each whole prompt, on every
architecture."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import mlx_slm  # noqa: F401  (the optimized BLAS before mlx.core)
from mlx_slm.engine.engine import Engine
from mlx_slm.models import (
    load_model,
)
from mlx_slm.weights.registry import ModelRef
from tests.forward_parity import ARCHS, Tiny, check_diff

TOL = 1e-3


MAX_DIFF: dict[str, float] = {}  # arch/case/ops -> max |diff| seen (in the run's summary: conftest)


@pytest.fixture(scope="module", params=ARCHS)
def tiny(request, tiny_arch) -> Tiny:
    return Tiny(request.param, tiny_arch)


def _check(name: str, ours: np.ndarray, ref: np.ndarray, tol: float = TOL) -> None:
    check_diff(MAX_DIFF, name, ours, ref, tol)


def test_engine_features_after_a_prefix_cache(tiny):
    """The engine's features after the shared prefix KV and a left-padded batch: each row's
    equal to Transformers' hidden state of its whole prompt run alone."""
    from mlx_slm.engine.engine import Engine
    from mlx_slm.text import batching

    engine = Engine(load_model(tiny.mlx_dir), tiny.tok)
    head = tiny.prompts[0][:20]
    prefix, _ = engine.prefix(head)
    suffixes = [tiny.prompts[3][:30], tiny.prompts[1], [44]]
    batch = batching.pad(suffixes, np.arange(3), engine.pad_id, cache_len=len(head))
    n = len(engine.model.layers)
    got = engine.features(batch, prefix, [2, n], ("last", "mean"))
    for r, s in enumerate(suffixes):
        with torch.no_grad():
            hs = tiny.hf(torch.tensor([head + s]), output_hidden_states=True, use_cache=False).hidden_states
        _check(f"{tiny.arch}/engine-features", got["last"][r], np.stack([hs[2][0, -1].numpy(), hs[n][0, -1].numpy()]))
        # the mean over the row's own tokens (after the cached head), as a head that pools so reads it
        mean = np.stack([hs[x][0, len(head) :].double().mean(0).numpy() for x in (2, n)])
        _check(f"{tiny.arch}/engine-features-mean", got["mean"][r], mean)


def test_mean_features_skip_the_shared_head_without_the_prefix_cache(tiny):
    """A mean-pooled head reads the same features whether or not its rows continue the
    prefix KV: uncached rows leave out the shared head's tokens themselves."""
    from mlx_slm.engine.engine import Engine
    from mlx_slm.text import batching

    engine = Engine(load_model(tiny.mlx_dir), tiny.tok)
    head = tiny.prompts[0][:20]
    suffixes = [tiny.prompts[3][:30], tiny.prompts[1], [44]]
    prefix, _ = engine.prefix(head)
    n = len(engine.model.layers)
    cached = engine.features(
        batching.pad(suffixes, np.arange(3), engine.pad_id, cache_len=len(head)), prefix, [1, n], ("mean",)
    )
    whole = [head + s for s in suffixes]
    alone = engine.features(
        batching.pad(whole, np.arange(3), engine.pad_id), None, [1, n], ("mean",), np.full(3, len(head))
    )
    np.testing.assert_allclose(cached["mean"], alone["mean"], atol=2e-4, rtol=1e-3)


def test_engine_load_takes_a_model_ref_or_the_old_arguments(tiny_qwen_mlx):
    a = Engine.load(ModelRef(str(tiny_qwen_mlx), "float32"))
    b = Engine.load(str(tiny_qwen_mlx), "float32")
    assert a.compute_dtype == b.compute_dtype == "float32"
