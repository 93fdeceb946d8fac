"""What every architecture shares: arguments, masks, positions, the prefix KV, the head.

Each architecture file (`qwen2.py`, `llama.py`, ...) holds only what makes it different
(its blocks, its config quirks, its weight and GGUF names); the forward contract and the
scoring-specific parts live here, once:

* **Explicit masks and per-row positions.** Batches are left padded. Each row carries
  its own RoPE offset, so a real token gets exactly the position it has when its
  prompt runs alone, and a boolean mask keeps padding from ever being attended.
  Sliding-window layers get their own mask, built from those same RoPE positions.
* **A prefix KV cache that is shared, never copied into.** Keys and values of the
  shared prompt head (batch 1) are broadcast along the batch axis for each batch.
* **Only what is read is computed.** In the last layer only the last position needs
  queries, attention output and the MLP (every position still needs K and V), and the
  LM head is applied to the last position and, when asked, only to the label rows.
* **The CPU math is chosen once.** An `Ops` object (native MLX ops, or numpy's vectorized
  exp for the softmax and the gated activations: `fastmath`) is picked when the model is
  loaded, by device and dtype, and every layer reads it from the forward's `Context`.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import Any, ClassVar

import mlx.core as mx
from mlx import nn

from ..ground.errors import ModelError
from ..text.seqcls import SCORE_WEIGHT, SeqClsHead, check_head_tensor
from . import fastmath, quant

# One layer's keys and values, each (B, n_kv_heads, S, head_dim).
KV = tuple[mx.array, mx.array]

FULL = "full_attention"
SLIDING = "sliding_attention"
LAYER_TYPES = (FULL, SLIDING)


# --------------------------------------------------------------------------- arguments


def rope_settings(params: dict[str, Any] | None, theta: float | None, default_theta: float) -> tuple[float, float]:
    """(base, position scale) of one RoPE, from a transformers 4 `rope_scaling` or 5 `rope_parameters` dict.

    Plain RoPE and linear scaling (positions divided by `factor`, as transformers'
    "linear" type divides the inverse frequencies) are computed; anything else is refused.
    """
    params = dict(params or {})
    rope_type = params.get("rope_type", params.get("type")) or "default"
    base = params.get("rope_theta", theta if theta is not None else default_theta)
    if float(params.get("partial_rotary_factor", 1.0)) != 1.0:
        raise ModelError("partial rotary embeddings (partial_rotary_factor < 1) are not supported")
    if rope_type == "default":
        return float(base), 1.0
    if rope_type == "linear":
        return float(base), 1.0 / float(params["factor"])
    raise ModelError(f"RoPE scaling {rope_type!r} is not supported (plain or linear RoPE only)")


def qwen_layer_types(cfg: dict[str, Any]) -> tuple[list[str] | None, int | None]:
    """(layer_types, sliding_window) of a Qwen2/Qwen3 config, as transformers reads it.

    The window is used only with `use_sliding_window`; then the layers from
    `max_window_layers` on slide (unless the config lists `layer_types` itself).
    """
    window = cfg.get("sliding_window") if cfg.get("use_sliding_window") else None
    types = cfg.get("layer_types")
    if types is None and window is not None:
        first = int(cfg.get("max_window_layers", 28))
        types = [SLIDING if i >= first else FULL for i in range(int(cfg["num_hidden_layers"]))]
    if types is not None and SLIDING in types and window is None:
        types = [FULL] * len(types)  # transformers drops the window when use_sliding_window is off
    return types, window


@dataclass
class ModelArgs:
    """The fields every architecture reads; architectures subclass it with their own."""

    model_type: str
    hidden_size: int
    num_hidden_layers: int
    intermediate_size: int
    num_attention_heads: int
    vocab_size: int
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scale: float = 1.0  # RoPE positions are multiplied by this (linear scaling: 1 / factor)
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    max_position_embeddings: int = 32768
    sliding_window: int | None = None
    layer_types: list[str] | None = None  # per layer: "full_attention" or "sliding_attention"
    # A *ForSequenceClassification checkpoint's head (config.architectures): a `score` Linear
    # (num_labels x hidden) in place of the LM head. None: a causal LM.
    seqcls: SeqClsHead | None = None
    # A bare backbone (`Qwen3Model`, a sentence-transformers folder's weights without the `model.`
    # prefix): the final norm's hidden states and no LM head at all (`backbone`).
    backbone: bool = False

    def __post_init__(self) -> None:
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads
        if self.layer_types is None:
            self.layer_types = [FULL] * self.num_hidden_layers
        self.layer_types = list(self.layer_types)
        if len(self.layer_types) != self.num_hidden_layers or not set(self.layer_types) <= set(LAYER_TYPES):
            raise ModelError(
                f"layer_types must name {self.num_hidden_layers} layers, each one of {', '.join(LAYER_TYPES)}"
            )
        if SLIDING in self.layer_types and not self.sliding_window:
            raise ModelError("sliding-window layers need a sliding_window size in the config")

    @classmethod
    def from_dict(cls, config: dict[str, Any]) -> ModelArgs:
        """Build from a Hugging Face `config.json` dict (transformers 4 or 5 layout).

        On this base class the architecture's own `ModelArgs` is looked up by `model_type`."""
        if cls is ModelArgs:
            from . import get_model_module  # lazy: the registry imports every architecture, which imports this

            return get_model_module(config.get("model_type")).ModelArgs.from_dict(config)
        try:
            cfg = cls.normalize(dict(config))
        except (TypeError, ValueError, KeyError, AttributeError, IndexError) as e:  # a value of the wrong type
            raise ModelError(
                f"config.json holds a value {config.get('model_type')!r} configs cannot take ({type(e).__name__}: {e}): "
                "fix config.json (numbers as numbers, not strings), or use the checkpoint's own"
            ) from None
        cfg["seqcls"] = SeqClsHead.from_config(config)
        cfg["backbone"] = cfg["seqcls"] is None and backbone_architecture(config)
        cls.check_values(cfg)
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in cfg.items() if k in names and v is not None})

    @classmethod
    def check_values(cls, cfg: dict[str, Any]) -> None:
        """Refuse a field of the wrong type before anything computes with it (`"hidden_size": "64"`
        failed deep in the model's construction): sizes are whole numbers of at least 1, the
        other numbers finite and above 0, flags true or false, names strings."""

        for f in fields(cls):
            v = cfg.get(f.name)
            type_name = str(f.type).split(" ")[0].split("[")[0]
            if v is None or type_name not in ("int", "float", "bool", "str", "list"):
                continue
            if type_name == "int":
                ok, want = isinstance(v, int) and not isinstance(v, bool) and v >= 1, "a whole number of at least 1"
            elif type_name == "float":
                ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0
                want = "a finite number above 0"
            elif type_name == "bool":
                ok, want = isinstance(v, bool), "true or false"
            elif type_name == "str":
                ok, want = isinstance(v, str), "a string"
            else:
                ok, want = isinstance(v, list) and all(isinstance(x, str) for x in v), "a list of strings"
            if not ok:
                raise ModelError(
                    f"config.json: {f.name} is {v!r}, not {want}: fix it (a number as a number, not a string)"
                )

    @classmethod
    def normalize(cls, cfg: dict[str, Any]) -> dict[str, Any]:
        """Map the config onto our fields; refuse what the forward would not compute exactly."""
        # transformers 5 keeps RoPE settings in `rope_parameters`; 4 in `rope_theta`/`rope_scaling`.
        cfg["rope_theta"], cfg["rope_scale"] = rope_settings(
            cfg.get("rope_parameters") or cfg.get("rope_scaling"), cfg.get("rope_theta"), 10000.0
        )
        if cfg.get("mlp_bias"):
            raise ModelError("MLP biases are not supported")
        act = cfg.get("hidden_act", "silu")
        if act not in ("silu", "swish"):
            raise ModelError(f"activation {act!r} is not supported for {cfg.get('model_type')} (silu only)")
        return cfg

    def rope(self, layer_type: str) -> tuple[float, float]:
        """(base, position scale) of the RoPE of a layer of this type."""
        return self.rope_theta, self.rope_scale


