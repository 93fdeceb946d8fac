"""A model folder checked before anything loads it: what is missing or damaged, named at once.

A folder with only `config.json`, one without tokenizer files, a truncated `model.safetensors`
(an interrupted download or copy) or a `config.json` cut short reached the converter, the
tokenizer or MLX's loader and failed there with a traceback (exit 70), or worse, loaded a
tokenizer from nothing. `model_dir_problems` reads only the small parts that say whether the
folder is whole: `config.json` parses as a JSON object, a tokenizer is there, and every
`*.safetensors` file is as long as its header says (8 bytes of header length, the JSON header,
then the tensors' data up to the largest end offset). `check_model_dir` raises a `ModelError`
(exit 2) naming the folder, everything missing and the fix. It reads no tensor data.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

from ..ground.errors import ModelError

# A tokenizer as transformers loads one: the fast tokenizer's file, a sentencepiece model, or BPE files.
TOKENIZER_FILES = (("tokenizer.json",), ("tokenizer.model",), ("vocab.json", "merges.txt"))
MAX_HEADER = 100 << 20  # safetensors caps its header at 100 MB


def safetensors_problem(f: Path) -> str | None:
    """Why a `.safetensors` file is not whole (too short for its header, a header that is not JSON,
    data shorter or longer than the header's offsets), or None."""
    try:
        size = f.stat().st_size
        with open(f, "rb") as fh:
            head = fh.read(8)
            if len(head) < 8:
                return f"{f.name} is {size} bytes, too short to be a safetensors file"
            (n,) = struct.unpack("<Q", head)
            if n > MAX_HEADER or 8 + n > size:
                return f"{f.name} is {size} bytes, shorter than its own header says ({8 + n} bytes of header alone)"
            header = json.loads(fh.read(n))
    except OSError as e:
        return f"{f.name} cannot be read ({e.strerror or e})"
    except (ValueError, UnicodeDecodeError):
        return f"{f.name} has a header that is not valid JSON"
    if not isinstance(header, dict):
        return f"{f.name} has a header that is not a JSON object"
    ends = [
        v["data_offsets"][1]
        for k, v in header.items()
        if k != "__metadata__" and isinstance(v, dict) and isinstance(v.get("data_offsets"), list) and v["data_offsets"]
    ]
    want = 8 + n + max((e for e in ends if isinstance(e, int)), default=0)
    if size != want:
        short = "shorter" if size < want else "longer"
        return f"{f.name} is {size:,} bytes where its header says {want:,}: {short} than written"
    return None


def tensor_names(path: Path) -> set[str]:
    """The tensor names every `*.safetensors` of a folder holds, read from their headers alone
    (a file that cannot be read adds none: `model_dir_problems` says what is wrong with it)."""
    names: set[str] = set()
    for f in sorted(path.glob("*.safetensors")):
        try:
            with open(f, "rb") as fh:
                (n,) = struct.unpack("<Q", fh.read(8))
                header = json.loads(fh.read(n)) if n <= MAX_HEADER else {}
        except (OSError, ValueError, struct.error):
            continue
        if isinstance(header, dict):
            names |= {k for k in header if k != "__metadata__"}
    return names


def model_dir_problems(path: Path) -> list[str]:
    """Everything that keeps `path` from loading as a model folder (empty: it looks whole)."""
    problems: list[str] = []
    cfg = path / "config.json"
    if not cfg.is_file():
        problems.append("no config.json")
    else:
        try:
            config = json.loads(cfg.read_text(encoding="utf-8"))
            if not isinstance(config, dict):
                problems.append("config.json is not a JSON object")
        except (OSError, ValueError) as e:
            problems.append(f"config.json is not valid JSON ({e})")
    if not any(all((path / name).is_file() for name in names) for names in TOKENIZER_FILES):
        problems.append("no tokenizer files (tokenizer.json, tokenizer.model, or vocab.json with merges.txt)")
    weights = sorted(path.glob("*.safetensors"))
    if not weights:
        problems.append("no *.safetensors weights (PyTorch .bin checkpoints are not read)")
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            named = set(json.loads(index.read_text(encoding="utf-8")).get("weight_map", {}).values())
        except (OSError, ValueError, AttributeError):
            named = set()
            problems.append("model.safetensors.index.json is not valid JSON")
        problems += [
            f"{name} (named by model.safetensors.index.json) is missing"
            for name in sorted(named)
            if isinstance(name, str) and not (path / name).is_file()
        ]
    problems += [p for p in map(safetensors_problem, weights) if p]
    return problems


def check_model_dir(path: str | Path) -> None:
    """A `ModelError` (exit 2) naming the folder and all that is missing or damaged in it, or nothing."""
    p = Path(path)
    problems = model_dir_problems(p)
    if problems:
        raise ModelError(
            f"the model folder {path} is not whole: {'; '.join(problems)}: copy or download the model again "
            "(all of config.json, the tokenizer files and the weights), or give another --model"
        )


def load_tokenizer(path: str | Path, **kwargs: Any) -> Any:
    """transformers' tokenizer of a model folder (or GGUF, `gguf_file=`). It reads config.json too,
    and its config class fails on values it cannot take with an exception of its own: any such
    failure is a `ModelError` naming the folder and the fix, not a traceback."""
    from transformers import AutoTokenizer  # lazy: a slow import

    try:
        return AutoTokenizer.from_pretrained(str(path), **kwargs)
    except Exception as e:  # noqa: BLE001 - the files are the user's: whatever fails in them is theirs to fix
        why = " ".join(f"{type(e).__name__}: {e}".split())
        where, fix = path, "fix config.json and the tokenizer files (tokenizer.json, tokenizer_config.json)"
        if "gguf_file" in kwargs:
            where, fix = Path(path) / kwargs["gguf_file"], "its tokenizer metadata is damaged"
        raise ModelError(
            f"the tokenizer of {where} cannot be loaded ({why[:300]}): {fix}, or download the model again"
        ) from None


# --------------------------------------------------------------------------- GGUF

GGUF_MAGIC = b"GGUF"
# GGUF metadata value types: fixed sizes (the rest are STRING = 8 and ARRAY = 9).
_GGUF_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_GGUF_STRING, _GGUF_ARRAY = 8, 9


class _Cut(Exception):
    """The GGUF ends (or holds an impossible count) where `where` says."""


class _GGUFWalk:
    """A forward reader of a GGUF's header that never reads past the file's end."""

    def __init__(self, f: Any, size: int, order: str):
        self.f, self.size, self.order, self.pos = f, size, order, 0

    def take(self, n: int, where: str) -> bytes:
        if n < 0 or self.pos + n > self.size:
            raise _Cut(f"it ends at byte {self.size:,}, inside {where}")
        self.f.seek(self.pos)
        data = self.f.read(n)
        self.pos += n
        return data

    def skip(self, n: int, where: str) -> None:
        if n < 0 or self.pos + n > self.size:
            raise _Cut(f"it ends at byte {self.size:,}, inside {where}")
        self.pos += n

    def uint(self, n: int, where: str) -> int:
        return int.from_bytes(self.take(n, where), "little" if self.order == "<" else "big")

    def string(self, where: str) -> bytes:
        return self.take(self.uint(8, where), where)

    def value(self, vtype: int, where: str, depth: int = 0) -> Any:
        if vtype in _GGUF_SIZES:
            raw = self.take(_GGUF_SIZES[vtype], where)
            return int.from_bytes(raw, "little" if self.order == "<" else "big") if vtype in (4, 10) else None
        if vtype == _GGUF_STRING:
            self.skip(self.uint(8, where), where)
            return None
        if vtype == _GGUF_ARRAY and depth == 0:
            itype, n = self.uint(4, where), self.uint(8, where)
            if itype in _GGUF_SIZES:
                self.skip(n * _GGUF_SIZES[itype], where)
            elif itype in (_GGUF_STRING, _GGUF_ARRAY) and n <= self.size:
                for _ in range(n):
                    self.value(itype, where, depth + 1)
            else:
                raise _Cut(f"{where} is an array of an unknown type ({itype}) or of {n:,} items")
            return None
        raise _Cut(f"{where} has an unknown value type ({vtype})")


def gguf_problem(path: str | Path) -> str | None:
    """Why a `.gguf` file is not a whole GGUF (too short, not GGUF, a version this reader does not
    know, metadata or tensor table cut short or impossible, tensor data shorter than the table
    says), or None. It walks the header only (the tensor table's sizes come from each tensor's
    type and shape) and reads no tensor data."""
    from gguf.constants import GGML_QUANT_SIZES  # lazy: GGUF input only

    p = Path(path)
    try:
        size = p.stat().st_size
        with open(p, "rb") as f:
            magic = f.read(4)
            if magic != GGUF_MAGIC:
                return (
                    f"it is {size:,} bytes and does not start with GGUF's magic bytes"
                    if size >= 4
                    else (f"it is {size} bytes, too short to be a GGUF file")
                )
            raw = f.read(4)
            if len(raw) < 4:
                return f"it ends at byte {size}, inside its version"
            order = "<" if int.from_bytes(raw, "little") & 0xFFFF else ">"
            w = _GGUFWalk(f, size, order)
            w.pos = 4
            version = w.uint(4, "its version")
            if version not in (2, 3):
                return f"it is GGUF version {version}; versions 2 and 3 are read"
            n_tensors, n_kv = w.uint(8, "its tensor count"), w.uint(8, "its metadata count")
            if w.pos + 24 * n_tensors + 13 * n_kv > size:  # the smallest table entry is 24 bytes, metadata 13
                return (
                    f"it is {size:,} bytes, too short for the {n_tensors:,} tensors and {n_kv:,} metadata entries "
                    "its header announces"
                )
            alignment = 32
            for i in range(n_kv):
                key = w.string(f"metadata entry {i + 1} of {n_kv}")
                where = f"metadata {key.decode('utf-8', 'replace')[:60]!r}"
                got = w.value(w.uint(4, where), where)
                if key == b"general.alignment" and isinstance(got, int):
                    alignment = got
            if alignment < 1 or alignment & (alignment - 1):
                return f"its general.alignment is {alignment}, not a power of two"
            tensors = []
            for i in range(n_tensors):
                where = f"the tensor table (tensor {i + 1} of {n_tensors})"
                name = w.string(where).decode("utf-8", "replace")
                n_dims = w.uint(4, where)
                if n_dims > 8:
                    return f"tensor {name!r} claims {n_dims} dimensions"
                dims = [w.uint(8, where) for _ in range(n_dims)]
                ttype, offset = w.uint(4, where), w.uint(8, where)
                if ttype not in GGML_QUANT_SIZES:
                    return f"tensor {name!r} has an unknown type ({ttype})"
                block, nbytes = GGML_QUANT_SIZES[ttype]
                count = 1
                for d in dims:
                    count *= d
                if count % block:
                    return f"tensor {name!r} of shape {dims} does not fill whole blocks of its type"
                tensors.append((name, offset, count // block * nbytes))
            start = -(-w.pos // alignment) * alignment
            for name, offset, nbytes in tensors:
                if start + offset + nbytes > size:
                    return (
                        f"it is {size:,} bytes, but its tensor {name!r} ends at byte {start + offset + nbytes:,}: "
                        "shorter than its own header says"
                    )
    except _Cut as e:
        return str(e)
    except OSError as e:
        return f"it cannot be read ({e.strerror or e})"
    return None


def check_gguf(path: str | Path) -> None:
    """A `ModelError` (exit 2) naming a `.gguf` file that is not whole and why, or nothing."""
    why = gguf_problem(path)
    if why:
        raise ModelError(
            f"the GGUF file {path} is not whole: {why}: copy or download it again (an interrupted copy or "
            "download leaves a file cut short), or give another --model"
        )
