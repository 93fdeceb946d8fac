"""Any other architecture mlx-lm knows, run through mlx-lm's own model class.

The files of this package (`qwen2.py`, `llama.py`, ...) are the fast path. For a
`model_type` none of them covers but mlx-lm has a model class for (`mlx_lm.models.<type>`,
after mlx-lm's own remapping, e.g. mistral -> llama), `MlxLmModel` wraps that class in our
forward contract, so the classifier, the engine and the prefix cache work unchanged:

* **Per-row positions and masks through mlx-lm's cache protocol.** mlx-lm's layers take
  RoPE positions from `cache.offset` and their mask from `cache.make_mask(N, window_size=)`
  (`create_attention_mask`). `RowCache` is an mlx-lm cache (as `BatchKVCache`, a per-row
  `offset` vector) whose mask is `base.build_mask`'s explicit one: left padding is never
  attended and every real token keeps its unbatched position. `BatchKVCache(left_padding)`
  cannot express the classifier's layouts (padding after a shared prefix, label tokens
  after a padded batch); an explicit mask can, so the prefix cache is exact here too.
* **Label rows only.** Hidden states are the inner model's output; `logits(hidden, rows)`
  replays mlx-lm's own `Model.__call__` on them with the head (`lm_head`, or the tied
  embedding's `as_linear`) restricted to `rows`, so whatever it does around the head
  (Cohere's logit scale, Granite's divisor, a soft-cap) is applied exactly, to the label
  rows alone.
* **Checked at load.** A few-token probe compares this path (unbatched, left padded, after a
  prefix, label rows) with mlx-lm's own unbatched forward; an architecture that does not
  follow the cache protocol is refused with the reason instead of scoring wrong.

What the fast path adds, and this one lacks: numpy's vectorized exp on the CPU
(`fastmath`), and trimming the last layer to the last position (every position runs
through every layer here). Families whose mlx-lm forward is not Transformers' are listed
in `UNSUPPORTED` with the reason, and refused.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import mlx.core as mx
from mlx import nn
from mlx.utils import tree_flatten

from ..ground.errors import ModelError
from ..ground.notices import notice
from ..text.seqcls import SCORE, SCORE_WEIGHT, SeqClsHead
from . import SUPPORTED_ARCHITECTURES, _checkpoint_dtype, default_compute_dtype, quant
from .base import KV, NATIVE, Ops, build_mask, extend_cache, score_logits

# model_type -> why it is refused (measured against Transformers, or read in mlx-lm's source).
UNSUPPORTED: dict[str, str] = {
    "gpt_neox": (
        "mlx-lm's GPT-NeoX applies its LM head inside the inner model, so there are no final hidden "
        "states to project onto the label rows"
    ),
    "olmo": "mlx-lm's olmo module needs the ai2-olmo package (hf_olmo) and exits the process without it",
    "gemma2": (
        "mlx-lm's Gemma 2 attention broadcasts a per-row (B, 1, L, S) mask against (B, kv_heads, "
        "repeats, L, S) scores, so in a padded batch a row gets another row's mask (measured: max "
        "|d logit| 2.6 against its own unbatched forward)"
    ),
    "starcoder2": (
        "mlx-lm's StarCoder2 MLP computes the exact (erf) GELU where the checkpoints ask for "
        "gelu_pytorch_tanh (measured: max |d logit| 7.8e-4 on a 2-layer random model, and it grows with depth)"
    ),
    "gemma": (
        "mlx-lm's Gemma MLP computes the exact (erf) GELU where Transformers computes gelu_pytorch_tanh "
        "(measured: max |d logit| 8.3e-4 on a 2-layer random model, and it grows with depth)"
    ),
    "glm": (
        "mlx-lm's GLM rotates the whole head where Transformers' rotates part of it (partial_rotary_factor, "
        "0.5 in GLM-4; measured: max |d logit| 3.6 on a 2-layer random model)"
    ),
}


def _refusal(config: dict[str, Any]) -> str | None:
    """Why mlx-lm's class would not compute this particular config as Transformers does, if it would not."""
    window, ctx = config.get("sliding_window"), config.get("max_position_embeddings")
    if config.get("model_type") == "mistral" and window and (ctx is None or window < ctx):
        return (
            f"a Mistral sliding window ({window} tokens) slides every layer in Transformers, and mlx-lm's "
            "llama class, which runs mistral, cannot slide every layer"
        )
    return None