# --------------------------------------------------------------------------- ops


class Ops:
    """The attention and gated-activation kernels of one forward: MLX's native fused ops.

    Chosen once when the model is loaded (`choose_ops`); assign `model.ops` to override."""

    name = "native"

    def mask(self, mask: mx.array) -> mx.array:
        """The boolean mask in the form `attention` takes (built once per forward)."""
        return mask

    def attention(self, q: mx.array, k: mx.array, v: mx.array, scale: float, mask: mx.array) -> mx.array:
        return mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask)

    def silu_mul(self, gate: mx.array, up: mx.array) -> mx.array:
        return nn.silu(gate) * up

    def gelu_tanh_mul(self, gate: mx.array, up: mx.array) -> mx.array:
        return nn.gelu_approx(gate) * up

    def room(self, tokens: int, keys: int, args: Any) -> Any:
        """A context for one forward of `tokens` rows x positions over `keys` keys (`fastmath.room`)."""
        return contextlib.nullcontext()

    def __repr__(self) -> str:
        return f"<ops {self.name}>"


class FastmathOps(Ops):
    """numpy's vectorized exp for the softmax and the gated activations (CPU, float32 only).

    `q` and `up` must be fresh arrays (the forward's own RoPE output and projection): the
    kernels write into their buffers."""

    name = "fastmath"

    def mask(self, mask: mx.array) -> mx.array:
        return fastmath.additive_mask(mask)

    def attention(self, q: mx.array, k: mx.array, v: mx.array, scale: float, mask: mx.array) -> mx.array:
        return fastmath.attention(q, k, v, scale, mask, causal=True)  # build_mask is causal

    def silu_mul(self, gate: mx.array, up: mx.array) -> mx.array:
        return fastmath.silu_mul(gate, up)

    def gelu_tanh_mul(self, gate: mx.array, up: mx.array) -> mx.array:
        return fastmath.gelu_tanh_mul(gate, up)

    def room(self, tokens: int, keys: int, args: Any) -> Any:
        return fastmath.room(tokens, keys, args.hidden_size, args.intermediate_size)


