"""`mlx-slm parity` (`cli/parity.py`): its inputs, options and refusals."""

import pytest
from click.testing import CliRunner

from mlx_slm.cli import main
from tests.conftest import MISTRAL_V01
from tests.train_cli import run


def test_parity_on_an_empty_input_is_a_user_error(tiny_qwen_mlx, tmp_path):
    empty = tmp_path / "e.jsonl"
    empty.write_text("")
    r = CliRunner().invoke(
        main,
        [
            "parity",
            "--model",
            str(tiny_qwen_mlx),
            "--reference",
            str(tiny_qwen_mlx),
            "--input",
            str(empty),
            "--labels",
            "a,b,c",
        ],
    )
    assert r.exit_code == 2 and "no text" in r.output and "Traceback" not in r.output


# --------------------------------------------------------------------------- issue 22: the smaller mends


def test_parity_without_torch_exits_2_with_the_hint(tiny_qwen_mlx, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a))
    r = CliRunner().invoke(main, ["parity", "--model", str(tiny_qwen_mlx), "--reference", str(tiny_qwen_mlx)])
    assert r.exit_code == 2, r.output
    assert "pip install 'mlx-slm[reference]'" in r.output and "bug" not in r.output


def test_parity_input_says_which_rows_it_skipped(tmp_path, capsys):
    """Issue 26: `parity --input` skipped rows it could not read without a word."""
    from mlx_slm.cli.parity import _input_texts

    inp = tmp_path / "in.jsonl"
    inp.write_text('{"text": "one"}\n{broken\n{"text": ""}\n{"text": "two"}\n{"text": "three"}\n')
    assert _input_texts(str(inp), 2) == ["one", "two"]
    err = capsys.readouterr().err
    assert "2 row(s) that cannot be read were skipped (line 2, 3)" in err and "on 2 text(s)" in err
    inp.write_text('{"text": "one"}\n')
    assert _input_texts(str(inp), 5) == ["one"] and capsys.readouterr().err == ""


# --------------------------------------------------------------------------- a chat template that refuses a system turn
# Mistral-v0.1's template: tests.conftest.MISTRAL_V01.


@pytest.mark.slow
def test_parity_agrees_on_a_model_whose_template_refuses_a_system_turn(tmp_path, tiny_arch):
    """The reference path renders the same folded prompt (84 s on 2 cores: the reference runs twice)."""
    import shutil

    hf = tmp_path / "hf"
    shutil.copytree(tiny_arch.hf("qwen2"), hf)
    (hf / "chat_template.jinja").write_text(MISTRAL_V01)
    r = run(["parity", "--model", hf, "--reference", hf, "--n", "6"])
    assert r.exit_code == 0, r.output
    assert "labels agree        6/6" in r.output and "-> PASS" in r.output
