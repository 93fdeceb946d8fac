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

from .errors import ModelError

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
        problems += [f"{name} (named by model.safetensors.index.json) is missing" for name in sorted(named)
                     if isinstance(name, str) and not (path / name).is_file()]  # fmt: skip
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
