"""The architectures: one file each, found by the config's `model_type`.

Every architecture module provides

* `ModelArgs` (a `base.ModelArgs` dataclass; `from_dict` reads a transformers 4 or 5 config),
* `Model` (a `base.Model`: `__call__(ids, attention_mask, offsets, cache, cache_mask,
  last_only) -> (hidden, kv)`, `logits(hidden, rows)`, `head_weight()`, `args`),
* `sanitize(weights, args)` (checkpoint tensors -> the names `Model` loads) and
  `flops_per_token(args)` (matmul FLOPs per token), only where they differ from `base`'s,
* `HF_ARCHITECTURE`, `SEQCLS_ARCHITECTURE` where fine-tuning exports a sequence classifier of it
  (`exportable`), and, for GGUF conversion, `GGUF_ARCH`, `GGUF_LAYER_NAMES`,
  `gguf_config(meta, shapes)` and `gguf_tensor(name, array, config)`.

Adding an architecture is one file here and one line in `ARCHITECTURES`.

May import: ground, text.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import mlx.core as mx

from ..ground.errors import ModelError
from . import quant
from .base import (
    BACKBONE_NO_LM_HEAD,
    FASTMATH,
    KV,
    NATIVE,
    NO_SCORE_HEAD,
    Model,
    ModelArgs,
    Ops,
    Tree,
    build_mask,
    check_score,
    choose_ops,
    prefix_backbone,
)

# model_type (config.json) -> module of this package.
ARCHITECTURES: dict[str, str] = {
    "qwen2": "qwen2",
    "llama": "llama",
    "qwen3": "qwen3",
    "gemma3": "gemma3",
    "gemma3_text": "gemma3",
}
SUPPORTED_ARCHITECTURES = tuple(ARCHITECTURES)


def model_type_of(config: dict[str, Any]) -> str:
    """The config's `model_type`, checked to be a name (a list or a number there failed as a TypeError)."""
    mt = config.get("model_type")
    if not isinstance(mt, str) or not mt:
        raise ModelError(
            f'config.json: model_type {mt!r} is not an architecture name (a string such as "qwen2"): fix it'
        )
    return mt


def get_model_module(model_type: str | None) -> ModuleType:
    """The architecture module for a config's `model_type`; ModelError if there is none."""
    if model_type not in ARCHITECTURES:
        raise ModelError(f"unsupported architecture {model_type!r}; supported: {', '.join(SUPPORTED_ARCHITECTURES)}")
    return importlib.import_module(f"{__name__}.{ARCHITECTURES[model_type]}")


def get_model_class(model_type: str | None) -> tuple[type[Model], type[ModelArgs]]:
    """(Model class, ModelArgs class) for a `model_type`, as mlx-lm's `get_model_classes`.

    A `model_type` none of our files covers falls back to mlx-lm's model class, behind our
    contract (`mlxlm.MlxLmModel`), if mlx-lm has one and it is not in `mlxlm.UNSUPPORTED`."""
    if model_type not in ARCHITECTURES:
        from . import mlxlm  # lazy: mlx-lm's model classes load only for an architecture of theirs

        return mlxlm.get_model_class(model_type)  # type: ignore[return-value]
    m = get_model_module(model_type)
    return m.Model, m.ModelArgs


def exportable() -> dict[str, str]:
    """model_type -> the Transformers sequence-classifier class `weights.export` writes for it:
    the architectures whose module names one (`SEQCLS_ARCHITECTURE`)."""
    out = {}
    for model_type in ARCHITECTURES:
        seqcls = getattr(get_model_module(model_type), "SEQCLS_ARCHITECTURE", None)
        if seqcls is not None:
            out[model_type] = seqcls
    return out


def gguf_module(gguf_arch: str | None) -> ModuleType:
    """The architecture module for a GGUF's `general.architecture`; ModelError if there is none."""
    for model_type in dict.fromkeys(ARCHITECTURES.values()):
        m = importlib.import_module(f"{__name__}.{model_type}")
        if getattr(m, "GGUF_ARCH", None) == gguf_arch:
            return m
    known = sorted({getattr(get_model_module(t), "GGUF_ARCH", None) for t in ARCHITECTURES} - {None})
    raise ModelError(f"GGUF architecture {gguf_arch!r} is not supported; supported: {', '.join(known)}")


def _sanitize(module: ModuleType) -> Any:
    """The module's own `sanitize`, else the shared one (rotary caches, a tied head copy), after a
    bare backbone's tensors get the `model.` prefix (`base.prefix_backbone`)."""
    from . import base  # lazy: base imports this registry (its ModelArgs look architectures up here)

    own = getattr(module, "sanitize", base.sanitize)
    return lambda weights, args: own(prefix_backbone(weights)[0], args)


def _flops(module: ModuleType) -> Any:
    from . import base  # lazy: base imports this registry (its ModelArgs look architectures up here)

    return getattr(module, "flops_per_token", base.flops_per_token)


def flops_per_token(config: dict[str, Any]) -> float:
    """Matmul FLOPs per token of a config.json dict (Llama-shaped when it names no model_type)."""
    cfg = {"model_type": "llama", "vocab_size": 1, **config}  # the vocabulary is no per-token matmul here
    m = get_model_module(cfg["model_type"])
    return _flops(m)(m.ModelArgs.from_dict(cfg))


