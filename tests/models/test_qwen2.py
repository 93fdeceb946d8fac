"""Qwen2 / Qwen2.5 (`models/qwen2.py`): Llama's blocks with q/k/v biases and none on o_proj, whatever the
config says, and its GGUF tensors taken as they are (NEOX RoPE: no permutation)."""

from __future__ import annotations

import numpy as np

from mlx_slm.models import load_model, qwen2


def test_the_config_always_gives_q_k_v_biases():
    cfg = qwen2.ModelArgs.normalize({"hidden_size": 64, "num_attention_heads": 4, "attention_bias": False})
    assert cfg["attention_bias"] is True


def test_a_tiny_qwen2_has_q_k_v_biases_and_none_on_o_proj(tiny_arch):
    m = load_model(tiny_arch.mlx("qwen2"))
    attn = m.model.layers[0].self_attn
    assert type(m) is qwen2.Model
    assert all("bias" in getattr(attn, p) for p in ("q_proj", "k_proj", "v_proj"))
    assert "bias" not in attn.o_proj


def test_gguf_tensors_are_taken_as_they_are():
    w = np.arange(12.0).reshape(4, 3)
    assert qwen2.gguf_tensor("model.layers.0.self_attn.q_proj.weight", w, {"num_attention_heads": 2}) is w