NATIVE = Ops()
FASTMATH = FastmathOps()
OPS = {"native": NATIVE, "fastmath": FASTMATH}


def choose_ops(dtype: mx.Dtype, device: Any = None, name: str | Ops | None = None) -> Ops:
    """The kernels for weights of `dtype` on `device` (default: MLX's default device).

    "auto"/None: numpy's vectorized exp on the CPU in float32 (MLX's CPU exp is a scalar
    loop), native fused ops everywhere else. "fastmath" where it cannot run is refused.
    """
    if isinstance(name, Ops):
        return name
    device = mx.default_device() if device is None else device
    fits = device == mx.cpu and dtype == mx.float32
    if name in (None, "auto"):
        return FASTMATH if fits else NATIVE
    if name not in OPS:
        raise ModelError(f"ops {name!r} is not one of auto, {', '.join(OPS)}")
    if name == "fastmath" and not fits:
        raise ModelError("the fastmath ops run on the CPU in float32 only")
    return OPS[name]


# --------------------------------------------------------------------------- masks


def key_positions(cache_mask: mx.array | None, cache_len: int) -> mx.array:
    """RoPE positions of cached keys, (1 or B, C): the real cached keys are the tokens
    before the new ones, in order, so a key's position is its rank among them."""
    if cache_mask is None:
        return mx.arange(cache_len, dtype=mx.int32)[None]
    return mx.cumsum(cache_mask.astype(mx.int32), axis=1) - 1


@dataclass(frozen=True)
class Tree:
    """New tokens laid out as a tree rather than one run per row (a label trie's nodes, questions'
    branches): `positions` (B, L), their explicit RoPE positions, replacing `offsets` (siblings
    share one); `visible` (L, L) or (B, L, L) bool, which new tokens each new token sees, replacing
    the causal pattern (a subset of it, ancestors first, as the attention kernels assume). Built
    once per forward by the caller; None in either field keeps the row's default."""

    positions: mx.array | None = None
    visible: mx.array | None = None


def build_mask(
    attention_mask: mx.array,
    cache_mask: mx.array | None,
    cache_len: int,
    last_only: bool,
    offsets: mx.array | None = None,
    window: int | None = None,
    tree: Tree | None = None,
) -> mx.array:
    """Boolean (B, 1, Lq, C+L) mask: a query sees real cached keys and real earlier new keys.

    Every query also sees itself, so a padding row never has all keys masked: a fully
    masked softmax gives NaN, and NaN times a zero weight is still NaN in the next layer.
    With a sliding `window`, a query at RoPE position p sees only keys at positions
    > p - window; new tokens are at `tree.positions` (default `offsets + column`), cached keys
    at their rank among the real cached keys (`key_positions`). `tree.visible` (L, L) replaces
    the causal pattern among the new tokens (a label trie: each node sees its ancestors).
    """
    positions = None if tree is None else tree.positions
    visible = None if tree is None else tree.visible
    B, L = attention_mask.shape
    real = attention_mask.astype(mx.bool_)
    idx = mx.arange(L)
    causal = visible.astype(mx.bool_) if visible is not None else idx[:, None] >= idx[None, :]  # (L, L) or (B, L, L)
    if causal.ndim == 2:
        causal = causal[None]
    new = (causal & real[:, None, :]) | (idx[:, None] == idx[None, :])[None]  # (B, L, L)
    if cache_len:
        if cache_mask is None:
            old = mx.ones((B, L, cache_len), dtype=mx.bool_)
        else:
            old = mx.broadcast_to(cache_mask.astype(mx.bool_)[:, None, :], (B, L, cache_len))
        new = mx.concatenate([old, new], axis=2)
    if window is not None:
        if positions is not None:
            qpos = positions.astype(mx.int32)
        else:
            if offsets is None:
                offsets = mx.full((B,), cache_len, dtype=mx.int32)
            qpos = offsets.astype(mx.int32)[:, None] + idx.astype(mx.int32)[None]  # (B, L)
        kpos = qpos
        if cache_len:
            cpos = mx.broadcast_to(key_positions(cache_mask, cache_len), (B, cache_len))
            kpos = mx.concatenate([cpos, qpos], axis=1)
        new = new & ((qpos[:, :, None] - kpos[:, None, :]) < window)  # keeps the diagonal (0 < window)
    if last_only:
        new = new[:, -1:]
    return new[:, None]


