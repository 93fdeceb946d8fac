"""Checkpoint conversion (`weights/convert.py`): a Hugging Face folder or a GGUF file to MLX safetensors,
refused before it starts where it cannot finish, leaving nothing behind when it fails."""

import json
import os
import shutil
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from click.testing import CliRunner

import mlx_slm  # noqa: F401  (the optimized BLAS before mlx.core)  # noqa: F401  (the optimized BLAS before mlx.core)
from mlx_slm.cli import main
from mlx_slm.ground.errors import ModelError, UserError
from mlx_slm.models import (
    load_model,
    sequence_logits,
)
from mlx_slm.parity.reference import SeqClsReference
from mlx_slm.weights import convert as convert_mod
from mlx_slm.weights import sources
from mlx_slm.weights.convert import ConversionError, convert, dequantized_copy
from mlx_slm.weights.sources import materialise
from tests.forward_parity import check_diff, padded


def test_a_folder_that_is_not_a_model_says_so_and_failed_conversions_leave_nothing(tmp_path, tiny_qwen_hf):
    from mlx_slm.weights.convert import ConversionError, convert

    empty = tmp_path / "notamodel"
    empty.mkdir()
    r = CliRunner().invoke(main, ["classify", "--model", str(empty), "-q"], input="hi\n")
    assert r.exit_code == 2 and f"no config.json in {empty}" in r.output and "converting" not in r.output
    # An architecture we do not run: the conversion fails after it started, and cleans up.
    bad = tmp_path / "bad"
    bad.mkdir()
    for f in tiny_qwen_hf.iterdir():
        (bad / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((bad / "config.json").read_text())
    cfg["model_type"] = "mamba"
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConversionError, match="mamba"):
        convert(bad, tmp_path / "out" / "m", progress=None)
    assert list((tmp_path / "out").iterdir()) == []


# Sequence-classification checkpoints converted: the score head's values kept (float16, in floating
# point beside a quantized body), a head that does not match its config refused, an edited conversion
# refused at load.


TOL = 1e-4


MAX_DIFF: dict[str, float] = {}  # case -> max |diff| seen (in the run's summary: conftest)


MULTI = "multi_label_classification"


def _check(name: str, ours, ref, tol: float = TOL) -> None:
    check_diff(MAX_DIFF, name, ours, ref, tol)


# --------------------------------------------------------------------------- dtypes and quantization


def test_float16_conversion_matches_transformers_on_its_values(tiny_arch, tmp_path):
    src = tiny_arch.seqcls_hf("qwen2", 4, MULTI)
    out = convert(src, tmp_path / "f16", dtype="float16", progress=None)
    m = load_model(out, dtype=mx.float32)
    assert m.score.weight.dtype == mx.float32
    ref = SeqClsReference(out, threads=1)  # Transformers on the float16 values, computed in float32
    rows = [[5, 9, 30, 2, 77], [12, 13]]
    got = np.array(sequence_logits(m, *padded(rows, 0)))
    for r, p in enumerate(rows):
        _check("qwen2-f16", got[r], ref.logits(p))


@pytest.mark.parametrize("bits", [4, 8])
def test_quantized_conversion_keeps_the_score_head_in_floating_point(tiny_arch, tmp_path, bits):
    src = tiny_arch.seqcls_hf("llama", 3)
    out = convert(src, tmp_path / f"q{bits}", dtype="float32", quantize=bits, group_size=32, progress=None)
    stored = mx.load(str(out / "model.safetensors"))
    assert "score.weight" in stored and "score.scales" not in stored and stored["score.weight"].dtype == mx.float32
    assert "model.layers.0.mlp.up_proj.scales" in stored
    m = load_model(out)  # dequantized at load on the CPU
    ref = SeqClsReference(dequantized_copy(out, tmp_path / f"deq{bits}"), threads=1)
    rows = [[5, 9, 30, 2, 77], [12, 13]]
    got = np.array(sequence_logits(m, *padded(rows, 0)))
    for r, p in enumerate(rows):
        _check(f"llama-q{bits}", got[r], ref.logits(p))
    packed = load_model(out, keep_quantized=True)  # kept packed: the same head, the same numbers up to matmul order
    assert packed.quantized and not hasattr(packed.score, "scales")
    np.testing.assert_allclose(np.array(sequence_logits(packed, *padded(rows, 0))), got, atol=1e-3)


# --------------------------------------------------------------------------- bad checkpoints


def _copy(src, dst, **config):
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    for k, v in config.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