# Caches mlx-lm makes for layers our per-row KV cache can stand in for (plain and sliding-window
# attention); any other sort (recurrent or state-space state, chunked attention) is refused.
_KV_CACHES = ("KVCache", "RotatingKVCache", "ConcatenateKVCache")
_INNER = ("model", "transformer")  # the attribute holding the embedding, the layers and the final norm


# --------------------------------------------------------------------------- classes and config


def normalize_config(config: dict[str, Any]) -> dict[str, Any]:
    """A transformers 5 config in the transformers 4 fields mlx-lm's `ModelArgs` read.

    transformers 5 keeps RoPE settings in `rope_parameters`; mlx-lm reads `rope_theta`,
    `rope_scaling`, `partial_rotary_factor` (GPT-NeoX-style: `rotary_emb_base`, `rotary_pct`).
    """
    cfg = dict(config)
    rp = cfg.get("rope_parameters")
    if isinstance(rp, dict) and "rope_theta" in rp:  # flat (not per layer type)
        cfg.setdefault("rope_theta", rp["rope_theta"])
        if "partial_rotary_factor" in rp:
            cfg.setdefault("partial_rotary_factor", rp["partial_rotary_factor"])
        rope_type = rp.get("rope_type", rp.get("type")) or "default"
        if rope_type != "default" and not cfg.get("rope_scaling"):
            cfg["rope_scaling"] = {**rp, "rope_type": rope_type, "type": rope_type}
    aliases = (("rotary_emb_base", "rope_theta"), ("rotary_pct", "partial_rotary_factor"), ("n_ctx", "n_positions"))
    for alias, name in aliases:
        if alias not in cfg and name in cfg:
            cfg[alias] = cfg[name]
    return cfg


def get_classes(config: dict[str, Any]) -> tuple[type[nn.Module], type]:
    """mlx-lm's (Model, ModelArgs) for a config, or a ModelError saying why there are none."""
    model_type = config.get("model_type")
    if model_type in UNSUPPORTED:
        raise ModelError(f"architecture {model_type!r} is not supported: {UNSUPPORTED[model_type]}")
    try:
        from mlx_lm.utils import _get_classes  # lazy: mlx-lm loads only here
    except ImportError as e:  # pragma: no cover - mlx-lm is a dependency
        raise ModelError(f"architecture {model_type!r} needs mlx-lm ({e})") from None
    try:
        return _get_classes(config=dict(config))
    except (ValueError, ImportError, SystemExit, KeyError) as e:  # SystemExit: a module that exits on import
        raise ModelError(
            f"unsupported architecture {model_type!r}; supported: {', '.join(SUPPORTED_ARCHITECTURES)}, "
            f"or one mlx-lm has a model class for (mlx-lm: {e})"
        ) from None


def knows(model_type: str | None) -> bool:
    """Whether mlx-lm has a model class for `model_type` that this fallback would run."""
    try:
        get_classes({"model_type": model_type})
    except ModelError:
        return False
    return True


def model_args(config: dict[str, Any]) -> Any:
    """mlx-lm's ModelArgs for a (normalized) config; ModelError if it cannot build them."""
    _, args_class = get_classes(config)
    why = _refusal(config)
    if why:
        raise ModelError(f"this {config.get('model_type')} config is not supported: {why}")
    try:
        return args_class.from_dict(normalize_config(config))
    except (TypeError, ValueError, KeyError, AssertionError) as e:
        raise ModelError(f"mlx-lm cannot read this {config.get('model_type')} config: {e}") from None


def get_model_class(model_type: str | None) -> tuple[type[MlxLmModel], type]:
    """(Model class, ModelArgs class) for a model_type mlx-lm knows, as `models.get_model_class`.

    The Model class is `MlxLmModel` bound to mlx-lm's class (`cls(args)` builds it); the
    ModelArgs class reads a Hugging Face config through `normalize_config`.
    """
    lm_class, args_class = get_classes({"model_type": model_type})
    model = type(f"MlxLm_{model_type}", (MlxLmModel,), {"lm_class": lm_class})
    args = type(
        f"MlxLmArgs_{model_type}",
        (args_class,),
        {"from_dict": classmethod(lambda cls, cfg: args_class.from_dict(normalize_config(cfg)))},
    )
    return model, args