class Context:
    """What every layer of one forward reads: the ops, the RoPE positions and the masks.

    Masks are built once per forward (not per layer), one per (window, last-only) pair the
    layers need, and already in the form the ops take. Positions are a contiguous run per
    row (`offsets`), or explicit per token (`tree.positions`, (B, L): a label trie's nodes sit at
    prompt end + depth, so siblings share a position).
    """

    def __init__(
        self,
        model: Model,
        attention_mask: mx.array,
        cache_mask: mx.array | None,
        cache_len: int,
        offsets: mx.array,
        last_only: bool,
        tree: Tree | None = None,
        n_layers: int | None = None,
    ):
        self.ops: Ops = model.ops
        self.offsets, self.positions = offsets, None if tree is None else tree.positions
        args = model.args
        L = attention_mask.shape[1]
        types = [layer.layer_type for layer in model.layers][:n_layers]  # the layers this forward runs
        n = len(types)
        built: dict[tuple[int | None, bool], mx.array] = {}
        self._masks: dict[tuple[str, bool], mx.array] = {}
        for i, t in enumerate(types):
            last = last_only and i == n - 1
            if (t, last) in self._masks:
                continue
            window = args.sliding_window if t == SLIDING else None
            if window is not None and cache_len + L <= window:
                window = None  # nothing is far enough away to fall outside it
            if (window, last) not in built:
                built[(window, last)] = self.ops.mask(
                    build_mask(attention_mask, cache_mask, cache_len, last, offsets, window, tree)
                )
            self._masks[(t, last)] = built[(window, last)]

    def mask(self, layer_type: str, last_only: bool) -> mx.array:
        return self._masks[(layer_type, last_only)]


# --------------------------------------------------------------------------- blocks


def rope(x: mx.array, dims: int, base: float, scale: float, offsets: mx.array) -> mx.array:
    """Half-split (not interleaved) RoPE; vector offsets: row r starts at its own position."""
    return mx.fast.rope(x, dims, traditional=False, base=base, scale=scale, offset=offsets)


def rope_at(x: mx.array, dims: int, base: float, scale: float, positions: mx.array) -> mx.array:
    """RoPE of x (B, H, L, D) at explicit positions (B, L): every token is its own length-1
    sequence with its own offset, so it goes through the same kernel (and gives the same
    values) as a contiguous run would."""
    B, H, L, D = x.shape
    y = x.transpose(0, 2, 1, 3).reshape(B * L, H, 1, D)
    y = mx.fast.rope(y, dims, traditional=False, base=base, scale=scale, offset=positions.reshape(-1))
    return y.reshape(B, L, H, D).transpose(0, 2, 1, 3)


def extend_cache(cache: KV | None, k: mx.array, v: mx.array) -> KV:
    """Cached keys/values followed by the new ones, in new arrays (the cache is never written).

    A batch-1 cache (the shared prefix) is broadcast along the batch axis.
    """
    if cache is None:
        return k, v
    ck, cv = cache
    B = k.shape[0]
    if ck.shape[0] != B:
        ck = mx.broadcast_to(ck, (B, *ck.shape[1:]))
        cv = mx.broadcast_to(cv, (B, *cv.shape[1:]))
    return mx.concatenate([ck, k], axis=2), mx.concatenate([cv, v], axis=2)


