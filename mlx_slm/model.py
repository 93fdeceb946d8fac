"""The transformer forward for `qwen2` and `llama` checkpoints, written for scoring.

It follows mlx-lm's `models/qwen2.py` and `models/llama.py` (same weight names, so a
directory we convert also loads in mlx-lm), and differs where classification needs it:

* **Explicit masks and per-row positions.** Batches are left padded. Each row carries
  its own RoPE offset, so a real token gets exactly the position it has when its
  prompt runs alone, and a boolean mask keeps padding from ever being attended.
* **A prefix KV cache that is shared, never copied into.** Keys and values of the
  shared prompt head (batch 1) are broadcast along the batch axis for each batch.
* **Only what is read is computed.** In the last layer only the last position needs
  queries, attention output and the MLP (every position still needs K and V), and the
  LM head is applied to the last position and, when asked, only to the label rows.

The two architectures differ only in q/k/v biases (qwen2) and tied embeddings.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from . import fastmath
from .errors import ModelError

SUPPORTED_ARCHITECTURES = ("qwen2", "llama")

# One layer's keys and values, each (B, n_kv_heads, S, head_dim).
KV = tuple[mx.array, mx.array]


@dataclass
class ModelArgs:
    model_type: str
    hidden_size: int
    num_hidden_layers: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    head_dim: int | None = None
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    max_position_embeddings: int = 32768
    extra: dict[str, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.model_type not in SUPPORTED_ARCHITECTURES:
            raise ModelError(
                f"unsupported architecture {self.model_type!r}; supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads

    @classmethod
    def from_dict(cls, config: dict[str, Any]) -> "ModelArgs":
        """Build from a Hugging Face `config.json` dict (transformers 4 or 5 layout)."""
        cfg = dict(config)
        # transformers 5 moves RoPE settings into `rope_parameters`; 4 keeps `rope_theta`/`rope_scaling`.
        rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type not in ("default", None):
            raise ModelError(f"RoPE scaling {rope_type!r} is not supported (only plain RoPE)")
        if "rope_theta" not in cfg and "rope_theta" in rope:
            cfg["rope_theta"] = rope["rope_theta"]
        if cfg.get("model_type") == "qwen2":
            cfg.setdefault("attention_bias", True)  # Qwen2 always has q/k/v biases
        if cfg.get("mlp_bias"):
            raise ModelError("MLP biases are not supported")
        names = {f.name for f in fields(cls)} - {"extra"}
        known = {k: v for k, v in cfg.items() if k in names and v is not None}
        return cls(**known, extra={k: v for k, v in cfg.items() if k not in names})

    @classmethod
    def from_dir(cls, path: str | Path) -> "ModelArgs":
        return cls.from_dict(json.loads((Path(path) / "config.json").read_text()))


class Attention(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        d, hd = args.hidden_size, args.head_dim
        self.n_heads, self.n_kv_heads, self.head_dim = args.num_attention_heads, args.num_key_value_heads, hd
        self.scale = hd**-0.5
        self.rope_theta = args.rope_theta
        bias = args.attention_bias
        self.q_proj = nn.Linear(d, self.n_heads * hd, bias=bias)
        self.k_proj = nn.Linear(d, self.n_kv_heads * hd, bias=bias)
        self.v_proj = nn.Linear(d, self.n_kv_heads * hd, bias=bias)
        self.o_proj = nn.Linear(self.n_heads * hd, d, bias=False)

    def _rope(self, x: mx.array, offsets: mx.array) -> mx.array:
        # Vector offsets: row r starts at its own position (prefix length minus its padding).
        return mx.fast.rope(x, self.head_dim, traditional=False, base=self.rope_theta, scale=1.0, offset=offsets)

    def __call__(
        self, x: mx.array, offsets: mx.array, mask: mx.array, cache: KV | None, last_only: bool, cpu_math: bool
    ) -> tuple[mx.array, KV]:
        B, L, _ = x.shape
        xq = x[:, -1:] if last_only else x
        Lq = xq.shape[1]
        q = self.q_proj(xq).reshape(B, Lq, self.n_heads, -1).transpose(0, 2, 1, 3)
        k = self.k_proj(x).reshape(B, L, self.n_kv_heads, -1).transpose(0, 2, 1, 3)
        v = self.v_proj(x).reshape(B, L, self.n_kv_heads, -1).transpose(0, 2, 1, 3)
        q = self._rope(q, offsets + (L - Lq))
        k = self._rope(k, offsets)
        if cache is not None:
            ck, cv = cache
            if ck.shape[0] != B:  # the shared prefix: batch 1, broadcast (never written to)
                ck = mx.broadcast_to(ck, (B, *ck.shape[1:]))
                cv = mx.broadcast_to(cv, (B, *cv.shape[1:]))
            k = mx.concatenate([ck, k], axis=2)
            v = mx.concatenate([cv, v], axis=2)
        if cpu_math:  # mask is the additive float32 bias here
            out = fastmath.attention(q, k, v, self.scale, mask, causal=True)  # build_mask is causal
        else:
            out = mx.fast.scaled_dot_product_attention(q, k, v, scale=self.scale, mask=mask)
        out = out.transpose(0, 2, 1, 3).reshape(B, Lq, -1)
        return self.o_proj(out), (k, v)


class MLP(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=False)
        self.up_proj = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)

    def __call__(self, x: mx.array, cpu_math: bool = False) -> mx.array:
        g, u = self.gate_proj(x), self.up_proj(x)
        return self.down_proj(fastmath.silu_mul(g, u) if cpu_math else nn.silu(g) * u)


class TransformerBlock(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.self_attn = Attention(args)
        self.mlp = MLP(args.hidden_size, args.intermediate_size)
        self.input_layernorm = nn.RMSNorm(args.hidden_size, eps=args.rms_norm_eps)
        self.post_attention_layernorm = nn.RMSNorm(args.hidden_size, eps=args.rms_norm_eps)

    def __call__(
        self, x: mx.array, offsets: mx.array, mask: mx.array, cache: KV | None, last_only: bool,
        cpu_math: bool = False,
    ) -> tuple[mx.array, KV]:
        r, kv = self.self_attn(self.input_layernorm(x), offsets, mask, cache, last_only, cpu_math)
        h = (x[:, -1:] if last_only else x) + r
        return h + self.mlp(self.post_attention_layernorm(h), cpu_math), kv


class LanguageModel(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.embed_tokens = nn.Embedding(args.vocab_size, args.hidden_size)
        self.layers = [TransformerBlock(args) for _ in range(args.num_hidden_layers)]
        self.norm = nn.RMSNorm(args.hidden_size, eps=args.rms_norm_eps)


def build_mask(
    attention_mask: mx.array, cache_mask: mx.array | None, cache_len: int, last_only: bool
) -> mx.array:
    """Boolean (B, 1, Lq, C+L) mask: a query sees real cached keys and real earlier new keys.

    Every query also sees itself, so a padding row never has all keys masked: a fully
    masked softmax gives NaN, and NaN times a zero weight is still NaN in the next layer.
    """
    B, L = attention_mask.shape
    real = attention_mask.astype(mx.bool_)
    idx = mx.arange(L)
    causal = idx[:, None] >= idx[None, :]  # (L, L)
    new = (causal[None] & real[:, None, :]) | (idx[:, None] == idx[None, :])[None]  # (B, L, L)
    if cache_len:
        if cache_mask is None:
            old = mx.ones((B, L, cache_len), dtype=mx.bool_)
        else:
            old = mx.broadcast_to(cache_mask.astype(mx.bool_)[:, None, :], (B, L, cache_len))
        new = mx.concatenate([old, new], axis=2)
    if last_only:
        new = new[:, -1:]
    return new[:, None]


class Model(nn.Module):
    """A causal LM that returns final hidden states, and logits only for the rows asked."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.model_type = args.model_type
        # None: numpy's vectorized SiLU and softmax on the CPU in float32 (fastmath), native ops
        # elsewhere; True/False force it (parity tests run both).
        self.cpu_math: bool | None = None
        self.model = LanguageModel(args)
        if not args.tie_word_embeddings:
            self.lm_head = nn.Linear(args.hidden_size, args.vocab_size, bias=False)

    @property
    def layers(self) -> list[TransformerBlock]:
        return self.model.layers

    def __call__(
        self,
        ids: mx.array,
        attention_mask: mx.array | None = None,
        offsets: mx.array | None = None,
        cache: list[KV] | None = None,
        cache_mask: mx.array | None = None,
        last_only: bool = True,
    ) -> tuple[mx.array, list[KV]]:
        """Run token ids (B, L) after an optional cache; return normed hidden states and KV.

        attention_mask: (B, L), 1 for real tokens, 0 for left padding (default: all real).
        offsets: (B,) RoPE position of column 0 of each row: cache length minus the row's
            padding, so real tokens keep their unbatched positions (default: cache length).
        cache: per-layer (K, V) with batch B or 1 (a shared prefix, broadcast).
        cache_mask: (B or 1, C) real cached keys (default: all real).
        Returns hidden (B, D) at the last position if `last_only`, else (B, L, D), and
        the per-layer KV of cache + these tokens (to extend with label tokens).
        """
        B, L = ids.shape
        cache_len = 0 if cache is None else cache[0][0].shape[2]
        if attention_mask is None:
            attention_mask = mx.ones((B, L), dtype=mx.bool_)
        if offsets is None:
            offsets = mx.full((B,), cache_len, dtype=mx.int32)
        n = len(self.layers)
        fast = self.use_cpu_math()
        # Masks are built once per call, not per layer: one for all positions, one for the last.
        full_mask = build_mask(attention_mask, cache_mask, cache_len, last_only=False) if (n > 1 or not last_only) else None
        last_mask = build_mask(attention_mask, cache_mask, cache_len, last_only=True) if last_only else None
        if fast:
            full_mask = None if full_mask is None else fastmath.additive_mask(full_mask)
            last_mask = None if last_mask is None else fastmath.additive_mask(last_mask)
        h = self.model.embed_tokens(ids)
        new_cache: list[KV] = []
        for i, layer in enumerate(self.layers):
            final = last_only and i == n - 1
            mask = last_mask if final else full_mask
            h, kv = layer(h, offsets, mask, None if cache is None else cache[i], final, fast)
            new_cache.append(kv)
        h = self.model.norm(h)
        return (h[:, -1] if last_only else h), new_cache

    def use_cpu_math(self) -> bool:
        on_cpu_f32 = mx.default_device() == mx.cpu and self.head_weight().dtype == mx.float32
        return on_cpu_f32 if self.cpu_math is None else (self.cpu_math and on_cpu_f32)

    def head_weight(self) -> mx.array:
        return self.model.embed_tokens.weight if self.args.tie_word_embeddings else self.lm_head.weight

    def logits(self, hidden: mx.array, rows: mx.array | None = None) -> mx.array:
        """Project hidden states onto the vocabulary, or only onto `rows` (e.g. label tokens)."""
        w = self.head_weight()
        if rows is not None:
            w = mx.take(w, rows, axis=0)
        return hidden @ w.T

    @staticmethod
    def sanitize(weights: dict[str, mx.array], args: ModelArgs) -> dict[str, mx.array]:
        """Drop tensors the forward does not use (rotary caches, a tied LM head copy)."""
        out = {k: v for k, v in weights.items() if "rotary_emb.inv_freq" not in k}
        if args.tie_word_embeddings:
            out.pop("lm_head.weight", None)
        return out


def default_compute_dtype() -> mx.Dtype:
    """float16 on Metal and CUDA; float32 on the CPU, where MLX has no fast half-precision matmul."""
    return mx.float16 if mx.default_device() == mx.gpu else mx.float32


def load_model(path: str | Path, dtype: mx.Dtype | None = None) -> Model:
    """Load a converted MLX directory (config.json + *.safetensors), cast to the compute dtype."""
    path = Path(path)
    args = ModelArgs.from_dir(path)
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ModelError(f"no *.safetensors in {path}: convert the checkpoint first (mlx-slm convert)")
    weights: dict[str, mx.array] = {}
    for f in files:
        weights.update(mx.load(str(f)))
    weights = Model.sanitize(weights, args)
    dtype = dtype or default_compute_dtype()
    weights = {k: v.astype(dtype) for k, v in weights.items()}
    model = Model(args)
    model.load_weights(list(weights.items()), strict=True)
    model.eval()
    mx.eval(model.parameters())
    return model
