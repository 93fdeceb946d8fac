"""The `mlx-slm` group (`cli/__init__.py`): help exits 0, a user's error is one line and exit 2, a bug
shows its traceback and says it is one (exit 70)."""

import pytest
from click.testing import CliRunner

from mlx_slm.cli import main


def cli(model, *extra):
    return ["--model", str(model), "--labels", "a,b,c", "-q", *extra]


# ----------------------------------------------------------------- 6-9. the CLI fails clearly


@pytest.mark.parametrize("cmd", [[], ["classify"], ["eval"], ["convert"], ["parity"], ["doctor"], ["models"]])
def test_help_exits_0_without_an_error_line(cmd):
    r = CliRunner().invoke(main, [*cmd, "--help"])
    assert r.exit_code == 0, r.output
    assert "Usage:" in r.output and "error" not in r.output.lower().split("usage:")[0]
    assert "mlx-slm: error" not in r.output


def test_a_bug_shows_its_traceback_and_says_it_is_a_bug(tiny_qwen_mlx, monkeypatch):
    from mlx_slm.kinds.base import OnePrompt

    def boom(*a, **k):
        raise KeyError("internal")

    monkeypatch.setattr(OnePrompt, "items", boom)  # where every one-prompt kind tokenizes its texts
    r = CliRunner().invoke(main, ["classify", *cli(tiny_qwen_mlx)], input="hello\n")
    assert r.exit_code == 70
    assert "Traceback" in r.output and "KeyError" in r.output and "this is a bug" in r.output