class Attention(nn.Module):
    """Grouped-query attention with RoPE (Llama's); subclasses add q/k norms or change the scale."""

    def __init__(self, args: ModelArgs, layer_type: str = FULL, o_bias: bool | None = None):
        super().__init__()
        d, hd = args.hidden_size, args.head_dim
        self.n_heads, self.n_kv_heads, self.head_dim = args.num_attention_heads, args.num_key_value_heads, hd
        self.scale = self.attention_scale(args)
        self.layer_type = layer_type
        self.rope_base, self.rope_scale = args.rope(layer_type)
        bias = args.attention_bias
        self.q_proj = nn.Linear(d, self.n_heads * hd, bias=bias)
        self.k_proj = nn.Linear(d, self.n_kv_heads * hd, bias=bias)
        self.v_proj = nn.Linear(d, self.n_kv_heads * hd, bias=bias)
        self.o_proj = nn.Linear(self.n_heads * hd, d, bias=bias if o_bias is None else o_bias)

    def attention_scale(self, args: ModelArgs) -> float:
        return args.head_dim**-0.5

    def qk_norm(self, q: mx.array, k: mx.array) -> tuple[mx.array, mx.array]:
        """q (B, Lq, H, D) and k (B, L, Hkv, D) before RoPE; identity here."""
        return q, k

    def _rope(self, x: mx.array, ctx: Context, skip: int = 0) -> mx.array:
        """RoPE of x (B, H, Lx, D), the forward's tokens from column `skip` on."""
        if ctx.positions is not None:
            return rope_at(x, self.head_dim, self.rope_base, self.rope_scale, ctx.positions[:, skip:])
        return rope(x, self.head_dim, self.rope_base, self.rope_scale, ctx.offsets + skip)

    def __call__(self, x: mx.array, ctx: Context, cache: KV | None, last_only: bool) -> tuple[mx.array, KV]:
        B, L, _ = x.shape
        xq = x[:, -1:] if last_only else x
        Lq = xq.shape[1]
        q = self.q_proj(xq).reshape(B, Lq, self.n_heads, -1)
        k = self.k_proj(x).reshape(B, L, self.n_kv_heads, -1)
        v = self.v_proj(x).reshape(B, L, self.n_kv_heads, -1).transpose(0, 2, 1, 3)
        q, k = self.qk_norm(q, k)
        q = self._rope(q.transpose(0, 2, 1, 3), ctx, L - Lq)
        k = self._rope(k.transpose(0, 2, 1, 3), ctx)
        k, v = extend_cache(cache, k, v)
        out = ctx.ops.attention(q, k, v, self.scale, ctx.mask(self.layer_type, last_only))
        out = out.transpose(0, 2, 1, 3).reshape(B, Lq, -1)
        return self.o_proj(out), (k, v)


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=False)
        self.up_proj = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)

    def __call__(self, x: mx.array, ops: Ops) -> mx.array:
        return self.down_proj(ops.silu_mul(self.gate_proj(x), self.up_proj(x)))


class TransformerBlock(nn.Module):
    """Pre-norm block: x + attn(norm(x)), then h + mlp(norm(h))."""

    attention_class: ClassVar[type[Attention]] = Attention

    def __init__(self, args: ModelArgs, layer_idx: int):
        super().__init__()
        self.layer_type = args.layer_types[layer_idx]
        self.self_attn = self.attention_class(args, self.layer_type)
        self.mlp = MLP(args.hidden_size, args.intermediate_size)
        self.input_layernorm = nn.RMSNorm(args.hidden_size, eps=args.rms_norm_eps)
        self.post_attention_layernorm = nn.RMSNorm(args.hidden_size, eps=args.rms_norm_eps)

    def __call__(self, x: mx.array, ctx: Context, cache: KV | None, last_only: bool) -> tuple[mx.array, KV]:
        r, kv = self.self_attn(self.input_layernorm(x), ctx, cache, last_only)
        h = (x[:, -1:] if last_only else x) + r
        return h + self.mlp(self.post_attention_layernorm(h), ctx.ops), kv


class LanguageModel(nn.Module):
    def __init__(
        self, args: ModelArgs, block: Callable[[ModelArgs, int], nn.Module], norm: Callable[..., nn.Module] = nn.RMSNorm
    ):
        super().__init__()
        self.embed_tokens = nn.Embedding(args.vocab_size, args.hidden_size)
        self.layers = [block(args, i) for i in range(args.num_hidden_layers)]
        self.norm = norm(args.hidden_size, eps=args.rms_norm_eps)


# --------------------------------------------------------------------------- model