# --------------------------------------------------------------------------- the cache


class _Masks:
    """The explicit masks of one forward, one per sliding window asked for (built once)."""

    def __init__(self, attention_mask: mx.array, cache_mask: mx.array | None, cache_len: int, offsets: mx.array):
        self.attention_mask, self.cache_mask, self.cache_len, self.offsets = (
            attention_mask,
            cache_mask,
            cache_len,
            offsets,
        )
        self._built: dict[int | None, mx.array] = {}

    def __call__(self, n: int, window: int | None) -> mx.array:
        L = self.attention_mask.shape[1]
        if n != L:
            raise ModelError(f"mlx-lm asked for a mask of {n} queries in a forward of {L} tokens")
        if window is not None and self.cache_len + L <= window:
            window = None  # nothing is far enough away to fall outside it
        if window not in self._built:
            self._built[window] = build_mask(
                self.attention_mask, self.cache_mask, self.cache_len, False, self.offsets, window
            )
        return self._built[window]


class RowCache:
    """One layer's cache for one forward, in mlx-lm's cache protocol (duck-typed: importing
    mlx-lm costs seconds, paid only when a model needs it).

    `offset` is the (B,) RoPE position of each row's column 0 (as `BatchKVCache.offset`);
    `update_and_fetch` returns the earlier keys/values (a batch-1 prefix broadcast) followed
    by the new ones, in new arrays (the earlier ones are never written into); `make_mask`
    gives the explicit boolean (B, 1, N, C + N) mask of `base.build_mask`.
    """

    def __init__(self, prev: KV | None, offsets: mx.array, masks: _Masks):
        self.prev, self.offset, self._masks = prev, offsets, masks
        self.kv: KV | None = None

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> KV:
        if self.kv is not None:
            raise ModelError("mlx-lm wrote one layer's cache twice in one forward (shared KV layers)")
        self.kv = extend_cache(self.prev, keys, values)
        return self.kv

    def make_mask(self, N: int, return_array: bool = False, window_size: int | None = None, **_: Any) -> mx.array:
        return self._masks(N, window_size)

    @property
    def state(self) -> Any:
        return self.kv

    @state.setter
    def state(self, v: Any) -> None:
        raise ModelError("the fallback's per-forward cache cannot be restored from a state")

    def size(self) -> int:
        return 0 if self.kv is None else int(self.kv[0].shape[2])

    def empty(self) -> bool:
        return self.kv is None and self.prev is None

    @property
    def nbytes(self) -> int:
        kv = self.kv or self.prev
        return 0 if kv is None else kv[0].nbytes + kv[1].nbytes


# --------------------------------------------------------------------------- the head


def _row_project(module: nn.Module, rows: mx.array, x: mx.array) -> mx.array:
    """x projected onto `rows` of a Linear's or an Embedding's weight (quantized or not)."""
    if "scales" in module:
        w = mx.take(module["weight"], rows, axis=0)
        scales = mx.take(module["scales"], rows, axis=0)
        biases = module.get("biases")
        out = mx.quantized_matmul(
            x,
            w,
            scales,
            None if biases is None else mx.take(biases, rows, axis=0),
            transpose=True,
            group_size=module.group_size,
            bits=module.bits,
            **({"mode": module.mode} if hasattr(module, "mode") else {}),
        )
    else:
        out = x @ mx.take(module["weight"], rows, axis=0).T
    if "bias" in module and isinstance(module, (nn.Linear, nn.QuantizedLinear)):
        out = out + mx.take(module["bias"], rows, axis=0)
    return out


class _RowHead:
    """A head (Linear) or tied embedding (`as_linear`) that projects onto `rows` only."""

    def __init__(self, module: nn.Module, rows: mx.array):
        self._module, self._rows = module, rows

    def __call__(self, x: mx.array) -> mx.array:
        return _row_project(self._module, self._rows, x)

    as_linear = __call__

    @property
    def weight(self) -> mx.array:  # `out @ embed_tokens.weight.T` (MiniCPM's tied head)
        return mx.take(self._module["weight"], self._rows, axis=0)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._module, name)


