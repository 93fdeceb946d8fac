"""Qwen2 / Qwen2.5: Llama's blocks with q/k/v biases (and none on o_proj).

Sliding-window layers (`use_sliding_window`, off in every released Qwen2.5) are read as
transformers reads them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from . import base
from .base import ModelArgs as BaseArgs

HF_ARCHITECTURE = "Qwen2ForCausalLM"
SEQCLS_ARCHITECTURE = "Qwen2ForSequenceClassification"  # what `weights.export` writes
GGUF_ARCH = "qwen2"


class ModelArgs(BaseArgs):
    @classmethod
    def normalize(cls, cfg: dict[str, Any]) -> dict[str, Any]:
        cfg = super().normalize(cfg)
        cfg["attention_bias"] = True  # Qwen2 always has q/k/v biases
        cfg["layer_types"], cfg["sliding_window"] = base.qwen_layer_types(cfg)
        return cfg


class Attention(base.Attention):
    def __init__(self, args: ModelArgs, layer_type: str = base.FULL):
        super().__init__(args, layer_type, o_bias=False)


class TransformerBlock(base.TransformerBlock):
    attention_class = Attention


class Model(base.Model):
    block_class = TransformerBlock


# --------------------------------------------------------------------------- GGUF

GGUF_LAYER_NAMES = base.GGUF_LAYER_NAMES


def gguf_config(meta: Callable[..., Any], shapes: dict[str, tuple[int, ...]]) -> dict[str, Any]:
    return base.gguf_llama_config(meta, shapes)


def gguf_tensor(name: str, w: np.ndarray, config: dict[str, Any]) -> np.ndarray:
    return w  # llama.cpp runs Qwen2 with NEOX (half-split) RoPE: no permutation