def _checkpoint_dtype(path: Path, config: dict[str, Any], module: ModuleType) -> str | None:
    """The dtype the weights were trained/published in: the conversion record's source, else the config."""
    rec = path / "conversion.json"
    if rec.is_file():  # ours: config.json holds the dtype we converted to, the record the source's
        try:
            got = json.loads(rec.read_text()).get("source_dtype")
        except (OSError, ValueError):
            got = None
    else:
        got = config.get("torch_dtype") or config.get("dtype")
    if got in (None, "float32"):  # a GGUF or a float32 file says nothing about the half type it wants
        return getattr(module, "TRAINED_DTYPE", None) or got
    return str(got)


def default_compute_dtype(checkpoint_dtype: str | None = None) -> mx.Dtype:
    """float32 on the CPU (MLX has no fast half-precision matmul there); on Metal and CUDA
    bfloat16 for a bfloat16 checkpoint, float16 otherwise."""
    if mx.default_device() != mx.gpu:
        return mx.float32
    return mx.bfloat16 if checkpoint_dtype == "bfloat16" else mx.float16


def load_model(
    path: str | Path, dtype: mx.Dtype | None = None, ops: str | Ops | None = None, keep_quantized: bool | None = None
) -> Model:
    """Load a converted MLX directory (config.json + *.safetensors), cast to the compute dtype.

    ops: "auto" (default: `choose_ops` by device and dtype), "native", "fastmath", or an `Ops`.
    keep_quantized: for an MLX-quantized directory (mlx-lm's format), keep the packed weights
        (True) or replace them by their values at load (False). None (default): kept on a GPU,
        replaced on the CPU, where MLX's quantized matmuls are slow (a one-line note says so on
        stderr).
    """
    path = Path(path)
    cfg_path = path / "config.json"
    if not cfg_path.is_file():
        raise ModelError(f"no config.json in {path}: convert the checkpoint first (mlx-slm convert)")
    config = json.loads(cfg_path.read_text())
    if model_type_of(config) not in ARCHITECTURES:  # only mlx-lm's model class covers it (or refused)
        from . import mlxlm  # lazy: mlx-lm's model classes load only for an architecture of theirs

        return mlxlm.load(path, config, dtype, ops, keep_quantized)  # type: ignore[return-value]
    module = get_model_module(config.get("model_type"))
    args = module.ModelArgs.from_dict(config)
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ModelError(f"no *.safetensors in {path}: convert the checkpoint first (mlx-slm convert)")
    weights: dict[str, mx.array] = {}
    for f in files:
        weights.update(mx.load(str(f)))
    # A backbone saved without the `model.` prefix (Qwen3-Embedding's layout) has no LM head,
    # whatever its config's architectures say.
    args.backbone = args.backbone or prefix_backbone(weights)[1]
    weights = _sanitize(module)(weights, args)
    check_score(weights, args, str(files[0] if len(files) == 1 else path))
    model = module.Model(args)
    weights, dtype = quant.load_quantized(model, weights, config, path, dtype, keep_quantized)
    dtype = dtype or default_compute_dtype(_checkpoint_dtype(path, config, module))
    weights = {k: v.astype(dtype) if mx.issubdtype(v.dtype, mx.floating) else v for k, v in weights.items()}
    try:
        model.load_weights(list(weights.items()), strict=True)
    except ValueError as e:  # a tensor the config's model has no place for, or one it lacks, or a wrong shape
        why = " ".join(str(e).split())
        raise ModelError(
            f"the weights in {path} do not fit the model its config.json describes ({why[:300]}): use the "
            "config.json that belongs to these weights, or convert the checkpoint again (mlx-slm convert)"
        ) from None
    model.eval()
    mx.eval(model.parameters())
    model.ops = choose_ops(dtype, name=ops)
    return model


def embeds_only(model: Any) -> bool:
    """Whether a loaded model has neither an LM head nor a score head: a bare backbone (a
    sentence-transformers embedding model), which embeds and classifies nothing by itself."""
    return not getattr(model, "has_lm_head", True) and getattr(model, "seqcls", None) is None


def sequence_logits(
    model: Model,
    ids: mx.array,
    attention_mask: mx.array | None = None,
    offsets: mx.array | None = None,
    cache: list[KV] | None = None,
    cache_mask: mx.array | None = None,
) -> mx.array:
    """A sequence classifier's logits (B, num_labels) float32 for a left-padded batch (B, L).

    Transformers reads `score` at each row's last token that is not `pad_token_id`; in a
    left-padded batch (the arguments of `Model.__call__`) every row's last column is real,
    so this is `score(norm(hidden[:, -1]))`: the forward with `last_only`, then
    `model.score_logits`. Rows must hold `model.seqcls.prompt_ids(ids)` (trailing pad-id tokens
    dropped, as Transformers reads past them). A causal LM is a ModelError (it has no score head).
    """
    if getattr(model, "seqcls", None) is None:
        raise ModelError(NO_SCORE_HEAD)
    hidden, _ = model(ids, attention_mask, offsets, cache=cache, cache_mask=cache_mask, last_only=True)
    return model.score_logits(hidden)


__all__ = [
    "ARCHITECTURES",
    "BACKBONE_NO_LM_HEAD",
    "FASTMATH",
    "KV",
    "NATIVE",
    "SUPPORTED_ARCHITECTURES",
    "Model",
    "ModelArgs",
    "Ops",
    "Tree",
    "build_mask",
    "choose_ops",
    "default_compute_dtype",
    "embeds_only",
    "exportable",
    "flops_per_token",
    "get_model_class",
    "get_model_module",
    "gguf_module",
    "load_model",
    "model_type_of",
    "sequence_logits",
]