_EMBEDDINGS = (nn.Embedding, nn.QuantizedEmbedding)
_LINEARS = (nn.Linear, nn.QuantizedLinear)


class _Inner:
    """Stands in for the inner model in mlx-lm's `Model.__call__`: returns the given hidden
    states; its embedding, used as the tied head (`as_linear`), projects onto `rows` only."""

    def __init__(self, inner: nn.Module, hidden: mx.array, rows: mx.array | None):
        self._inner, self._hidden, self._rows = inner, hidden, rows

    def __call__(self, *args: Any, **kwargs: Any) -> mx.array:
        return self._hidden

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._inner, name)
        if self._rows is not None and isinstance(value, _EMBEDDINGS):
            return _RowHead(value, self._rows)
        return value


class _Tail:
    """`self` for replaying mlx-lm's `Model.__call__` after the inner model: its head (a Linear
    of the top model, or the tied embedding) on given hidden states, onto `rows` only if given."""

    def __init__(self, lm: nn.Module, inner_name: str, hidden: mx.array, rows: mx.array | None):
        self._lm, self._inner_name, self._rows = lm, inner_name, rows
        self._inner = _Inner(getattr(lm, inner_name), hidden, rows)

    def __getattr__(self, name: str) -> Any:
        if name == self._inner_name:
            return self._inner
        value = getattr(self._lm, name)
        if self._rows is not None and isinstance(value, _LINEARS):
            return _RowHead(value, self._rows)
        return value


# --------------------------------------------------------------------------- the model