class Model(nn.Module):
    """A causal LM that returns final hidden states, and logits only for the rows asked.

    Architectures subclass it, setting `block_class` (and overriding `embed` or
    `logits` where they differ).
    """

    block_class: ClassVar[type[nn.Module]] = TransformerBlock
    norm_class: ClassVar[Callable[..., nn.Module]] = nn.RMSNorm
    supports_tree: ClassVar[bool] = True  # explicit positions and a tree mask (label tries in one pass)

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.ops: Ops = NATIVE  # load_model chooses (choose_ops); assign to override
        self.quantized: str | None = None  # load_model: e.g. "4-bit (group 64)" when the weights are kept packed
        self.model = LanguageModel(args, self.block_class, self.norm_class)
        if args.seqcls is not None:  # as Transformers' *ForSequenceClassification: a score head, no LM head
            self.score = nn.Linear(args.hidden_size, args.seqcls.num_labels, bias=False)
        elif not args.tie_word_embeddings and not args.backbone:
            self.lm_head = nn.Linear(args.hidden_size, args.vocab_size, bias=False)

    @property
    def layers(self) -> list[nn.Module]:
        return self.model.layers

    def embed(self, ids: mx.array) -> mx.array:
        return self.model.embed_tokens(ids)

    def __call__(
        self,
        ids: mx.array,
        attention_mask: mx.array | None = None,
        offsets: mx.array | None = None,
        cache: list[KV] | None = None,
        cache_mask: mx.array | None = None,
        last_only: bool = True,
        tree: Tree | None = None,
        collect: dict[int, Any] | None = None,
    ) -> tuple[mx.array, list[KV]]:
        """Run token ids (B, L) after an optional cache; return normed hidden states and KV.

        attention_mask: (B, L), 1 for real tokens, 0 for left padding (default: all real).
        offsets: (B,) RoPE position of column 0 of each row: cache length minus the row's
            padding, so real tokens keep their unbatched positions (default: cache length).
        cache: per-layer (K, V) with batch B or 1 (a shared prefix, broadcast).
        cache_mask: (B or 1, C) real cached keys (default: all real); the real cached keys
            are taken to be the tokens before the new ones, in order (sliding windows count on it).
        tree: the new tokens' explicit RoPE positions, replacing `offsets`, and which new tokens
            each sees (default causal): a label trie, question branches (`Tree`).
        collect: {layer: None, ...}: filled with the hidden states (B, L, D) after those layers
            (Transformers' `hidden_states[l]` numbering; layer n after the final norm), what a
            learned head reads; layer n needs `last_only=False`.
        Returns hidden (B, D) at the last position if `last_only`, else (B, L, D), and
        the per-layer KV of cache + these tokens (to extend with label tokens).
        """
        cache_len, attention_mask, offsets = _defaults(ids, attention_mask, offsets, cache)
        ctx = Context(self, attention_mask, cache_mask, cache_len, offsets, last_only, tree)
        h = self.embed(ids)
        n = len(self.layers)
        new_cache: list[KV] = []
        with self.ops.room(ids.shape[0] * ids.shape[1], cache_len + ids.shape[1], self.args):  # its buffers
            for i, layer in enumerate(self.layers):
                h, kv = layer(h, ctx, None if cache is None else cache[i], last_only and i == n - 1)
                new_cache.append(kv)
                if collect is not None and i + 1 in collect and i + 1 < n:
                    collect[i + 1] = h
        h = self.model.norm(h)
        if collect is not None and n in collect:
            collect[n] = h
        return (h[:, -1] if last_only else h), new_cache

    def features(
        self,
        ids: mx.array,
        layers: list[int],
        attention_mask: mx.array | None = None,
        offsets: mx.array | None = None,
        cache: list[KV] | None = None,
        poolings: Sequence[str] = ("last",),
        pool_mask: mx.array | None = None,
    ) -> dict[str, mx.array]:
        """Hidden states after the given layers, pooled, {pooling: (B, len(layers), D)}.

        Layers are numbered as Transformers' `hidden_states[l]`: l in 1..n is the output of
        block l, and l = n is taken after the final norm (as Transformers does). Poolings:
        "last", the last position; "mean", the mean over the positions `pool_mask` (B, L)
        marks (default: the real new tokens), in float32. The forward stops at the deepest
        layer asked for (a learned head needs nothing after its layer); with "last" alone
        that layer runs its queries and MLP at the last position only."""
        n = len(self.layers)
        if not layers or min(layers) < 1 or max(layers) > n:
            raise ModelError(f"feature layers must be between 1 and {n}, got {layers}")
        if not poolings or set(poolings) - {"last", "mean"}:
            raise ModelError(f"poolings must be 'last' and/or 'mean', got {list(poolings)}")
        stop = max(layers)
        cache_len, attention_mask, offsets = _defaults(ids, attention_mask, offsets, cache)
        last_only = "mean" not in poolings  # a mean needs every position of the deepest layer
        ctx = Context(self, attention_mask, None, cache_len, offsets, last_only, n_layers=stop)
        if "mean" in poolings:
            w = (attention_mask if pool_mask is None else pool_mask).astype(mx.float32)[..., None]  # (B, L, 1)
            w = w / mx.maximum(w.sum(axis=1, keepdims=True), 1.0)
        got: dict[str, dict[int, mx.array]] = {p: {} for p in poolings}
        h = self.embed(ids)
        for i, layer in enumerate(self.layers[:stop]):
            h, _ = layer(h, ctx, None if cache is None else cache[i], last_only and i == stop - 1)
            if i + 1 in layers:
                x = self.model.norm(h) if i + 1 == n else h
                if "last" in poolings:
                    got["last"][i + 1] = x[:, -1]
                if "mean" in poolings:  # (B, L, D) -> (B, D), in float32: a sum of up to L terms
                    got["mean"][i + 1] = (x.astype(mx.float32) * w).sum(axis=1)
        return {p: mx.stack([got[p][k] for k in layers], axis=1) for p in poolings}

    @property
    def compute_dtype(self) -> mx.Dtype:
        """The dtype the forward computes in (that of the float weights, quantized or not)."""
        return self.model.norm.weight.dtype

    @property
    def seqcls(self) -> SeqClsHead | None:
        """The sequence-classification head's description (labels, problem type), or None for a causal LM."""
        return self.args.seqcls

    @property
    def has_lm_head(self) -> bool:
        """False for a sequence classifier (`logits`, label tokens, is refused; `score_logits` scores)
        and for a bare backbone (it embeds only)."""
        return self.args.seqcls is None and not self.args.backbone

    def head(self) -> nn.Module:
        """The LM head module: the embedding when tied, else `lm_head` (either may be quantized).
        A sequence classifier or a bare backbone has none: a ModelError saying what it does instead."""
        if self.args.seqcls is not None:
            raise ModelError(self.args.seqcls.no_lm_head())
        if self.args.backbone:
            raise ModelError(BACKBONE_NO_LM_HEAD)
        return self.model.embed_tokens if self.args.tie_word_embeddings else self.lm_head

    def score_logits(self, hidden: mx.array) -> mx.array:
        """The score head on final hidden states (B, D) (the forward's `last_only` output):
        (B, num_labels) float32 logits, computed in float32 (Transformers' `score`)."""
        return score_logits(self.score if self.args.seqcls is not None else None, hidden)

    def head_weight(self) -> mx.array:
        """The (V, D) head weight; a quantized head is dequantized whole (costly: for reading only)."""
        head = self.head()
        return quant.dense_weight(head) if quant.is_quantized(head) else head.weight

    def logits(self, hidden: mx.array, rows: mx.array | None = None) -> mx.array:
        """Project hidden states onto the vocabulary, or only onto `rows` (e.g. label tokens)."""
        head = self.head()
        if quant.is_quantized(head):  # the label rows dequantized, or the packed matmul
            return quant.project(head, hidden, rows)
        w = head.weight
        if rows is not None:
            w = mx.take(w, rows, axis=0)
        return hidden @ w.T


