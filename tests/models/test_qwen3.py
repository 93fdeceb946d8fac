"""Qwen3 (`models/qwen3.py`): Llama's blocks with a per-head RMSNorm on q and k before RoPE, head_dim
from the config (transformers' default 128, not hidden / heads), and the norms' GGUF names."""

from __future__ import annotations

from mlx_slm.models import load_model, qwen3


def test_head_dim_is_the_configs_or_transformers_default():
    base = {"hidden_size": 64, "num_attention_heads": 4}
    assert qwen3.ModelArgs.normalize(dict(base))["head_dim"] == 128
    assert qwen3.ModelArgs.normalize({**base, "head_dim": 32})["head_dim"] == 32


def test_a_tiny_qwen3_normalizes_q_and_k_per_head(tiny_arch):
    m = load_model(tiny_arch.mlx("qwen3"))
    attn = m.model.layers[0].self_attn
    assert type(m) is qwen3.Model
    assert attn.q_norm.weight.shape == (attn.head_dim,) and attn.k_norm.weight.shape == (attn.head_dim,)


def test_the_q_and_k_norms_have_their_gguf_names():
    assert qwen3.GGUF_LAYER_NAMES["attn_q_norm"] == "self_attn.q_norm"
    assert qwen3.GGUF_LAYER_NAMES["attn_k_norm"] == "self_attn.k_norm"
