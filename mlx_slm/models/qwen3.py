"""Qwen3 (dense): Llama's blocks with a per-head RMSNorm on q and k before RoPE.

No q/k/v biases (unless `attention_bias`), head_dim from the config (it need not be
hidden / heads), sliding-window layers as transformers reads them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import mlx.core as mx
import numpy as np
from mlx import nn

from . import base
from .base import ModelArgs as BaseArgs

HF_ARCHITECTURE = "Qwen3ForCausalLM"
SEQCLS_ARCHITECTURE = "Qwen3ForSequenceClassification"  # what `weights.export` writes
GGUF_ARCH = "qwen3"


class ModelArgs(BaseArgs):
    @classmethod
    def normalize(cls, cfg: dict[str, Any]) -> dict[str, Any]:
        cfg = super().normalize(cfg)
        cfg.setdefault("head_dim", 128)  # transformers' Qwen3Config default, not hidden / heads
        cfg["layer_types"], cfg["sliding_window"] = base.qwen_layer_types(cfg)
        return cfg


class Attention(base.Attention):
    def __init__(self, args: ModelArgs, layer_type: str = base.FULL):
        super().__init__(args, layer_type)
        self.q_norm = nn.RMSNorm(args.head_dim, eps=args.rms_norm_eps)
        self.k_norm = nn.RMSNorm(args.head_dim, eps=args.rms_norm_eps)

    def qk_norm(self, q: mx.array, k: mx.array) -> tuple[mx.array, mx.array]:
        return self.q_norm(q), self.k_norm(k)


class TransformerBlock(base.TransformerBlock):
    attention_class = Attention


class Model(base.Model):
    block_class = TransformerBlock


# --------------------------------------------------------------------------- GGUF

GGUF_LAYER_NAMES = {**base.GGUF_LAYER_NAMES, "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"}


def gguf_config(meta: Callable[..., Any], shapes: dict[str, tuple[int, ...]]) -> dict[str, Any]:
    cfg = base.gguf_llama_config(meta, shapes)
    cfg["attention_bias"] = "blk.0.attn_q.bias" in shapes
    return cfg


def gguf_tensor(name: str, w: np.ndarray, config: dict[str, Any]) -> np.ndarray:
    return w  # NEOX RoPE in llama.cpp: no permutation