def _defaults(
    ids: mx.array, attention_mask: mx.array | None, offsets: mx.array | None, cache: list[KV] | None
) -> tuple[int, mx.array, mx.array]:
    """(cache length, attention mask, RoPE offsets) of a forward, the defaults filled in:
    every token real, each row starting right after the cache."""
    B, L = ids.shape
    cache_len = 0 if cache is None else cache[0][0].shape[2]
    if attention_mask is None:
        attention_mask = mx.ones((B, L), dtype=mx.bool_)
    if offsets is None:
        offsets = mx.full((B,), cache_len, dtype=mx.int32)
    return cache_len, attention_mask, offsets


NO_SCORE_HEAD = (
    "this model is a causal LM (an LM head, no sequence-classification head): it scores label tokens; only a "
    "*ForSequenceClassification checkpoint has a score head to classify with"
)


def score_logits(score: nn.Module | None, hidden: mx.array) -> mx.array:
    """`score` (a Linear, possibly quantized) on hidden states (B, D): (B, num_labels) float32."""
    if score is None:
        raise ModelError(NO_SCORE_HEAD)
    w = quant.dense_weight(score) if quant.is_quantized(score) else score.weight
    return hidden.astype(mx.float32) @ w.astype(mx.float32).T


BACKBONE_NO_LM_HEAD = (
    "this model is a bare backbone without an LM head (a sentence-transformers embedding model): it embeds "
    "texts (mlx-slm embed, mlx_slm.Embedder, POST /v1/embeddings or /embed); it cannot score label tokens, "
    "questions or a yes/no prompt: classify with a causal LM (*ForCausalLM), or train a head on its features"
)
# The top-level names of a backbone's tensors saved without the `model.` prefix (`Qwen3Model`'s own
# `save_pretrained`, as sentence-transformers writes its folders and Qwen3-Embedding ships).
_BACKBONE_TOP = ("embed_tokens.", "layers.", "norm.")


