"""Model folders checked before loading (`weights/modelfiles.py`; issue 33, item 3): a folder with only config.json, without
tokenizer files, with a truncated model.safetensors or a corrupt config.json, an index naming a
missing shard: exit 2 naming the folder and everything missing, before any conversion or load
(no traceback from the converter, the tokenizer or MLX's loader)."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from mlx_slm.ground.errors import ModelError
from mlx_slm.weights.modelfiles import check_model_dir, model_dir_problems, safetensors_problem
from tests.hostile import invoke, refused_cleanly, write_input


def _damaged(src, dst, how):
    shutil.copytree(src, dst)
    if how == "only config.json":
        for f in dst.iterdir():
            if f.name != "config.json":
                f.unlink()
    elif how == "no tokenizer":
        for f in dst.glob("tokenizer*"):
            f.unlink()
    elif how == "truncated weights":
        with open(dst / "model.safetensors", "r+b") as f:
            f.truncate(f.seek(0, 2) // 2)
    elif how == "weights cut in the header":
        with open(dst / "model.safetensors", "r+b") as f:
            f.truncate(20)
    elif how == "corrupt config.json":
        (dst / "config.json").write_text('{"model_type": ')
    elif how == "config.json a list":
        (dst / "config.json").write_text("[]")
    elif how == "missing shard":
        (dst / "model.safetensors.index.json").write_text(
            json.dumps({"weight_map": {"a": "model.safetensors", "b": "model-00002-of-00002.safetensors"}})
        )
    return dst


HOW = {
    "only config.json": ["no tokenizer files", "no *.safetensors"],
    "no tokenizer": ["no tokenizer files"],
    "truncated weights": ["model.safetensors is", "shorter than written"],
    "weights cut in the header": ["model.safetensors is 20 bytes", "header"],
    "corrupt config.json": ["config.json is not valid JSON"],
    "config.json a list": ["config.json is not a JSON object"],
    "missing shard": ["model-00002-of-00002.safetensors (named by model.safetensors.index.json) is missing"],
}


@pytest.mark.parametrize("kind", ["hf", "mlx"])
@pytest.mark.parametrize("how", list(HOW))
def test_a_broken_model_folder_is_named_before_anything_loads(how, kind, tiny_qwen_hf, tiny_qwen_mlx, tmp_path,
                                                              monkeypatch):  # fmt: skip
    monkeypatch.setenv("MLX_SLM_HOME", str(tmp_path / "cache"))  # a conversion would land here: none must
    src = tiny_qwen_hf if kind == "hf" else tiny_qwen_mlx
    bad = _damaged(src, tmp_path / "model", how)
    r = invoke(["classify", write_input(tmp_path / "in.jsonl"), "--model", bad, "--labels", "a,b", "-q"])
    refused_cleanly(r, f"the model folder {bad} is not whole", *HOW[how], "download the model again")
    assert not list((tmp_path / "cache").glob("converted/*")), "nothing converted"


def test_convert_checks_the_source_folder_first(tiny_qwen_hf, tmp_path):
    bad = _damaged(tiny_qwen_hf, tmp_path / "src", "truncated weights")
    r = invoke(["convert", bad, "--out", tmp_path / "out"])
    refused_cleanly(r, "is not whole", "shorter than written")
    assert not (tmp_path / "out").exists()


def test_a_whole_folder_has_no_problem_and_every_problem_is_listed(tiny_qwen_hf, tiny_qwen_mlx, tmp_path):
    assert model_dir_problems(tiny_qwen_hf) == [] and model_dir_problems(tiny_qwen_mlx) == []
    check_model_dir(tiny_qwen_mlx)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelError) as e:
        check_model_dir(tmp_path / "empty")
    assert all(w in str(e.value) for w in ("no config.json", "no tokenizer files", "no *.safetensors"))


def test_safetensors_sizes_against_their_headers(tmp_path):
    header = json.dumps({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode()
    whole = struct.pack("<Q", len(header)) + header + b"\0" * 8
    for name, data, problem in (
        ("ok", whole, None),
        ("short", whole[:-1], "shorter than written"),
        ("long", whole + b"x", "longer than written"),
        ("tiny", b"abc", "too short"),
        ("huge header", struct.pack("<Q", 1 << 40) + header, "header alone"),
        ("bad json", struct.pack("<Q", 3) + b"{{{", "not valid JSON"),
    ):
        f = tmp_path / f"{name}.safetensors"
        f.write_bytes(data)
        got = safetensors_problem(f)
        assert (got is None) if problem is None else (problem in got), (name, got)


# Every config value and GGUF header checked before use (issue 40, item 4 and the `architectures`
# message).


REAL_GGUF = Path.home() / ".cache" / "mlx-slm" / "gguf" / "SmolLM2-135M-Instruct.Q4_1.gguf"


def _inp(tmp_path: Path) -> Path:
    p = tmp_path / "in.jsonl"
    p.write_text('{"text": "hello there"}\n{"text": "my bill is wrong"}\n')
    return p


def _edited(src: Path, dst: Path, edit) -> Path:
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    edit(cfg)
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def _set(**kv):
    return lambda c: c.update(kv)


def _drop_labels(**kv):
    def edit(c):
        c.pop("id2label"), c.pop("label2id")
        c.update(kv)

    return edit


def _label0(value):
    return lambda c: c["id2label"].update({"0": value})


CONFIGS = {
    "id2label surrogate": (_label0("\ud800"), ["id2label[0]", "unpaired surrogate"]),
    "num_labels string": (_set(num_labels="3"), ["num_labels '3' is not a positive integer"]),
    "num_labels string alone": (_drop_labels(num_labels="3"), ["num_labels '3' is not a positive integer"]),
    "label2id not a mapping": (_set(label2id=5), ["label2id 5 is not a mapping"]),
    "hidden_size string": (_set(hidden_size="64"), ["hidden_size is '64', not a whole number"]),
    "num_hidden_layers float": (_set(num_hidden_layers=2.5), ["num_hidden_layers is 2.5"]),
    "rms_norm_eps string": (_set(rms_norm_eps="x"), ["rms_norm_eps is 'x', not a finite number"]),
    "tie_word_embeddings string": (_set(tie_word_embeddings="no"), ["tie_word_embeddings is 'no', not true or false"]),
    "rope factor string": (
        _set(rope_parameters={"rope_type": "linear", "factor": "two"}),
        ["config.json holds a value", "fix config.json"],
    ),
    "problem_type number": (_set(problem_type=5), ["problem_type 5"]),
    "model_type a list": (_set(model_type=["qwen2"]), ["model_type ['qwen2'] is not an architecture name"]),
    "vocab_size a bool": (_set(vocab_size=True), ["vocab_size is True, not a whole number"]),
    "sliding_window string": (_set(use_sliding_window=True, sliding_window="x"), ["sliding_window is 'x'"]),
    "architectures a string": (_set(architectures="Qwen2ForSequenceClassification"), ["is not a list of class names"]),
}


@pytest.mark.parametrize("case", list(CONFIGS))
def test_a_classifier_config_value_of_the_wrong_kind_is_refused_by_classify(tiny_arch, tmp_path, case):
    edit, words = CONFIGS[case]
    inp = _inp(tmp_path)
    for form, src in (("mlx", tiny_arch.seqcls_mlx("qwen2", 3)), ("hf", tiny_arch.seqcls_hf("qwen2", 3))):
        model = _edited(src, tmp_path / form, edit)
        r = invoke(["classify", inp, "--model", model, "-o", tmp_path / f"{form}.jsonl", "-q"])
        refused_cleanly(r, "config.json", *words)
        assert not (tmp_path / f"{form}.jsonl").exists()


def test_a_causal_lm_config_transformers_cannot_read_is_refused_not_a_traceback(tiny_qwen_mlx, tmp_path):
    """`"num_labels": "3"` in a causal LM's config: its labels are not read, but transformers'
    config class (under the tokenizer's load) fails on it."""
    model = _edited(tiny_qwen_mlx, tmp_path / "m", _set(num_labels="3"))
    r = invoke(["classify", _inp(tmp_path), "--model", model, "--labels", "a,b", "-q"])
    refused_cleanly(r, f"the tokenizer of {model} cannot be loaded", "fix config.json")


@pytest.mark.parametrize("case", ["id2label surrogate", "num_labels string", "hidden_size string", "model_type a list"])
def test_convert_refuses_them_too(tiny_arch, tmp_path, case):
    edit, words = CONFIGS[case]
    model = _edited(tiny_arch.seqcls_hf("qwen2", 3), tmp_path / "hf", edit)
    r = invoke(["convert", model, "--out", tmp_path / "out"])
    refused_cleanly(r, "config.json", *words)
    assert not (tmp_path / "out").exists()


def test_architectures_naming_a_causal_lm_and_a_sequence_classifier_say_so(tiny_arch, tmp_path):
    """It was said to name no *ForSequenceClassification, though it names one."""
    both = _set(architectures=["Qwen2ForCausalLM", "Qwen2ForSequenceClassification"])
    model = _edited(tiny_arch.seqcls_mlx("qwen2", 3), tmp_path / "m", both)
    r = invoke(["classify", _inp(tmp_path), "--model", model, "-q"])
    refused_cleanly(r, "names both 'Qwen2ForCausalLM' and 'Qwen2ForSequenceClassification'", "keep")
    assert "names no *ForSequenceClassification" not in r.output


def _with_score_bias(src: Path, dst: Path, mlx_format: bool) -> Path:
    import numpy as np
    from safetensors.numpy import load_file, save_file

    shutil.copytree(src, dst)
    w = load_file(str(dst / "model.safetensors"))
    w["score.bias"] = np.zeros((3,), dtype=np.float32)
    save_file(w, str(dst / "model.safetensors"), metadata={"format": "mlx" if mlx_format else "pt"})
    (dst / "conversion.json").unlink(missing_ok=True)
    if mlx_format:  # a converted folder (its record names its weights' hash: no longer these)
        (dst / "conversion.json").write_text(json.dumps({"source_kind": "hf"}))
    return dst


def test_a_checkpoint_with_score_bias_is_refused(tiny_arch, tmp_path):
    inp = _inp(tmp_path)
    for form, src in (("mlx", tiny_arch.seqcls_mlx("qwen2", 3)), ("hf", tiny_arch.seqcls_hf("qwen2", 3))):
        model = _with_score_bias(src, tmp_path / form, form == "mlx")
        r = invoke(["classify", inp, "--model", model, "-q"])
        refused_cleanly(r, "score.bias", "without a bias", "remove score.bias")
    r = invoke(["convert", tmp_path / "hf", "--out", tmp_path / "out"])
    refused_cleanly(r, "score.bias")
    assert not (tmp_path / "out").exists()


def test_serve_refuses_the_surrogate_at_load(tiny_arch, tmp_path):
    """It started, said /health healthy and answered every request 500."""
    model = _edited(tiny_arch.seqcls_mlx("qwen2", 3), tmp_path / "m", _label0("\ud800"))
    env = {"PYTHONPATH": str(Path(__file__).resolve().parents[2]), "MLX_SLM_HOME": str(tmp_path / "home")}

    r = subprocess.run([sys.executable, "-m", "mlx_slm.cli", "serve", "--model", str(model), "--port", "0"],
                       env={**os.environ, **env}, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r.returncode == 2, r.stderr[-2000:]
    assert "id2label[0] holds an unpaired surrogate" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.skipif(not REAL_GGUF.is_file(), reason="the smollm2-135m GGUF is not in the cache")
@pytest.mark.parametrize("cut", [0, 3, 8, 24, 100, 1_000, 100_000, 5_000_000, -1])
def test_a_truncated_gguf_is_refused_by_classify_and_convert(tmp_path, cut):
    size = REAL_GGUF.stat().st_size
    n = size + cut if cut < 0 else cut
    with open(REAL_GGUF, "rb") as f:
        data = f.read(n)
    g = tmp_path / "cut.gguf"
    g.write_bytes(data)
    r = invoke(["classify", _inp(tmp_path), "--model", g, "--labels", "a,b", "-o", tmp_path / "o.jsonl", "-q"])
    refused_cleanly(r, f"the GGUF file {g} is not whole", "download it again")
    assert not (tmp_path / "o.jsonl").exists()
    r = invoke(["convert", g, "--out", tmp_path / "out"])
    refused_cleanly(r, "is not whole")
    assert not (tmp_path / "out").exists()


def test_gguf_problem_names_where_a_file_ends():
    """The header walk (`modelfiles.gguf_problem`) says what is cut, reading no tensor data."""
    from mlx_slm.weights.modelfiles import gguf_problem

    if not REAL_GGUF.is_file():
        pytest.skip("the smollm2-135m GGUF is not in the cache")
    assert gguf_problem(REAL_GGUF) is None