class MlxLmModel(nn.Module):
    """mlx-lm's model class for one architecture, behind our forward contract (see `base.Model`)."""

    lm_class: ClassVar[type[nn.Module] | None] = None  # set by get_model_class
    supports_prefix = True  # the prefix KV cache is exact here (an explicit mask after it)

    def __init__(
        self,
        args: Any,
        lm: nn.Module | None = None,
        max_position_embeddings: int | None = None,
        seqcls: SeqClsHead | None = None,
    ):
        super().__init__()
        if lm is None:
            if self.lm_class is None:
                raise ModelError("MlxLmModel needs mlx-lm's model class: use get_model_class(model_type)")
            lm = self.lm_class(args)
        self.lm = lm
        self.args = args
        self.seqcls = seqcls  # a sequence classifier: `lm.score` in place of its LM head (`seqcls_class`)
        if max_position_embeddings is not None or not getattr(args, "max_position_embeddings", None):
            args.max_position_embeddings = int(max_position_embeddings or 32768)
        self.ops: Ops = NATIVE  # the fused CPU math (fastmath) is the fast path's
        self.quantized: str | None = None  # load: e.g. "4-bit (group 64)" when the weights are kept packed
        made = lm.make_cache() if hasattr(lm, "make_cache") else None
        if made is not None:
            other = sorted({type(c).__name__ for c in made} - set(_KV_CACHES))
            if other:
                raise ModelError(
                    f"{type(lm).__module__}: layers with {', '.join(other)} (recurrent, state-space or chunked "
                    "attention state) cannot run left padded with a per-row KV cache"
                )
        names = [n for n in _INNER if isinstance(lm.get(n), nn.Module)]
        if not names:
            raise ModelError(
                f"{type(lm).__module__}: no inner model ({' or '.join(_INNER)}), so no hidden states to score "
                "label rows on"
            )
        self._inner_name = names[0]
        self._n_caches = len(made) if made is not None else len(lm.layers)

    @property
    def inner(self) -> nn.Module:
        return self.lm[self._inner_name]

    @property
    def layers(self) -> list[nn.Module]:
        return self.lm.layers

    @property
    def model_type(self) -> str:
        return str(getattr(self.args, "model_type", type(self.lm).__module__))

    def __call__(
        self,
        ids: mx.array,
        attention_mask: mx.array | None = None,
        offsets: mx.array | None = None,
        cache: list[KV] | None = None,
        cache_mask: mx.array | None = None,
        last_only: bool = True,
    ) -> tuple[mx.array, list[KV]]:
        """As `base.Model.__call__`: hidden states (B, D) at the last position if `last_only`,
        else (B, L, D), and the per-layer KV of cache + these tokens."""
        B, L = ids.shape
        cache_len = 0 if cache is None else int(cache[0][0].shape[2])
        if attention_mask is None:
            attention_mask = mx.ones((B, L), dtype=mx.bool_)
        if offsets is None:
            offsets = mx.full((B,), cache_len, dtype=mx.int32)
        offsets = offsets.astype(mx.int32)
        masks = _Masks(attention_mask.astype(mx.bool_), cache_mask, cache_len, offsets)
        caches = [RowCache(None if cache is None else cache[i], offsets, masks) for i in range(self._n_caches)]
        h = self.inner(ids, cache=caches)
        kv = [c.kv for c in caches]
        if any(x is None for x in kv):
            raise ModelError(f"{type(self.lm).__module__}: a layer did not write its cache")
        return (h[:, -1] if last_only else h), kv

    def logits(self, hidden: mx.array, rows: mx.array | None = None) -> mx.array:
        """mlx-lm's own head (and any scale or soft-cap it applies) on hidden states, onto `rows` only if given."""
        last = hidden.ndim == 2
        h = hidden[:, None] if last else hidden
        tail = _Tail(self.lm, self._inner_name, h, rows)
        out = type(self.lm).__call__(tail, mx.zeros(h.shape[:2], dtype=mx.int32))
        return out[:, 0] if last else out

    @property
    def has_lm_head(self) -> bool:
        return self.seqcls is None

    def score_logits(self, hidden: mx.array) -> mx.array:
        """The score head on final hidden states (B, D): (B, num_labels) float32 (see `base.Model.score_logits`)."""
        return score_logits(self.lm[SCORE] if self.seqcls is not None else None, hidden)

    @property
    def compute_dtype(self) -> mx.Dtype:
        """The dtype the forward computes in (that of the floating-point weights, quantized or not)."""

        return next(v.dtype for _, v in tree_flatten(self.lm.parameters()) if mx.issubdtype(v.dtype, mx.floating))

    def head(self) -> nn.Module:
        """The LM head: the top model's Linear, else the inner model's (tied) embedding."""
        if self.seqcls is not None:
            raise ModelError(self.seqcls.no_lm_head())
        for owner in (self.lm, self.inner):
            classes = _LINEARS if owner is self.lm else _EMBEDDINGS
            found = [m for k, m in owner.items() if isinstance(m, classes)]
            if found:
                return found[0]
        raise ModelError(f"{type(self.lm).__module__}: no LM head (a Linear, or a tied embedding) found")

    def head_weight(self) -> mx.array:
        head = self.head()
        if "scales" in head:  # quantized: lazily dequantized (reading its dtype computes nothing)
            return quant.dense_weight(head)
        return head["weight"]


# --------------------------------------------------------------------------- loading


def seqcls_class(lm_class: type[nn.Module], head: SeqClsHead) -> type[nn.Module]:
    """mlx-lm's model class as Transformers' *ForSequenceClassification: its inner model, and
    a `score` Linear (num_labels x hidden, no bias) in place of the LM head; its sanitize
    keeps `score.weight` and drops any LM head. Only the inner model and `score` are run."""

    def __init__(self: nn.Module, args: Any) -> None:
        lm_class.__init__(self, args)
        if "lm_head" in self:
            del self["lm_head"]
        hidden = getattr(args, "hidden_size", None)
        if not isinstance(hidden, int):
            raise ModelError(f"{lm_class.__module__}: no hidden_size in its config, so no score head can be built")
        self[SCORE] = nn.Linear(hidden, head.num_labels, bias=False)

    def sanitize(self: nn.Module, weights: dict[str, mx.array]) -> dict[str, mx.array]:
        score = weights.get(SCORE_WEIGHT)
        rest = {k: v for k, v in weights.items() if not k.startswith(("lm_head.", f"{SCORE}."))}
        if hasattr(lm_class, "sanitize"):
            rest = lm_class.sanitize(self, rest)
        return rest if score is None else {**rest, SCORE_WEIGHT: score}

    attrs = {"__init__": __init__, "sanitize": sanitize, "__module__": lm_class.__module__}
    return type(f"SeqCls_{lm_class.__name__}", (lm_class,), attrs)


