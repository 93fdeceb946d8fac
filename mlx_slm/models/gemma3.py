"""Gemma 3 text models (`gemma3_text`, and the text part of a multimodal `gemma3`).

What differs from Llama, each matched to transformers' `modeling_gemma3.py`:

* embeddings scaled by sqrt(hidden), the scale rounded to the compute dtype first;
* RMSNorm with (1 + w), applied before *and after* attention and the MLP, and per head
  on q and k before RoPE;
* a GELU-tanh gated MLP (`gelu_pytorch_tanh`);
* attention scaled by query_pre_attn_scalar^-0.5, not head_dim^-0.5;
* sliding-window layers (`layer_types`, or every layer but each `sliding_window_pattern`-th)
  with their own RoPE base (`rope_local_base_freq`); global layers use `rope_theta` and
  its linear `rope_scaling` if any;
* final logit softcapping when the config sets it; a tied head by default.

`attn_logit_softcapping` is read and not applied: transformers' Gemma 3 attention never
passes it on (and llama.cpp's converter refuses a Gemma 3 config that sets it).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import numpy as np
from mlx import nn

from ..ground.errors import ModelError
from . import base
from .base import FULL, SLIDING, Context

HF_ARCHITECTURE = "Gemma3ForCausalLM"
HF_MODEL_TYPE = "gemma3_text"  # what a converted GGUF's config.json says
GGUF_ARCH = "gemma3"
TRAINED_DTYPE = "bfloat16"  # half precision on a GPU when the checkpoint does not say (float16 overflows)
GELU_TANH = ("gelu_pytorch_tanh", "gelu_new", "gelu_fast")  # the same tanh formula in transformers


@dataclass
class ModelArgs(base.ModelArgs):
    head_dim: int | None = 256
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    rope_local_base_freq: float = 10_000.0
    rope_local_scale: float = 1.0
    query_pre_attn_scalar: float = 256.0
    final_logit_softcapping: float | None = None
    tie_word_embeddings: bool = True
    max_position_embeddings: int = 131_072
    sliding_window: int | None = 4096

    @classmethod
    def normalize(cls, cfg: dict[str, Any]) -> dict[str, Any]:
        if isinstance(cfg.get("text_config"), dict):  # the multimodal Gemma3Config: its text part
            top = cfg
            cfg = {**cfg["text_config"]}
            cfg["model_type"] = top["model_type"]
            if "tie_word_embeddings" not in cfg and "tie_word_embeddings" in top:
                cfg["tie_word_embeddings"] = top["tie_word_embeddings"]
        if cfg.get("use_bidirectional_attention"):
            raise ModelError(
                "Gemma 3 with bidirectional attention (an embedding model) is not a causal LM: not supported"
            )
        act = cfg.get("hidden_activation") or cfg.get("hidden_act") or "gelu_pytorch_tanh"
        if act not in GELU_TANH:
            raise ModelError(f"Gemma 3 activation {act!r} is not supported (gelu_pytorch_tanh only)")
        if cfg.get("mlp_bias"):
            raise ModelError("MLP biases are not supported")
        params = cfg.get("rope_parameters")
        if isinstance(params, dict) and (FULL in params or SLIDING in params):  # transformers 5
            cfg["rope_theta"], cfg["rope_scale"] = base.rope_settings(params.get(FULL), cfg.get("rope_theta"), 1e6)
            cfg["rope_local_base_freq"], cfg["rope_local_scale"] = base.rope_settings(
                params.get(SLIDING), cfg.get("rope_local_base_freq"), 1e4
            )
        else:  # transformers 4: rope_theta + rope_scaling (global layers), rope_local_base_freq
            cfg["rope_theta"], cfg["rope_scale"] = base.rope_settings(
                params or cfg.get("rope_scaling"), cfg.get("rope_theta"), 1e6
            )
            cfg["rope_local_base_freq"], cfg["rope_local_scale"] = float(cfg.get("rope_local_base_freq") or 1e4), 1.0
        if cfg.get("layer_types") is None:
            n = int(cfg["num_hidden_layers"])
            pattern = int(cfg.get("sliding_window_pattern") or cfg.get("_sliding_window_pattern") or 6)
            cfg["layer_types"] = [SLIDING if (i + 1) % pattern else FULL for i in range(n)]
        return cfg

    def rope(self, layer_type: str) -> tuple[float, float]:
        if layer_type == SLIDING:
            return self.rope_local_base_freq, self.rope_local_scale
        return self.rope_theta, self.rope_scale


class RMSNorm(nn.Module):
    """Gemma's RMSNorm: x / rms(x) * (1 + w) (the weights are stored centred on 0)."""

    def __init__(self, dims: int, eps: float = 1e-6):
        super().__init__()
        self.weight = mx.zeros((dims,))
        self.eps = eps

    def __call__(self, x: mx.array) -> mx.array:
        return mx.fast.rms_norm(x, 1.0 + self.weight, self.eps)


class Attention(base.Attention):
    def __init__(self, args: ModelArgs, layer_type: str = FULL):
        super().__init__(args, layer_type)
        self.q_norm = RMSNorm(args.head_dim, eps=args.rms_norm_eps)
        self.k_norm = RMSNorm(args.head_dim, eps=args.rms_norm_eps)

    def attention_scale(self, args: ModelArgs) -> float:
        return args.query_pre_attn_scalar**-0.5

    def qk_norm(self, q: mx.array, k: mx.array) -> tuple[mx.array, mx.array]:
        return self.q_norm(q), self.k_norm(k)


