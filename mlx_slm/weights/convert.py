"""Checkpoint conversion: a local Hugging Face directory or GGUF file -> MLX safetensors.

Local files to local files only: `sources.py` resolves a name or hub id and fetches it first.

The output directory is a plain Hugging Face layout (`config.json`, `model.safetensors`
with Hugging Face tensor names, tokenizer files), so mlx-lm and Transformers load it
too: that is how the parity check runs Transformers on the very same weight values.
GGUF tensors are dequantized to float32 with the `gguf` package (no torch needed) and
then cast once to the requested dtype. A `conversion.json` records where it came from.

`quantize=4|8` then packs every Linear and Embedding weight whose input size is a
multiple of the group size as mlx-lm does (`mx.quantize`, affine; norms and biases stay
in `dtype`), and writes mlx-lm's `quantization` entry to config.json, so `mlx_lm.load`
reads the directory too. An mlx-lm quantized source is copied as it is stored.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import shutil
from collections.abc import Callable, Iterator
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np

from ..ground.errors import ModelError, OutputError, UserError
from ..ground.jsonfiles import write_json_atomic
from ..ground.notices import notice
from ..ground.safefs import DIR_MODE, refuse_symlink, temp_dir
from ..models import SUPPORTED_ARCHITECTURES, _sanitize, get_model_module, gguf_module, mlxlm, model_type_of, quant
from ..models.base import gguf_hf_name
from ..text.seqcls import SCORE, SCORE_WEIGHT, SeqClsHead, check_head_tensor
from .modelfiles import check_gguf, check_model_dir, load_tokenizer
from .stfolder import backbone_dir, copy_sentence_transformers, module_files

DTYPES = ("float16", "bfloat16", "float32")
RECORD = "conversion.json"
WEIGHTS = "model.safetensors"

Progress = Callable[[str], None]


class ConversionError(UserError, ValueError):
    """A source that cannot be converted; the message says why and what to do."""


def _check_arch(model_type: str | None, where: str) -> Any:
    """The architecture module (mlx_slm.models) for `model_type`; None for one only mlx-lm
    knows (it runs through mlx-lm's model class: models/mlxlm.py); else a ConversionError."""
    try:
        return get_model_module(model_type)
    except ModelError:
        if mlxlm.knows(model_type):
            return None
        why = mlxlm.UNSUPPORTED.get(str(model_type))
        raise ConversionError(
            f"{where}: architecture {model_type!r} is not supported"
            + (f": {why}" if why else f"; supported: {', '.join(SUPPORTED_ARCHITECTURES)}, or one mlx-lm knows")
        ) from None


def _check_config(config: dict[str, Any], where: str) -> None:
    """Refuse, before any tensor is read, a config the forward would not compute exactly."""
    try:
        model_type_of(config)
    except ModelError as e:
        raise ConversionError(f"{where}: {e}") from None
    module = _check_arch(config.get("model_type"), where)
    try:
        SeqClsHead.from_config(config)  # a sequence classifier's labels and problem type
        module.ModelArgs.from_dict(config) if module is not None else mlxlm.check_config(config)
    except ModelError as e:
        raise ConversionError(f"{where}: {e}") from None


def _check_head(config: dict[str, Any], weights: dict[str, Any], where: str) -> None:
    """Refuse a `score.weight` that does not match the config (`seqcls.check_head_tensor`),
    before anything is written."""
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    w = weights.get(SCORE_WEIGHT)
    try:
        check_head_tensor(
            SeqClsHead.from_config(config),
            None if w is None else w.shape,
            text.get("hidden_size"),
            where,
            names=list(weights),
        )
    except ModelError as e:
        raise ConversionError(str(e)) from None


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


# --------------------------------------------------------------------------- what a conversion converted

# The files of a Hugging Face folder a conversion reads (config, weights, tokenizer, chat template).
SOURCE_FILES = ("*.json", "*.safetensors", "*.txt", "*.model", "*.jinja", "tokenizer*")
SMALL_FILE = 16 << 20  # files up to this size are recorded by their sha256, larger ones by their stat


def _fingerprint(f: Path) -> dict[str, Any]:
    """How a conversion records one source file: a small file's sha256 (its content); a large
    one's size, modification and change times (a rewrite, a copy over it, `cp -p` of another
    file: each changes one of them), its sha256 checked before a stat alone reconverts it."""
    st = f.stat()
    if st.st_size <= SMALL_FILE:
        return {"sha256": sha256_file(f)}
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns}


