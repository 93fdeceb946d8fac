"""Model folders checked before loading (issue 33, item 3): a folder with only config.json, without
tokenizer files, with a truncated model.safetensors or a corrupt config.json, an index naming a
missing shard: exit 2 naming the folder and everything missing, before any conversion or load
(no traceback from the converter, the tokenizer or MLX's loader)."""

from __future__ import annotations

import json
import shutil
import struct

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
