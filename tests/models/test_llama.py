"""Llama (`models/llama.py`): the base blocks as they are, and the GGUF tensors llama.cpp stores with
its q and k rows permuted for interleaved RoPE, put back in Hugging Face's halves."""

from __future__ import annotations

import numpy as np

from mlx_slm.models import llama


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf permutation of q/k rows (what `unpermute` undoes)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def test_unpermute_undoes_llama_cpps_row_permutation():
    rng = np.random.default_rng(0)
    for n_head, shape in ((4, (32, 8)), (2, (16,))):  # a weight and a bias
        w = rng.normal(size=shape)
        assert np.array_equal(llama.unpermute(_permute(w, n_head), n_head), w)
        assert not np.array_equal(_permute(w, n_head), w)


def test_gguf_tensor_unpermutes_q_and_k_by_their_own_head_counts_only():
    config = {"num_attention_heads": 4, "num_key_value_heads": 2}
    q, k, v = (np.arange(32 * 3, dtype=np.float32).reshape(32, 3) + i for i in range(3))
    layer = "model.layers.0.self_attn."
    assert np.array_equal(llama.gguf_tensor(layer + "q_proj.weight", _permute(q, 4), config), q)
    assert np.array_equal(llama.gguf_tensor(layer + "k_proj.weight", _permute(k, 2), config), k)
    assert llama.gguf_tensor(layer + "v_proj.weight", v, config) is v


def test_a_tiny_llama_loads_with_the_base_blocks(tiny_arch):
    from mlx_slm.models import load_model

    m = load_model(tiny_arch.mlx("llama"))
    attn = m.model.layers[0].self_attn
    assert type(m) is llama.Model and not hasattr(attn, "q_norm")
    assert "bias" not in attn.q_proj and "bias" not in attn.o_proj  # no attention_bias in its config