def source_files(src: str | Path) -> dict[str, dict[str, Any]]:
    """The fingerprint of every file a conversion of `src` reads, by its name relative to `src`
    (a GGUF: the file; a folder: its `SOURCE_FILES`, and a sentence-transformers folder's every
    module file, subfolders included: `1_Pooling/config.json`, a Transformer's `0_Transformer/*`,
    `stfolder.module_files`): what `conversion.json` records and `source_changes` checks."""
    p = Path(src).expanduser().resolve()
    if p.is_file():
        return {p.name: _fingerprint(p)}
    names = {f.name for pattern in SOURCE_FILES for f in p.glob(pattern) if f.is_file()}
    names = {n for n in names if not n.startswith(".")} | set(module_files(p))
    return {n: _fingerprint(p / n) for n in sorted(names)}


def source_changes(out: str | Path, src: str | Path) -> list[str]:
    """The files of `src` that differ from what the conversion in `out` converted (changed,
    added or removed; `["conversion.json"]` for a conversion that recorded none): empty when
    `out` is still `src` converted. A large file whose stat changed but whose sha256 is the one
    recorded is the same file (its new stat is recorded, when the record can be written)."""
    rec_path = Path(out) / RECORD
    try:
        record = json.loads(rec_path.read_text(encoding="utf-8"))
        want = record["source_files"]
        if not isinstance(want, dict):
            raise TypeError
    except (OSError, ValueError, KeyError, TypeError):
        return [RECORD]
    p = Path(src).expanduser().resolve()
    try:
        now = source_files(p)
    except OSError:
        return [p.name]
    changed = sorted(set(want) ^ set(now))
    hashes = record.get("source_sha256") if isinstance(record.get("source_sha256"), dict) else {}
    same_content = []
    for name in sorted(set(want) & set(now)):
        if want[name] == now[name]:
            continue
        f = p / name if p.is_dir() else p
        if "size" in now[name] and hashes.get(name) is not None and hashes.get(name) == sha256_file(f):
            same_content.append(name)  # touched, not changed
        else:
            changed.append(name)
    if same_content and not changed:
        record["source_files"] = {**want, **{n: now[n] for n in same_content}}
        try:
            write_json_atomic(rec_path, record)
        except (OSError, OutputError):  # a read-only cache: hashed again next time
            pass
    return changed


# --------------------------------------------------------------------------- GGUF


def _gguf_field(reader: Any, key: str, default: Any = None) -> Any:
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def _gguf_arch(reader: Any) -> Any:
    """The architecture module for a GGUF's `general.architecture`, or a ConversionError."""
    arch = _gguf_field(reader, "general.architecture")
    try:
        return gguf_module(arch)
    except ModelError as e:
        raise ConversionError(f"GGUF: {e}") from None


