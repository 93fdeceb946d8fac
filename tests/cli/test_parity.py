"""`mlx-slm parity` (`cli/parity.py`): its inputs, options and refusals."""

from click.testing import CliRunner

from mlx_slm.cli import main


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
