"""MLX-quantized checkpoints (mlx-lm's format): reading, dequantizing, packing.

An mlx-lm quantized directory is a Hugging Face layout whose `config.json` carries
`"quantization": {"group_size": G, "bits": B, "mode": "affine"}` (and the same dict as
`quantization_config`), where every quantized Linear or Embedding `X` holds a packed
`X.weight` (uint32), `X.scales` and `X.biases`, and per-module overrides may sit in the
same dict under the module's path (`"model.layers.0.mlp.down_proj": {"bits": 8, ...}`,
or `false` for a module left in floating point). Which modules are quantized is read
from the tensors (`X.scales` present), their group size and bits from the override or
from the shapes, as mlx-lm's loader does.

On the CPU MLX's quantized matmuls are slow: SmolLM2-135M 4-bit ran its forward at 1.9
GFLOP/s kept packed against 98 GFLOP/s dequantized to float32 (2-core x86, OpenBLAS;
docs/models.md), so `load_model` dequantizes such a checkpoint to float32 at load there unless
asked not to (8x the memory of 4-bit weights); on a GPU it keeps the weights packed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlx.core as mx
from mlx import nn

from ..ground.errors import ModelError
from ..ground.notices import notice

BITS = (4, 8)  # what `mlx-slm convert --quantize` writes (the loader reads any affine width)
GROUP_SIZES = (32, 64, 128)
DEFAULT_GROUP_SIZE = 64  # mlx-lm's default for affine quantization
QUANTIZED = (nn.QuantizedLinear, nn.QuantizedEmbedding)
_GLOBAL = ("group_size", "bits", "mode")


def quantization_of(config: dict[str, Any]) -> dict[str, Any] | None:
    """The mlx-lm quantization dict of a config.json (its `quantization`, or a `quantization_config`
    in the same form), or None for a floating-point checkpoint. Other quantization methods
    (GPTQ, AWQ, bitsandbytes, fp8: a `quant_method`) are refused."""
    q = config.get("quantization")
    if q is None:
        qc = config.get("quantization_config")
        if qc is None and isinstance(config.get("text_config"), dict):
            qc = config["text_config"].get("quantization_config")
        if isinstance(qc, dict) and "quant_method" in qc:
            raise ModelError(
                f"quantization method {qc['quant_method']!r} is not supported: only MLX (mlx-lm) quantized "
                "directories are; convert the unquantized checkpoint instead (mlx-slm convert SRC --quantize 4|8)"
            )
        q = qc
    if q is None:
        return None
    if not isinstance(q, dict) or not isinstance(q.get("group_size"), int) or not isinstance(q.get("bits"), int):
        raise ModelError(f"config.json: quantization entry {q!r} is not mlx-lm's form ({{'group_size': G, 'bits': B}})")
    return q


def describe(q: dict[str, Any]) -> str:
    """'4-bit (group 64)' for a quantization dict (per-module overrides are not counted)."""
    mode = q.get("mode", "affine")
    return f"{q['bits']}-bit (group {q['group_size']}{'' if mode == 'affine' else ', ' + mode})"


def _module_params(
    path: str, module: nn.Module | None, quant: dict[str, Any], weights: dict[str, mx.array]
) -> dict[str, Any]:
    """group_size, bits and mode of the quantized module at `path`: its override in the config,
    else inferred from the packed shapes (as mlx-lm's `infer_quant_config`)."""
    over = quant.get(path)
    if isinstance(over, dict):
        return {
            "group_size": over.get("group_size", quant["group_size"]),
            "bits": over.get("bits", quant["bits"]),
            "mode": over.get("mode", quant.get("mode", "affine")),
        }
    default = {k: quant.get(k, "affine") for k in _GLOBAL}
    if module is None or "weight" not in module:
        return default
    in_dims = module.weight.shape[-1]
    scales = weights[f"{path}.scales"]
    group_size = in_dims // scales.shape[-1]
    bits = weights[f"{path}.weight"].shape[-1] * 32 // in_dims
    if scales.dtype != mx.uint8:
        return {"group_size": group_size, "bits": bits, "mode": "affine"}
    modes = {(4, 16): "nvfp4", (4, 32): "mxfp4", (8, 32): "mxfp8"}
    if (bits, group_size) not in modes:
        raise ModelError(f"{path}: cannot tell how it was quantized ({bits} bits, group size {group_size})")
    return {"group_size": group_size, "bits": bits, "mode": modes[(bits, group_size)]}


def quantized_paths(weights: dict[str, mx.array]) -> list[str]:
    """Module paths whose packed weight, scales (and biases) are in `weights`."""
    return sorted(
        k[: -len(".scales")] for k in weights if k.endswith(".scales") and k[: -len(".scales")] + ".weight" in weights
    )


def drop_orphans(weights: dict[str, mx.array]) -> dict[str, mx.array]:
    """Drop `X.scales`/`X.biases` whose `X.weight` a sanitize removed (a tied head's copy)."""
    return {
        k: v
        for k, v in weights.items()
        if not (k.endswith((".scales", ".biases")) and k.rsplit(".", 1)[0] + ".weight" not in weights)
    }


def dequantize(
    weight: mx.array, scales: mx.array, biases: mx.array | None, group_size: int, bits: int, mode: str = "affine"
) -> mx.array:
    """The float32 values of one packed tensor (scales and biases upcast first: exact)."""
    if mode == "affine":
        return mx.dequantize(weight, scales.astype(mx.float32), biases.astype(mx.float32), group_size, bits)
    return mx.dequantize(weight, scales, biases, group_size, bits, mode=mode, dtype=mx.float32)


def dequantize_weights(
    weights: dict[str, mx.array], quant: dict[str, Any], model: nn.Module | None = None
) -> dict[str, mx.array]:
    """Every quantized module's packed weight replaced by its float32 values; the rest as is."""
    modules = dict(model.named_modules()) if model is not None else {}
    out = dict(weights)
    for p in quantized_paths(weights):
        prm = _module_params(p, modules.get(p), quant, weights)
        out[f"{p}.weight"] = dequantize(
            weights[f"{p}.weight"], out.pop(f"{p}.scales"), out.pop(f"{p}.biases", None), **prm
        )
    return out


def quantize_model(model: nn.Module, weights: dict[str, mx.array], quant: dict[str, Any]) -> dict[str, Any]:
    """Make the modules the checkpoint holds packed (`X.scales` in `weights`) quantized modules,
    with the checkpoint's group size and bits, so that `load_weights` takes the packed tensors."""

    def predicate(path: str, m: nn.Module) -> bool | dict[str, Any]:
        if not hasattr(m, "to_quantized") or f"{path}.scales" not in weights:
            return False
        return _module_params(path, m, quant, weights)

    nn.quantize(model, class_predicate=predicate)
    return {k: quant.get(k, "affine") for k in _GLOBAL}


def unpacked_at_load(keep_quantized: bool | None) -> bool:
    """Whether a quantized checkpoint's weights are replaced by their values at load: unless kept
    as asked, else (None) on the CPU only, where MLX's quantized matmuls are slow."""
    if keep_quantized is None:
        return mx.default_device() != mx.gpu
    return not keep_quantized


def load_quantized(
    model: nn.Module,
    weights: dict[str, mx.array],
    config: dict[str, Any],
    path: Path,
    dtype: mx.Dtype | None,
    keep_quantized: bool | None,
) -> tuple[dict[str, mx.array], mx.Dtype | None]:
    """An MLX-quantized checkpoint's weights, dequantized (float32) or with `model` made quantized
    to take them packed (`unpacked_at_load`); and the compute dtype (None: the default). Others
    pass through. The CPU's default says so on stderr."""
    q = quantization_of(config)
    if q is None:
        return weights, dtype
    weights = drop_orphans(weights)
    on_cpu = mx.default_device() != mx.gpu
    if keep_quantized is None and on_cpu:
        dtype = dtype or mx.float32
        notice(
            f"mlx-slm: note: {path.name} is {describe(q)} quantized; on the CPU MLX's quantized matmuls run "
            f"~50x slower than float32 ones, so it is dequantized to {str(dtype).replace('mlx.core.', '')} at load "
            "(--keep-quantized keeps it packed)"
        )
    if unpacked_at_load(keep_quantized):
        return dequantize_weights(weights, q, model), dtype
    model.quantized = describe(q)
    quantize_model(model, weights, q)
    if dtype is None and not on_cpu:  # a GPU computes in the scales' half type, as mlx-lm does
        scales = next((v.dtype for k, v in weights.items() if k.endswith(".scales")), None)
        dtype = scales if scales in (mx.float16, mx.bfloat16) else None
    return weights, dtype


def is_quantized(module: nn.Module) -> bool:
    return isinstance(module, QUANTIZED)


def dense_weight(module: nn.Module, rows: mx.array | None = None) -> mx.array:
    """A quantized Linear/Embedding's (rows of its) weight, dequantized to its scales' dtype."""
    w, s, b = module["weight"], module["scales"], module.get("biases")
    if rows is not None:
        w, s = mx.take(w, rows, axis=0), mx.take(s, rows, axis=0)
        b = None if b is None else mx.take(b, rows, axis=0)
    return mx.dequantize(w, s, b, module.group_size, module.bits, mode=getattr(module, "mode", "affine"))


def project(module: nn.Module, hidden: mx.array, rows: mx.array | None = None) -> mx.array:
    """hidden @ W.T for a quantized head: the packed matmul over the whole vocabulary, or
    only the `rows` asked for, dequantized (a few label rows: never the whole head)."""
    if rows is not None:
        return hidden @ dense_weight(module, rows).T
    if isinstance(module, nn.QuantizedEmbedding):
        return module.as_linear(hidden)
    return module(hidden)