def gguf_config(reader: Any) -> dict[str, Any]:
    """A Hugging Face config dict from GGUF metadata, as the architecture's module reads it."""
    from transformers import AutoConfig  # lazy: a slow import

    module = _gguf_arch(reader)
    arch = module.GGUF_ARCH
    meta = lambda k, d=None: _gguf_field(reader, f"{arch}.{k}", d)  # noqa: E731
    shapes = {t.name: tuple(int(x) for x in reversed(t.shape)) for t in reader.tensors}  # GGUF lists dims reversed
    try:  # metadata of the wrong type (a string where a count belongs) fails in the reading: say so
        kwargs: dict[str, Any] = module.gguf_config(meta, shapes)
        kwargs.update(
            architectures=[module.HF_ARCHITECTURE],
            bos_token_id=_gguf_field(reader, "tokenizer.ggml.bos_token_id"),
            eos_token_id=_gguf_field(reader, "tokenizer.ggml.eos_token_id"),
            pad_token_id=_gguf_field(reader, "tokenizer.ggml.padding_token_id"),
        )
        model_type = getattr(module, "HF_MODEL_TYPE", arch)
        cfg = AutoConfig.for_model(model_type, **kwargs).to_dict()
        cfg.setdefault("rope_theta", kwargs["rope_theta"])  # readable by every transformers version
    except (TypeError, ValueError, KeyError, AttributeError, IndexError) as e:
        raise ConversionError(
            f"GGUF: its {arch} metadata cannot be read as a model config ({type(e).__name__}: {e}): the file is "
            "damaged or not written by llama.cpp's converter; download it again"
        ) from None
    try:
        module.ModelArgs.from_dict(cfg)  # refuse here what the forward would not compute
    except ModelError as e:
        raise ConversionError(f"GGUF: {e}") from None
    return cfg


def iter_gguf_tensors(path: Path, config: dict[str, Any]) -> Iterator[tuple[str, np.ndarray]]:
    """(Hugging Face name, float32 array) for every tensor, dequantized and un-permuted."""
    from gguf import GGUFReader  # lazy: GGUF input only
    from gguf.quants import dequantize  # lazy: GGUF input only

    reader = GGUFReader(str(path))
    module = get_model_module(config["model_type"])
    for t in reader.tensors:
        name = gguf_hf_name(t.name, module.GGUF_LAYER_NAMES)
        if name is None:
            if t.name.startswith("rope_freqs"):
                raise ConversionError(f"{path}: RoPE frequency scaling ({t.name}) is not supported")
            continue
        shape = tuple(int(x) for x in reversed(t.shape))
        w = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(shape)
        yield name, module.gguf_tensor(name, w, config)


# --------------------------------------------------------------------------- Hugging Face


def iter_hf_tensors(path: Path) -> Iterator[tuple[str, np.ndarray | Any]]:
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ConversionError(f"{path}: no *.safetensors files (PyTorch .bin checkpoints are not read)")
    for f in files:
        yield from mx.load(str(f)).items()  # mx.load reads bfloat16, numpy cannot


# --------------------------------------------------------------------------- driver


def local_type(src: str | Path) -> str:
    """The type of a local source: "gguf" or "hf" (or a ConversionError saying why neither).

    The one rule for what local files are (`sources.resolve` asks it too); nothing here
    fetches: a hub id or a built-in name is `sources.local`'s to turn into local files."""
    p = Path(src).expanduser()
    if p.suffix == ".gguf":
        if not p.is_file():
            raise ConversionError(f"{src}: no such GGUF file")
        return "gguf"
    if p.is_dir():
        try:
            found = (backbone_dir(p) / "config.json").is_file()  # a sentence-transformers 0_Transformer/ too
        except ModelError as e:
            raise ConversionError(str(e)) from None
        if not found:
            raise ConversionError(f"no config.json in {src}: not a Hugging Face or MLX model directory")
        return "hf"
    if p.exists():
        raise ConversionError(f"{src}: not a directory, a .gguf file or a hub id")
    raise ConversionError(
        f"{src}: no such file or directory (convert reads local files; mlx_slm.weights.sources fetches "
        "a hub id or a built-in name first)"
    )