class MLP(base.MLP):
    def __call__(self, x: mx.array, ops: base.Ops) -> mx.array:
        return self.down_proj(ops.gelu_tanh_mul(self.gate_proj(x), self.up_proj(x)))


def _add(x: mx.array, y: mx.array) -> mx.array:
    """x + y; in float16 summed in float32 and clipped to float16's range (as mlx-lm does):
    Gemma's residual stream outgrows float16 otherwise."""
    if x.dtype != mx.float16:
        return x + y
    bound = float(np.finfo(np.float16).max)
    return mx.clip(x.astype(mx.float32) + y.astype(mx.float32), -bound, bound).astype(mx.float16)


class TransformerBlock(nn.Module):
    def __init__(self, args: ModelArgs, layer_idx: int):
        super().__init__()
        self.layer_type = args.layer_types[layer_idx]
        self.self_attn = Attention(args, self.layer_type)
        self.mlp = MLP(args.hidden_size, args.intermediate_size)
        d, eps = args.hidden_size, args.rms_norm_eps
        self.input_layernorm = RMSNorm(d, eps)
        self.post_attention_layernorm = RMSNorm(d, eps)
        self.pre_feedforward_layernorm = RMSNorm(d, eps)
        self.post_feedforward_layernorm = RMSNorm(d, eps)

    def __call__(self, x: mx.array, ctx: Context, cache: base.KV | None, last_only: bool) -> tuple[mx.array, base.KV]:
        r, kv = self.self_attn(self.input_layernorm(x), ctx, cache, last_only)
        h = _add(x[:, -1:] if last_only else x, self.post_attention_layernorm(r))
        r = self.mlp(self.pre_feedforward_layernorm(h), ctx.ops)
        return _add(h, self.post_feedforward_layernorm(r)), kv


class Model(base.Model):
    block_class = TransformerBlock
    norm_class = RMSNorm

    def embed(self, ids: mx.array) -> mx.array:
        h = self.model.embed_tokens(ids)
        # transformers: embed_scale (a float32 buffer) cast to the weights' dtype, then multiplied
        return h * mx.array(math.sqrt(self.args.hidden_size), dtype=mx.float32).astype(h.dtype)

    def logits(self, hidden: mx.array, rows: mx.array | None = None) -> mx.array:
        out = super().logits(hidden, rows)
        cap = self.args.final_logit_softcapping
        if cap:
            out = mx.tanh(out / cap) * cap
        return out


def sanitize(weights: dict[str, mx.array], args: ModelArgs) -> dict[str, mx.array]:
    """The text model's tensors under Llama-style names (multimodal checkpoints: drop the vision parts)."""
    out: dict[str, mx.array] = {}
    for k, v in weights.items():
        if k.startswith(
            ("vision_tower.", "multi_modal_projector.", "model.vision_tower.", "model.multi_modal_projector.")
        ):
            continue
        for old, new in (
            ("language_model.model.", "model."),
            ("model.language_model.", "model."),
            ("language_model.lm_head.", "lm_head."),
        ):
            if k.startswith(old):
                k = new + k[len(old) :]
                break
        out[k] = v
    return base.sanitize(out, args)


def flops_per_token(args: ModelArgs) -> float:
    return base.flops_per_token(args)


# --------------------------------------------------------------------------- GGUF

GGUF_LAYER_NAMES = {
    **base.GGUF_LAYER_NAMES,
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}


def gguf_config(meta: Callable[..., Any], shapes: dict[str, tuple[int, ...]]) -> dict[str, Any]:
    """As llama.cpp reads a Gemma 3 GGUF: local RoPE base 10,000 and a sliding layer pattern
    of 6 unless stated, and the attention scale 1/sqrt(head_dim) except for the 27B model
    (62 layers), whose query_pre_attn_scalar is hidden / heads."""
    cfg = base.gguf_llama_config(meta, shapes)
    cfg["rope_theta"] = float(meta("rope.freq_base", 1_000_000.0))
    cfg["rope_local_base_freq"] = float(meta("rope.freq_base_swa", 10_000.0))
    cfg["sliding_window"] = int(meta("attention.sliding_window", 4096))
    pattern = meta("attention.sliding_window_pattern", 6)
    if isinstance(pattern, (list, tuple)):  # per-layer flags: true = sliding
        cfg["layer_types"] = [SLIDING if p else FULL for p in pattern]
    else:
        cfg["sliding_window_pattern"] = int(pattern)
        n = cfg["num_hidden_layers"]
        cfg["layer_types"] = [SLIDING if (i + 1) % int(pattern) else FULL for i in range(n)]
    scaling = meta("rope.scaling.type")
    if scaling not in (None, "none"):
        if scaling != "linear":
            raise ModelError(f"Gemma 3 GGUF with RoPE scaling {scaling!r} is not supported (linear only)")
        cfg["rope_scaling"] = {"rope_type": "linear", "factor": float(meta("rope.scaling.factor"))}
    heads = cfg["num_attention_heads"]
    cfg["query_pre_attn_scalar"] = cfg["hidden_size"] // heads if cfg["num_hidden_layers"] == 62 else cfg["head_dim"]
    cap = meta("final_logit_softcapping")
    if cap is not None:
        cfg["final_logit_softcapping"] = float(cap)
    cfg["hidden_activation"] = "gelu_pytorch_tanh"
    return cfg


def gguf_tensor(name: str, w: np.ndarray, config: dict[str, Any]) -> np.ndarray:
    """llama.cpp stores Gemma's norm weights as 1 + w (its RMSNorm multiplies by w): undo it."""
    if name.endswith("norm.weight"):
        return w - np.float32(1.0)
    return w
