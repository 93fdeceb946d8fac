"""Checkpoint conversion: Hugging Face directory, hub id or GGUF file -> MLX safetensors.

The output directory is a plain Hugging Face layout (`config.json`, `model.safetensors`
with Hugging Face tensor names, tokenizer files), so mlx-lm and Transformers load it
too: that is how the parity check runs Transformers on the very same weight values.
GGUF tensors are dequantized to float32 with the `gguf` package (no torch needed) and
then cast once to the requested dtype. A `conversion.json` records where it came from.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from .errors import UserError
from .model import SUPPORTED_ARCHITECTURES

DTYPES = ("float16", "bfloat16", "float32")
RECORD = "conversion.json"
WEIGHTS = "model.safetensors"

Progress = Callable[[str], None]


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


class ConversionError(UserError, ValueError):
    """A source that cannot be converted; the message says why and what to do."""


def _check_arch(model_type: str | None, where: str) -> None:
    if model_type not in SUPPORTED_ARCHITECTURES:
        raise ConversionError(
            f"{where}: architecture {model_type!r} is not supported; supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
        )


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


# --------------------------------------------------------------------------- GGUF

_GGUF_NAMES = {
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
_GGUF_TOP = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_ARCH_CLASS = {"qwen2": "Qwen2ForCausalLM", "llama": "LlamaForCausalLM"}


def _gguf_hf_name(name: str) -> str | None:
    if name in _GGUF_TOP:
        return _GGUF_TOP[name]
    parts = name.split(".")  # blk.N.attn_q.weight
    if len(parts) == 4 and parts[0] == "blk" and parts[2] in _GGUF_NAMES:
        return f"model.layers.{parts[1]}.{_GGUF_NAMES[parts[2]]}.{parts[3]}"
    return None


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation (interleaved RoPE) back to Hugging Face's halves."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _gguf_field(reader: Any, key: str, default: Any = None) -> Any:
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def gguf_config(reader: Any) -> dict[str, Any]:
    """A Hugging Face config dict from GGUF metadata (qwen2 / llama)."""
    from transformers import AutoConfig

    arch = _gguf_field(reader, "general.architecture")
    _check_arch(arch, "GGUF")
    g = lambda k, d=None: _gguf_field(reader, f"{arch}.{k}", d)  # noqa: E731
    names = {t.name for t in reader.tensors}
    embd = next(t for t in reader.tensors if t.name == "token_embd.weight")
    heads = int(g("attention.head_count"))
    hidden = int(g("embedding_length"))
    kwargs: dict[str, Any] = dict(
        architectures=[_ARCH_CLASS[arch]],
        hidden_size=hidden,
        num_hidden_layers=int(g("block_count")),
        intermediate_size=int(g("feed_forward_length")),
        num_attention_heads=heads,
        num_key_value_heads=int(g("attention.head_count_kv", heads)),
        rms_norm_eps=float(g("attention.layer_norm_rms_epsilon")),
        max_position_embeddings=int(g("context_length", 32768)),
        vocab_size=int(embd.shape[1]),  # GGUF shapes are reversed: (hidden, vocab)
        tie_word_embeddings="output.weight" not in names,
        rope_theta=float(g("rope.freq_base", 10000.0)),
        bos_token_id=_gguf_field(reader, "tokenizer.ggml.bos_token_id"),
        eos_token_id=_gguf_field(reader, "tokenizer.ggml.eos_token_id"),
        pad_token_id=_gguf_field(reader, "tokenizer.ggml.padding_token_id"),
    )
    key_len = g("attention.key_length")
    if key_len is not None and int(key_len) != hidden // heads:
        kwargs["head_dim"] = int(key_len)
    if arch == "llama":
        kwargs["attention_bias"] = False
    cfg = AutoConfig.for_model(arch, **kwargs).to_dict()
    cfg.setdefault("rope_theta", kwargs["rope_theta"])  # readable by every transformers version
    return cfg


def iter_gguf_tensors(path: Path, config: dict[str, Any]) -> Iterator[tuple[str, np.ndarray]]:
    """(Hugging Face name, float32 array) for every tensor, dequantized."""
    from gguf import GGUFReader
    from gguf.quants import dequantize

    reader = GGUFReader(str(path))
    llama = config["model_type"] == "llama"
    for t in reader.tensors:
        name = _gguf_hf_name(t.name)
        if name is None:
            if t.name.startswith("rope_freqs"):
                raise ConversionError(f"{path}: RoPE frequency scaling ({t.name}) is not supported")
            continue
        shape = tuple(int(x) for x in reversed(t.shape))
        w = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(shape)
        if llama and name.endswith(("q_proj.weight", "k_proj.weight")):
            n = config["num_attention_heads"] if "q_proj" in name else config["num_key_value_heads"]
            w = _unpermute(w, n)
        yield name, w


# --------------------------------------------------------------------------- Hugging Face

def resolve_hf_dir(src: str) -> Path:
    """A local directory as is; anything else is taken as a hub id and downloaded."""
    p = Path(src).expanduser()
    if p.is_dir():
        return p
    if p.exists():
        raise ConversionError(f"{src}: not a directory, a .gguf file or a hub id")
    if src.count("/") != 1 or src.startswith((".", "/", "~")):
        raise ConversionError(f"{src}: no such file or directory, and not a hub id like 'Qwen/Qwen2.5-0.5B-Instruct'")
    from huggingface_hub import snapshot_download

    try:
        return Path(
            snapshot_download(
                src,
                allow_patterns=["*.json", "*.safetensors", "*.txt", "*.model", "*.jinja", "tokenizer*"],
            )
        )
    except Exception as e:  # network, auth, missing repo: say so plainly
        raise ConversionError(f"{src}: could not fetch from the Hugging Face hub ({type(e).__name__}: {e})") from e


def iter_hf_tensors(path: Path) -> Iterator[tuple[str, np.ndarray | Any]]:
    import mlx.core as mx

    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ConversionError(f"{path}: no *.safetensors files (PyTorch .bin checkpoints are not read)")
    for f in files:
        for name, arr in mx.load(str(f)).items():  # mx.load reads bfloat16, numpy cannot
            yield name, arr


# --------------------------------------------------------------------------- driver

def source_kind(src: str | Path) -> str:
    p = Path(src).expanduser()
    if p.suffix == ".gguf":
        if not p.is_file():
            raise ConversionError(f"{src}: no such GGUF file")
        return "gguf"
    if p.is_dir() and not (p / "config.json").is_file():
        raise ConversionError(f"no config.json in {src}: not a Hugging Face or MLX model directory")
    return "hf"


def convert(
    src: str | Path, out: str | Path, dtype: str = "float16", progress: Progress | None = _stderr
) -> Path:
    """Convert `src` (HF directory, hub id, `.gguf`) into an MLX directory `out` in `dtype`."""
    if dtype not in DTYPES:
        raise ConversionError(f"dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    say = progress or (lambda _m: None)
    out = Path(out)
    kind = source_kind(src)
    tmp = out.with_name(out.name + ".partial")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    try:
        _convert_into(tmp, src, kind, dtype, say)
    except BaseException:  # a failed or interrupted conversion leaves nothing behind
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)  # all or nothing: an interrupted conversion never looks finished
    return out


def _convert_into(tmp: Path, src: str | Path, kind: str, dtype: str, say: Progress) -> None:
    import mlx.core as mx
    from transformers import AutoTokenizer

    if kind == "gguf":
        from gguf import GGUFReader

        path = Path(src).expanduser().resolve()
        config = gguf_config(GGUFReader(str(path)))
        tensors = iter_gguf_tensors(path, config)
        tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        hashed = [path]
    else:
        path = resolve_hf_dir(str(src)).resolve()
        config = json.loads((path / "config.json").read_text())
        _check_arch(config.get("model_type"), str(src))
        tensors = iter_hf_tensors(path)
        tokenizer = AutoTokenizer.from_pretrained(str(path))
        hashed = sorted(path.glob("*.safetensors"))

    target = getattr(mx, dtype)
    weights: dict[str, mx.array] = {}
    tied = bool(config.get("tie_word_embeddings"))
    for i, (name, w) in enumerate(tensors):
        if "rotary_emb.inv_freq" in name or (tied and name == "lm_head.weight"):
            continue
        a = w if isinstance(w, mx.array) else mx.array(w)
        weights[name] = a.astype(target)
        mx.eval(weights[name])
        if i % 50 == 0:
            say(f"  converting tensors: {i + 1}")
    say(f"  {len(weights)} tensors -> {dtype}")
    mx.save_safetensors(str(tmp / WEIGHTS), weights, metadata={"format": "mlx"})

    config.pop("quantization_config", None)
    config["torch_dtype"] = dtype
    config["dtype"] = dtype
    (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    tokenizer.save_pretrained(str(tmp))

    say("  hashing the source")
    record = {
        "source": str(src),
        "source_kind": kind,
        "source_path": str(path),
        "source_sha256": {p.name: sha256_file(p) for p in hashed},
        "dtype": dtype,
        "architecture": config["model_type"],
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "versions": _versions(),
    }
    record["weights_sha256"] = sha256_file(tmp / WEIGHTS)
    (tmp / RECORD).write_text(json.dumps(record, indent=2) + "\n")


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    got = {}
    for pkg in ("mlx-slm", "mlx", "transformers", "gguf", "numpy"):
        try:
            got[pkg] = version(pkg)
        except PackageNotFoundError:
            pass
    return got


def weights_sha256(path: str | Path) -> str:
    """sha256 of a converted directory's weights: from its record, or hashed once and recorded."""
    p = Path(path)
    rec_path = p / RECORD
    record = json.loads(rec_path.read_text()) if rec_path.is_file() else {}
    if "weights_sha256" not in record:
        record["weights_sha256"] = sha256_file(p / WEIGHTS)
        try:
            rec_path.write_text(json.dumps(record, indent=2) + "\n")
        except OSError:  # a read-only model directory: hash again next time
            pass
    return record["weights_sha256"]


def is_converted(path: str | Path) -> bool:
    p = Path(path)
    return p.is_dir() and (p / RECORD).is_file() and (p / WEIGHTS).is_file()