@pytest.mark.parametrize(
    "edit,match",
    [
        (dict(id2label={"0": "a", "1": "b"}, label2id=None), r"score.weight has shape \(3, 64\).*2 labels.*\(2, 64\)"),
        (dict(id2label={"0": "a", "1": "b", "3": "c"}), r"config.json: id2label keys \[0, 1, 3\] are not 0..2"),
        (dict(problem_type="ranking"), r"config.json: problem_type 'ranking' is not one Transformers knows"),
        (dict(architectures=["Qwen2ForCausalLM"]), r"holds score.weight .* names no \*ForSequenceClassification"),
    ],
)
def test_a_head_that_does_not_match_its_config_is_refused_at_convert(tiny_arch, tmp_path, edit, match):
    src = _copy(tiny_arch.seqcls_hf("qwen2", 3), tmp_path / "src", **edit)
    out = tmp_path / "cache" / "m"
    out.parent.mkdir()
    with pytest.raises(ConversionError, match=match) as e:
        convert(src, out, dtype="float32", progress=None)
    assert str(src) in str(e.value) and isinstance(e.value, UserError)
    assert list(out.parent.iterdir()) == []  # nothing half-converted, no temporary folder


def test_a_missing_score_weight_is_refused_at_convert(tiny_arch, tmp_path):
    from safetensors.numpy import load_file, save_file

    src = _copy(tiny_arch.seqcls_hf("qwen2", 3), tmp_path / "src")
    weights = load_file(str(src / "model.safetensors"))
    del weights["score.weight"]
    save_file(weights, str(src / "model.safetensors"))
    with pytest.raises(ConversionError, match=r"model.safetensors: no score.weight, though config.json names Qwen2For"):
        convert(src, tmp_path / "out", dtype="float32", progress=None)
    assert not (tmp_path / "out").exists()


def test_a_converted_directory_edited_after_is_refused_at_load(tiny_arch, tmp_path):
    mlx_dir = _copy(tiny_arch.seqcls_mlx("qwen2", 3), tmp_path / "m", id2label={"0": "a", "1": "b"}, label2id=None)
    with pytest.raises(ModelError, match=r"m/model.safetensors: score.weight has shape \(3, 64\)"):
        load_model(mlx_dir)
    causal = _copy(tiny_arch.seqcls_mlx("qwen2", 3), tmp_path / "c", architectures=["Qwen2ForCausalLM"])
    with pytest.raises(ModelError, match="holds score.weight"):
        load_model(causal)


# No stale conversion (issue 40, item 2): a local model edited in place after its first use is
# converted again; the conversion records every file it read (size, times, and the sha256 of a large one).


TEXTS = ["hello there", "my bill is wrong", "the app crashes"]


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    h = tmp_path / "home"
    monkeypatch.setenv("MLX_SLM_HOME", str(h))
    return h


@pytest.fixture
def src(tiny_arch, tmp_path) -> Path:
    """A copy of the tiny sequence classifier's Hugging Face folder, ours to edit."""
    return Path(shutil.copytree(tiny_arch.seqcls_hf("qwen2", 3), tmp_path / "model"))


def _answers(model: Path) -> tuple[tuple[str, ...], np.ndarray]:
    from mlx_slm.classifier.classifier import Classifier

    clf = Classifier.load(str(model), dtype="float32")
    preds = clf.classify(TEXTS)
    labels = tuple(preds[0].probs)
    return labels, np.array([[p.probs[x] for x in labels] for p in preds])


def _no_conversion(monkeypatch) -> None:
    def refuse(*_a, **_k):
        raise AssertionError("converted again")

    monkeypatch.setattr(sources, "convert", refuse)


def test_a_config_rewritten_in_place_is_converted_again(src, home):
    labels, _ = _answers(src)
    assert labels == ("negative", "neutral", "positive")
    cfg = json.loads((src / "config.json").read_text())
    cfg["id2label"] = {"0": "bad", "1": "meh", "2": "good"}
    cfg["label2id"] = {"bad": 0, "meh": 1, "good": 2}
    with open(src / "config.json", "w") as f:  # in place: the folder's own stat does not change
        f.write(json.dumps(cfg))
    assert _answers(src)[0] == ("bad", "meh", "good")
    assert len(list((home / "converted").iterdir())) == 1  # the same entry, converted again


