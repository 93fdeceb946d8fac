"""Llama (and Llama-shaped: SmolLM2, TinyLlama, ...): the base blocks as they are.

q/k/v/o biases when the config says `attention_bias`; tied or separate LM head.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from . import base
from .base import ModelArgs as BaseArgs

HF_ARCHITECTURE = "LlamaForCausalLM"
SEQCLS_ARCHITECTURE = "LlamaForSequenceClassification"  # what `weights.export` writes
GGUF_ARCH = "llama"


class ModelArgs(BaseArgs):
    pass


class Model(base.Model):
    block_class = base.TransformerBlock


# --------------------------------------------------------------------------- GGUF

GGUF_LAYER_NAMES = base.GGUF_LAYER_NAMES


def gguf_config(meta: Callable[..., Any], shapes: dict[str, tuple[int, ...]]) -> dict[str, Any]:
    cfg = base.gguf_llama_config(meta, shapes)
    cfg["attention_bias"] = "blk.0.attn_q.bias" in shapes
    return cfg


def unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation (interleaved RoPE) back to Hugging Face's halves."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def gguf_tensor(name: str, w: np.ndarray, config: dict[str, Any]) -> np.ndarray:
    """llama.cpp stores Llama's q and k rows permuted for its interleaved RoPE: undo it."""
    if name.endswith(("q_proj.weight", "q_proj.bias")):
        return unpermute(w, config["num_attention_heads"])
    if name.endswith(("k_proj.weight", "k_proj.bias")):
        return unpermute(w, config["num_key_value_heads"])
    return w