def backbone_architecture(config: dict[str, Any]) -> bool:
    """Whether config.json names a bare backbone (`Qwen3Model`, `LlamaModel`, `Gemma3TextModel`),
    not a model with a head (`*ForCausalLM`, `*ForSequenceClassification`, ...)."""
    archs = config.get("architectures") or []
    return bool(archs) and isinstance(archs[0], str) and archs[0].endswith("Model")


def prefix_backbone(weights: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """A backbone's tensors saved without the `model.` prefix (`embed_tokens.weight`,
    `layers.N...`, `norm.weight`, as `Qwen3Model.save_pretrained` writes them) under the names
    our `Model` loads (`model.embed_tokens.weight`, ...), and whether they were; others as they are."""
    if "embed_tokens.weight" not in weights or any(k.startswith("model.") for k in weights):
        return weights, False
    return {("model." + k if k.startswith(_BACKBONE_TOP) else k): v for k, v in weights.items()}, True


def sanitize(weights: dict[str, mx.array], args: ModelArgs) -> dict[str, mx.array]:
    """Drop tensors the forward does not use (rotary caches, a tied LM head copy; a sequence
    classifier's LM head, which Transformers' *ForSequenceClassification does not have either)."""
    out = {k: v for k, v in weights.items() if "rotary_emb.inv_freq" not in k}
    if args.tie_word_embeddings or args.seqcls is not None or args.backbone:
        out.pop("lm_head.weight", None)
    return out


def check_score(weights: dict[str, mx.array], args: ModelArgs, where: str) -> None:
    """Refuse, before loading, a `score.weight` that does not match the config (`seqcls.check_head_tensor`)."""
    w = weights.get(SCORE_WEIGHT)
    packed = SCORE_WEIGHT.replace(".weight", ".scales") in weights
    check_head_tensor(args.seqcls, None if w is None else w.shape, args.hidden_size, where, packed, list(weights))


def flops_per_token(args: ModelArgs) -> float:
    """2 x the weights of the per-token matmuls (q, k, v, o, gate, up, down) of all layers."""
    d, f, L, hd = args.hidden_size, args.intermediate_size, args.num_hidden_layers, args.head_dim
    attn = 2 * d * args.num_attention_heads * hd + 2 * d * args.num_key_value_heads * hd
    return 2.0 * L * (attn + 3 * d * f)


# --------------------------------------------------------------------------- GGUF

# llama.cpp's per-layer tensor names -> Hugging Face's (under model.layers.N.), shared by
# the Llama-shaped architectures; an architecture extends or replaces this table.
GGUF_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
GGUF_TOP_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


def gguf_hf_name(name: str, layer_names: dict[str, str] = GGUF_LAYER_NAMES) -> str | None:
    """Hugging Face name of a GGUF tensor (`blk.N.attn_q.weight` -> `model.layers.N.self_attn.q_proj.weight`)."""
    if name in GGUF_TOP_NAMES:
        return GGUF_TOP_NAMES[name]
    parts = name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[2] in layer_names:
        return f"model.layers.{parts[1]}.{layer_names[parts[2]]}.{parts[3]}"
    return None


def gguf_llama_config(meta: Callable[..., Any], shapes: dict[str, tuple[int, ...]]) -> dict[str, Any]:
    """The Hugging Face config fields every Llama-shaped GGUF states the same way.

    meta(key, default): the `{arch}.{key}` metadata value; shapes: tensor shapes, Hugging
    Face order (rows first).
    """
    heads = int(meta("attention.head_count"))
    hidden = int(meta("embedding_length"))
    return dict(
        hidden_size=hidden,
        num_hidden_layers=int(meta("block_count")),
        intermediate_size=int(meta("feed_forward_length")),
        num_attention_heads=heads,
        num_key_value_heads=int(meta("attention.head_count_kv", heads)),
        rms_norm_eps=float(meta("attention.layer_norm_rms_epsilon")),
        max_position_embeddings=int(meta("context_length", 32768)),
        vocab_size=int(shapes["token_embd.weight"][0]),
        tie_word_embeddings="output.weight" not in shapes,
        rope_theta=float(meta("rope.freq_base", 10000.0)),
        head_dim=int(meta("attention.key_length", hidden // heads)),
    )