def check_config(config: dict[str, Any]) -> Any:
    """Refuse, before any weight is read, a config the fallback cannot run: mlx-lm has no class
    for it, cannot read it, or its layers keep state other than keys and values. Building
    mlx-lm's model here costs nothing (MLX is lazy: no weight is initialized). Returns the args."""
    args = model_args(config)
    lm_class, _ = get_classes(config)
    try:
        lm = lm_class(args)
    except Exception as e:  # noqa: BLE001 - whatever mlx-lm's constructor says, as a refusal
        raise ModelError(f"mlx-lm cannot build this {config.get('model_type')} model: {e}") from None
    MlxLmModel(args, lm)
    return args


def quantizable(config: dict[str, Any]) -> tuple[set[str], Any]:
    """(paths of the layers mlx-lm's model can quantize, its `sanitize(weights)`), for
    `mlx-slm convert --quantize` (mlx-lm's loader then quantizes the layers with scales)."""
    args = check_config(config)
    lm = get_classes(config)[0](args)  # lazy: no weight is initialized
    layers = {p for p, m in lm.named_modules() if hasattr(m, "to_quantized")}
    return layers, (lm.sanitize if hasattr(lm, "sanitize") else (lambda w: w))


def load(
    path: str | Path,
    config: dict[str, Any],
    dtype: mx.Dtype | None = None,
    ops: str | Ops | None = None,
    keep_quantized: bool | None = None,
    check: bool = True,
) -> MlxLmModel:
    """Load a converted (or mlx-lm) directory of an architecture only mlx-lm covers.

    mlx-lm's loader builds the model (its `sanitize`, its quantization) from the config as
    `normalize_config` reads it; floating-point weights are cast to `dtype` (default: as
    `models.default_compute_dtype`). An MLX-quantized directory is kept packed as
    `models.load_model` says (by default on a GPU only). `check` runs `self_check`.
    """
    from mlx_lm.utils import dequantize_model  # lazy: mlx-lm loads only here
    from mlx_lm.utils import load_model as mlx_lm_load  # lazy: mlx-lm loads only here

    path = Path(path)
    model_type = config.get("model_type")
    if ops not in (None, "auto", "native", NATIVE):
        raise ModelError(
            f"ops {getattr(ops, 'name', ops)!r}: {model_type!r} runs through mlx-lm's model class, "
            "with MLX's native ops only (the fastmath ops are the fast path's)"
        )
    model_args(config)  # refuses what mlx-lm's class would not compute as Transformers does
    lm_class, args_class = get_classes(config)
    head = SeqClsHead.from_config(config)
    if head is not None:
        lm_class = seqcls_class(lm_class, head)
    normalized = normalize_config(config)
    try:
        lm, _ = mlx_lm_load(
            path,
            lazy=True,
            strict=True,
            model_config=normalized,
            get_model_classes=lambda config: (lm_class, args_class),
        )
    except (ValueError, TypeError, KeyError, AssertionError, FileNotFoundError) as e:
        raise ModelError(f"{path}: mlx-lm could not load this {model_type} checkpoint: {e}") from None
    quantized = bool(config.get("quantization") or config.get("quantization_config"))
    packed = quantized and not quant.unpacked_at_load(keep_quantized)
    if quantized and not packed:
        lm = dequantize_model(lm)  # MLX's quantized matmuls are slow on the CPU (models.load_model)
    dtype = dtype or default_compute_dtype(_checkpoint_dtype(path, config, None))  # type: ignore[arg-type]
    lm.set_dtype(dtype)
    lm.eval()
    mx.eval(lm.parameters())
    args = getattr(lm, "args", None) or args_class.from_dict(normalized)
    max_pos = config.get("max_position_embeddings") or config.get("n_positions") or config.get("seq_length")
    model = MlxLmModel(args, lm, max_pos, head)
    if packed:
        q = config.get("quantization") or config.get("quantization_config") or {}
        model.quantized = f"{q.get('bits', '?')}-bit (group {q.get('group_size', '?')})"
    if check:
        self_check(model)
    notice(
        f"mlx-slm: the fast path does not cover {model_type!r}; it runs through mlx-lm's model class "
        f"({type(lm).__module__}), without the CPU fastmath ops and with every position through every layer"
    )
    return model


