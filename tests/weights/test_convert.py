"""Checkpoint conversion (`weights/convert.py`): a Hugging Face folder or a GGUF file to MLX safetensors,
refused before it starts where it cannot finish, leaving nothing behind when it fails."""

import json

import pytest
from click.testing import CliRunner

from mlx_slm.cli import main


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