def _other_weights(src: Path, dst: Path) -> Path:
    """The same checkpoint with a different score head: same names, shapes and size."""
    from safetensors.numpy import load_file, save_file

    w = load_file(str(src / "model.safetensors"))
    w["score.weight"] = -w["score.weight"]
    save_file(w, str(dst), metadata={"format": "pt"})
    return dst


def test_weights_copied_over_even_with_the_old_timestamps_are_converted_again(src, home, tmp_path):
    _, before = _answers(src)
    other = _other_weights(src, tmp_path / "other.safetensors")
    st = (src / "model.safetensors").stat()
    assert other.stat().st_size == st.st_size
    os.utime(other, ns=(st.st_atime_ns, st.st_mtime_ns))  # same size, same modification time
    shutil.copy2(other, src / "model.safetensors")  # cp -p
    _, after = _answers(src)
    assert not np.allclose(after, before)


def test_a_changed_tokenizer_is_converted_again(src, home):
    from mlx_slm.engine.engine import Engine

    assert Engine.load(str(src)).tokenizer.model_max_length != 77
    tc = json.loads((src / "tokenizer_config.json").read_text())
    tc["model_max_length"] = 77
    (src / "tokenizer_config.json").write_text(json.dumps(tc))
    assert Engine.load(str(src)).tokenizer.model_max_length == 77


def test_an_untouched_model_is_not_converted_again(src, home, monkeypatch):
    out = materialise(str(src), "float32")
    _no_conversion(monkeypatch)
    for f in src.iterdir():  # touched (new times), the same content
        os.utime(f)
    assert materialise(str(src), "float32") == out


def test_a_large_file_touched_is_checked_by_its_sha256_not_converted_again(src, home, monkeypatch):
    """Large files are recorded by their stat: a new stat with the recorded sha256 is the same
    file (the record takes the new stat); a new stat and new bytes convert again."""
    monkeypatch.setattr(convert_mod, "SMALL_FILE", 0)
    out = materialise(str(src), "float32")
    rec = json.loads((out / "conversion.json").read_text())
    assert set(rec["source_files"]["model.safetensors"]) == {"size", "mtime_ns", "ctime_ns"}
    with monkeypatch.context() as m:
        _no_conversion(m)
        os.utime(src / "model.safetensors")
        assert materialise(str(src), "float32") == out
    assert sources.stale(sources.resolve(str(src)), out) == []  # its new stat recorded
    _other_weights(src, src / "model.safetensors")
    assert sources.stale(sources.resolve(str(src)), out) == ["model.safetensors"]


def test_a_conversion_that_recorded_nothing_is_converted_again(src, home):
    """An entry from before the record (or a damaged record) is not trusted."""
    out = materialise(str(src), "float32")
    rec = json.loads((out / "conversion.json").read_text())
    del rec["source_files"]
    (out / "conversion.json").write_text(json.dumps(rec))
    assert sources.stale(sources.resolve(str(src)), out) == ["conversion.json"]
    assert materialise(str(src), "float32") == out
    assert "source_files" in json.loads((out / "conversion.json").read_text())


def test_a_converted_folder_s_weights_hash_follows_its_weights(tiny_arch, tmp_path):
    """A converted folder used in place answers from its files; the weights' sha256 a task pins
    must follow a model.safetensors copied over, not keep the record's old one."""
    from mlx_slm.weights.convert import sha256_file, weights_sha256

    out = Path(shutil.copytree(tiny_arch.seqcls_mlx("qwen2", 3), tmp_path / "m"))
    old = weights_sha256(out)
    other = _other_weights(out, tmp_path / "other.safetensors")
    shutil.copyfile(other, out / "model.safetensors")
    assert weights_sha256(out) == sha256_file(out / "model.safetensors") != old


@pytest.mark.slow
def test_a_gguf_edited_in_place_is_converted_again(home, tmp_path, smollm2_gguf):
    g = Path(shutil.copy(smollm2_gguf, tmp_path / "m.gguf"))
    out = materialise(str(g))
    first = json.loads((out / "conversion.json").read_text())["created"]
    from mlx_slm.engine.engine import Engine

    before = Engine.load(str(g)).weights_sha256
    with open(g, "r+b") as f:  # the sign of a float32 of the last tensor (output_norm), in place
        f.seek(-5, os.SEEK_END)
        b = f.read(1)
        f.seek(-5, os.SEEK_END)
        f.write(bytes([b[0] ^ 0x80]))
    assert Engine.load(str(g)).weights_sha256 != before
    assert materialise(str(g)) == out and json.loads((out / "conversion.json").read_text())["created"] >= first