def self_check(model: MlxLmModel, tol: float | None = None) -> float:
    """A probe of a few tokens: this path (a left-padded batch, a padded batch after a prefix
    cache, label rows) against mlx-lm's own forward of each prompt alone (six short forwards).
    Returns the largest difference relative to the logits' scale; ModelError (saying what
    differed) past `tol` (default by dtype). A sequence classifier's score head stands in
    for the LM head (and mlx-lm's own forward is its inner model, then the score)."""
    lm_head = model.has_lm_head
    dtype = model.head_weight().dtype if lm_head else model.compute_dtype
    if tol is None:
        tol = 1e-4 if dtype == mx.float32 else 2e-2
    vocab = int(getattr(model.args, "vocab_size", 0) or model.inner.embed_tokens.weight.shape[0])
    a = [(7 * i + 3) % max(vocab - 1, 1) + 1 for i in range(9)]
    b = [(11 * i + 5) % max(vocab - 1, 1) + 1 for i in range(3)]  # shorter than a and than a[p:]
    rows = mx.array([a[0], a[-1], b[0]], dtype=mx.int32)
    worst = 0.0
    try:

        def own(seq: list[int]) -> mx.array:  # mlx-lm's own forward, one prompt, no cache
            if not lm_head:
                return model.score_logits(model.inner(mx.array([seq]), cache=None)[:, -1])[0]
            return model.lm(mx.array([seq]))[0, -1].astype(mx.float32)

        def head(h: mx.array) -> mx.array:
            return model.logits(h) if lm_head else model.score_logits(h)

        p = 4
        want = [own(a), own(b), own(a[:p] + b)]
        scale = max(float(mx.abs(w).max()) for w in want) + 1.0

        def diff(what: str, got: mx.array, ref: mx.array) -> None:
            nonlocal worst
            d = float(mx.abs(got.astype(mx.float32) - ref).max()) / scale
            worst = max(worst, d)
            if not d <= tol:
                raise ModelError(
                    f"{type(model.lm).__module__}: {what} differs from mlx-lm's own forward "
                    f"(max |d logit| {d * scale:.3g}): this architecture does not run exactly through the fallback"
                )

        def padded(rows_: list[list[int]], cache_len: int = 0) -> tuple[mx.array, mx.array, mx.array]:
            L = max(map(len, rows_))
            ids = mx.array([[0] * (L - len(r)) + r for r in rows_], dtype=mx.int32)
            mask = mx.array([[False] * (L - len(r)) + [True] * len(r) for r in rows_])
            return ids, mask, mx.array([cache_len - (L - len(r)) for r in rows_], dtype=mx.int32)

        h, _ = model(*padded([a, b]))  # row 1 left padded
        got = head(h)
        diff("the head", got[0], want[0])
        diff("a left-padded row", got[1], want[1])
        if lm_head:
            diff("the label-row head", model.logits(h, rows), mx.take(got, rows, axis=1))
        _, kv = model(mx.array([a[:p]]))
        h, _ = model(*padded([a[p:], b], cache_len=p), cache=kv)  # row 1 padded after the prefix
        got = head(h)
        diff("a row after a prefix cache", got[0], want[0])
        diff("a left-padded row after a prefix cache", got[1], want[2])
    except ModelError:
        raise
    except Exception as e:  # the architecture does not follow the cache protocol: refuse, say where
        raise ModelError(
            f"{type(model.lm).__module__} does not run through the fallback ({type(e).__name__}: {e})"
        ) from None
    return worst


__all__ = [
    "UNSUPPORTED",
    "MlxLmModel",
    "RowCache",
    "check_config",
    "get_classes",
    "get_model_class",
    "knows",
    "load",
    "model_args",
    "normalize_config",
    "quantizable",
    "self_check",
]
