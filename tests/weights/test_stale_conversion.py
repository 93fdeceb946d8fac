"""No stale conversion (issue 40, item 2): a local model edited in place after its first use.

The cache entry of a local folder was keyed on the folder's own stat, which a file rewritten
or copied over inside it does not change: the model kept answering from the old conversion.
Now the conversion records every file it read (a small file's sha256; a large one's size,
modification and change times, its sha256 checked before a stat alone reconverts it), and
every load checks them (`sources.stale`): a changed config, weights file or tokenizer converts
again, an untouched one does not.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from mlx_slm.weights import convert as convert_mod
from mlx_slm.weights import sources
from mlx_slm.weights.sources import materialise

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