def convert(
    src: str | Path,
    out: str | Path,
    dtype: str = "float16",
    progress: Progress | None = notice,
    quantize: int | None = None,
    group_size: int | None = None,
    force: bool = False,
    origin: str | None = None,
) -> Path:
    """Convert `src` (a local HF directory or `.gguf` file) into an MLX directory `out` in `dtype`.

    origin: what the record names as the source (default `src`; `sources` passes the hub id
    of a hub snapshot).

    quantize: 4 or 8 to write an mlx-lm quantized directory (`group_size` 32, 64 or 128,
    default 64) instead of a floating-point one.

    `out` may be new, an empty folder, or a previous conversion of ours (replaced);
    anything else is refused unless `force` (then it is replaced whole). The source is
    never touched: `out` may not be it, hold it or lie inside it. The conversion is
    written into a private temporary folder beside `out` and renamed into place at the
    end, so an interrupted conversion never looks finished.
    """
    if dtype not in DTYPES:
        raise ConversionError(f"dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    check_quantize(quantize, group_size)
    say = progress or (lambda _m: None)
    out = Path(out)
    source_type = local_type(src)
    if source_type == "hf":
        check_model_dir(backbone_dir(Path(src).expanduser()))  # config, tokenizer, whole weights: before any work
    else:
        check_gguf(Path(src).expanduser())  # its header whole and its tensors as long as it says
    check_out_dir(src, out, force)
    tmp = temp_dir(out, "--out")
    try:
        _convert_into(tmp, src, source_type, dtype, say, quantize, group_size or quant.DEFAULT_GROUP_SIZE, origin)
        tmp.chmod(DIR_MODE)  # mkdtemp's 0700 -> what a plain mkdir would give
        check_out_dir(src, out, force)  # again: something may have appeared there meanwhile
        _move_into_place(tmp, out)
    except BaseException:  # a failed or interrupted conversion leaves nothing behind
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


# Files a conversion writes besides the record (tokenizer files vary with the tokenizer).
_OURS = {WEIGHTS, RECORD, "config.json", "generation_config.json", "special_tokens_map.json", "chat_template.jinja"}
_OURS_PREFIXES = ("tokenizer", "vocab", "merges", "added_tokens", "spiece")


def _is_our_conversion(out: Path) -> list[str] | None:
    """None if `out` is a previous conversion of ours holding only its own files, else the
    names of the files that are not (all of them, if it is no conversion)."""
    names = sorted(p.name for p in out.iterdir())
    try:
        record = json.loads((out / RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return names
    if not isinstance(record, dict) or "source_kind" not in record or not (out / WEIGHTS).is_file():
        return names
    listed = record.get("files")
    if isinstance(listed, list):
        foreign = [n for n in names if n not in listed and n != RECORD]
    else:  # a conversion from before the record listed its files
        foreign = [n for n in names if n not in _OURS and not n.startswith(_OURS_PREFIXES)]
        listed = []
    # Folders: only a sentence-transformers module's config the conversion copied (`1_Pooling`).
    foreign += [n for n in names if (out / n).is_symlink() or ((out / n).is_dir() and n not in listed)]
    return sorted(set(foreign)) or None


def _inside(a: Path, b: Path) -> bool:
    """a is b or lies inside b (both resolved)."""
    return a == b or b in a.parents


def check_out_dir(src: str | Path, out: Path, force: bool = False) -> None:
    """Refuse an --out that is, holds or lies in the source, a link, a file, or a folder
    that is not a previous conversion of ours (unless `force`)."""
    refuse_symlink(out, "--out")
    real_out = out.resolve()  # its last component is no link (refused above)
    sp = Path(src).expanduser()
    if sp.exists():
        real_src = sp.resolve()
        src_dir = real_src if real_src.is_dir() else None
        if _inside(real_src, real_out) or (src_dir is not None and _inside(real_out, src_dir)):
            raise ConversionError(
                f"--out {out} {'is' if real_src == real_out else 'holds' if _inside(real_src, real_out) else 'is inside'} "
                f"the source {src}: a conversion never writes into its source; choose an --out outside it"
            )
    if not os.path.lexists(out):
        return
    if not out.is_dir():
        raise ConversionError(f"--out {out} exists and is not a folder: choose another --out (or remove it)")
    try:
        foreign = _is_our_conversion(out)
    except OSError as e:
        raise ConversionError(f"--out {out} cannot be read ({e.strerror})") from None
    if not foreign:
        return
    here = Path.cwd().resolve()
    if force:
        if _inside(here, real_out) or _inside(Path.home().resolve(), real_out):
            raise ConversionError(
                f"--out {out} holds the current folder or your home folder: not replacing it even with --force"
            )
        return
    shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
    raise ConversionError(
        f"--out {out} is not empty and not a previous conversion ({shown}): it is left untouched; "
        f"choose a new or empty folder, or add --force to replace {out} and everything in it"
    )


def _move_into_place(tmp: Path, out: Path) -> None:
    """Rename the finished `tmp` to `out`; an `out` already there (checked: ours, empty or
    --force) is moved aside first and removed only once the new one is in place."""
    if not os.path.lexists(out):
        tmp.rename(out)
        return
    aside = temp_dir(out, "--out")  # a private folder: nobody can race us for the name inside it
    try:
        out.rename(aside / "old")
    except OSError as e:
        aside.rmdir()
        raise OutputError(f"cannot replace --out {out} ({e.strerror})") from None
    try:
        tmp.rename(out)
    except BaseException:
        (aside / "old").rename(out)
        aside.rmdir()
        raise
    shutil.rmtree(aside, ignore_errors=True)


def check_quantize(bits: int | None, group_size: int | None) -> None:
    """Refuse quantization settings `convert` does not write, saying which it does."""
    if bits is None:
        if group_size is not None:
            raise ConversionError("a group size only applies to a quantized conversion: add --quantize 4|8")
        return
    if bits not in quant.BITS:
        raise ConversionError(f"--quantize {bits}: quantize to {' or '.join(map(str, quant.BITS))} bits per weight")
    if group_size is not None and group_size not in quant.GROUP_SIZES:
        raise ConversionError(
            f"--group-size {group_size}: use {', '.join(map(str, quant.GROUP_SIZES))} "
            "(weights sharing one scale and bias; smaller is more accurate and larger)"
        )


def _quantizable(config: dict[str, Any], weights: dict[str, Any], group_size: int) -> tuple[list[str], list[str]]:
    """(names to pack, names left in floating point): the weight of every Linear and Embedding
    of the model, packed when its input size is a multiple of the group size (mlx-lm's rule)."""

    try:
        module = get_model_module(config["model_type"])
    except ModelError:  # an architecture only mlx-lm covers: its model's layers and sanitize
        layers, sanitize = mlxlm.quantizable(config)
    else:
        args = module.ModelArgs.from_dict(config)
        layers = {p for p, m in module.Model(args).named_modules() if hasattr(m, "to_quantized")}
        sanitize = lambda w: _sanitize(module)(w, args)  # noqa: E731
    names = list(weights)
    # The file keeps the source's names; map them to the model's through its sanitize (which
    # renames and drops tensors, never changes values) by passing each tensor's index. A
    # tensor sanitize combines with others (mlx-lm stacking experts) is left unquantized.
    # A sequence classifier's `score` stays in floating point: num_labels x hidden is a few KB
    # (nothing to save), and its rounding would land on the logits with no layer after it.
    marks = sanitize({n: mx.array(i) for i, n in enumerate(names)})
    found = [
        names[int(v.item())]
        for k, v in marks.items()
        if v.size == 1 and k.endswith(".weight") and k[: -len(".weight")] in layers - {SCORE}
    ]
    fits = [n for n in found if weights[n].shape[-1] % group_size == 0]
    return fits, [n for n in found if n not in fits]


def _quantize_weights(
    weights: dict[str, Any], config: dict[str, Any], bits: int, group_size: int, say: Progress
) -> dict[str, Any]:

    packed, left = _quantizable(config, weights, group_size)
    if not packed:
        raise ConversionError(
            f"group size {group_size} divides the input size of none of the model's layers "
            f"(hidden size {config.get('hidden_size')}): choose a smaller --group-size"
        )
    for name in packed:
        base = name[: -len(".weight")]
        q, s, b = mx.quantize(weights[name], group_size=group_size, bits=bits)
        mx.eval(q, s, b)
        weights[name], weights[f"{base}.scales"], weights[f"{base}.biases"] = q, s, b
    say(
        f"  {len(packed)} weight matrices -> {bits}-bit, group size {group_size}"
        + (f"; {len(left)} left unquantized (input size not a multiple of {group_size})" if left else "")
    )
    return weights


def _read_source(
    src: str | Path, path: Path, source_type: str, bits: int | None
) -> tuple[dict, Any, Any, list[Path], Any]:
    """(config, its tensors, tokenizer, the files hashed as the source, the quantization it is stored in) of a
    GGUF or a Hugging Face folder, its config checked."""
    if source_type == "gguf":
        from gguf import GGUFReader  # lazy: GGUF input only

        config = gguf_config(GGUFReader(str(path)))
        tensors = iter_gguf_tensors(path, config)
        tokenizer = load_tokenizer(path.parent, gguf_file=path.name)
        hashed = [path]
        stored = None
    else:
        path = backbone_dir(path)  # a sentence-transformers folder's Transformer module: its root or 0_Transformer/
        config = json.loads((path / "config.json").read_text())
        _check_config(config, str(src))
        try:
            stored = quant.quantization_of(config)
        except ModelError as e:
            raise ConversionError(f"{src}: {e}") from None
        if stored is not None and bits is not None:
            raise ConversionError(
                f"{src} is already {quant.describe(stored)} quantized: convert the unquantized checkpoint "
                "with --quantize, or drop --quantize to use it as it is"
            )
        tensors = iter_hf_tensors(path)
        tokenizer = load_tokenizer(path)
        hashed = sorted(path.glob("*.safetensors"))

    return config, tensors, tokenizer, hashed, stored


def _convert_into(
    tmp: Path,
    src: str | Path,
    source_type: str,
    dtype: str,
    say: Progress,
    bits: int | None = None,
    group_size: int = quant.DEFAULT_GROUP_SIZE,
    origin: str | None = None,
) -> None:

    recorded = source_files(src)  # before anything is read: an edit made during the conversion converts again
    path = Path(src).expanduser().resolve()
    config, tensors, tokenizer, hashed, stored = _read_source(src, path, source_type, bits)
    copied = stored is not None  # an mlx-lm quantized source
    target = getattr(mx, dtype)
    weights: dict[str, mx.array] = {}
    no_lm_head = bool(config.get("tie_word_embeddings")) or SeqClsHead.from_config(config) is not None
    for i, (name, w) in enumerate(tensors):
        if "rotary_emb.inv_freq" in name or (no_lm_head and name.startswith("lm_head.")):
            continue
        a = w if isinstance(w, mx.array) else mx.array(w)
        weights[name] = a if copied else a.astype(target)  # packed tensors: as they are stored
        mx.eval(weights[name])
        if i % 50 == 0:
            say(f"  converting tensors: {i + 1}")
    if copied:
        say(f"  {len(weights)} tensors, {quant.describe(stored)} quantized: copied as stored (--dtype does not apply)")
    else:
        say(f"  {len(weights)} tensors -> {dtype}")
    _check_head(config, weights, str(hashed[0] if len(hashed) == 1 else path))
    if bits is not None:
        weights = _quantize_weights(weights, config, bits, group_size, say)
    mx.save_safetensors(str(tmp / WEIGHTS), weights, metadata={"format": "mlx"})

    source_dtype = config.get("torch_dtype") or config.get("dtype")  # what it was trained/published in
    if not copied:
        config.pop("quantization_config", None)
        config.pop("quantization", None)
        config["torch_dtype"] = dtype
        config["dtype"] = dtype
    if bits is not None:  # mlx-lm writes both keys (`quantization_config` for Hugging Face tooling)
        stored = {"group_size": group_size, "bits": bits, "mode": "affine"}
        config["quantization"] = dict(stored)
        config["quantization_config"] = dict(stored)
    (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    tokenizer.save_pretrained(str(tmp))
    st_files = copy_sentence_transformers(path, tmp) if source_type == "hf" else {}  # its pooling and prompts
    for name in DECISION_FILES:  # a decision model's settings, read from the converted folder as from the source
        if path.is_dir() and (path / name).is_file():
            shutil.copyfile(path / name, tmp / name)

    say("  hashing the source")
    record = {
        "source": origin or str(src),
        "source_kind": source_type,
        "source_path": str(path),
        "source_sha256": {
            (p.relative_to(path).as_posix() if source_type == "hf" else p.name): sha256_file(p) for p in hashed
        },
        "sentence_transformers_files": st_files,
        "source_files": recorded,
        "dtype": source_dtype if copied else dtype,
        "source_dtype": source_dtype,
        "quantization": stored,
        "architecture": config["model_type"],
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "versions": versions(),
    }
    record["weights_sha256"] = sha256_file(tmp / WEIGHTS)
    record["weights_stat"] = _weights_stat(tmp / WEIGHTS)
    record["files"] = sorted([p.name for p in tmp.iterdir()] + [RECORD])  # what a later --out may replace
    (tmp / RECORD).write_text(json.dumps(record, indent=2) + "\n")


# Transformers' decision settings (`transformers.decision.DecisionConfig`: labels, temperatures, the
# decision prompt), copied beside the weights so `classifier.decider.Decider` reads them there.
DECISION_FILES = ("decision.json", "decision_template.jinja")


def versions() -> dict[str, str]:
    """Versions of the libraries that decide what a file we write means."""

    got = {}
    for pkg in ("mlx-slm", "mlx", "transformers", "gguf", "numpy"):
        try:
            got[pkg] = version(pkg)
        except PackageNotFoundError:
            pass
    return got


def _weights_stat(f: Path) -> list[int]:
    st = f.stat()
    return [st.st_size, st.st_mtime_ns]


def weights_sha256(path: str | Path) -> str:
    """sha256 of a converted directory's weights: from its record while the weights file is the
    one it was recorded for (its size and modification time), else hashed again and recorded."""
    p = Path(path)
    rec_path = p / RECORD
    record = json.loads(rec_path.read_text()) if rec_path.is_file() else {}
    stat = _weights_stat(p / WEIGHTS)
    if "weights_sha256" not in record or record.get("weights_stat") != stat:  # a copy over model.safetensors
        record["weights_sha256"] = sha256_file(p / WEIGHTS)
        record["weights_stat"] = stat
        try:
            write_json_atomic(rec_path, record)
        except (OSError, OutputError):  # a read-only model directory (or a link): hash again next time
            pass
    return record["weights_sha256"]


def is_converted(path: str | Path) -> bool:
    p = Path(path)
    return p.is_dir() and (p / RECORD).is_file() and (p / WEIGHTS).is_file()


def dequantized_copy(path: str | Path, out: str | Path) -> Path:
    """A float32 Hugging Face directory holding the values of an MLX-quantized directory's
    weights, for Transformers (which cannot read mlx-lm's packing): the reference of a parity
    check on a quantized model. The values are those `load_model` dequantizes to."""

    src, out = Path(path), Path(out)
    config = json.loads((src / "config.json").read_text())
    q = quant.quantization_of(config)
    if q is None:
        raise ConversionError(f"{src} is not an MLX-quantized directory (no quantization entry in config.json)")
    try:  # our model's layer shapes tell unrecorded mixed widths apart
        module = get_model_module(config.get("model_type"))
        model = module.Model(module.ModelArgs.from_dict(config))
    except ModelError:  # an architecture only mlx-lm covers: the config's entries (mlx-lm records per-layer widths)
        model = None
    weights: dict[str, mx.array] = {}
    for f in sorted(src.glob("*.safetensors")):
        weights.update(mx.load(str(f)))
    weights = quant.dequantize_weights(quant.drop_orphans(weights), q, model)
    weights = {k: v.astype(mx.float32) if mx.issubdtype(v.dtype, mx.floating) else v for k, v in weights.items()}
    out.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(out / WEIGHTS), weights, metadata={"format": "mlx"})
    for k in ("quantization", "quantization_config"):
        config.pop(k, None)
    config["torch_dtype"] = config["dtype"] = "float32"
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    for f in src.iterdir():  # the tokenizer and generation files
        if (
            f.is_file()
            and f.suffix != ".safetensors"
            and f.name not in ("config.json", RECORD, "model.safetensors.index.json")
        ):
            shutil.copy2(f, out / f.name)
    return out
