"""`mlx-slm parity --chat` (`parity/chat.py`): the chat-completion route's answers (prompt ids, the next
token's top 20, the guided choice) each against its reference, and what it does not check refused."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("starlette")


pytest.importorskip("uvicorn")


# ----------------------------------------------------------------------------- mlx-slm parity --chat


@pytest.mark.slow
def test_parity_chat_passes_on_a_tiny_model(tiny_arch):
    """`mlx-slm parity --chat`: prompt ids, the next token's top 20 and the guided choice, each
    against its reference (Transformers in a child process), on the workload."""
    from click.testing import CliRunner

    from mlx_slm.cli import main

    r = CliRunner().invoke(main, ["parity", "--chat", "--model", str(tiny_arch.mlx("llama")), "--n", "6", "--json"])
    assert r.exit_code == 0, r.output
    got = json.loads(r.output[r.output.index("{") :])
    assert got["ok"] and got["prompt_ids_equal"] == 6 and got["next_token"]["greedy_agree"] == 6
    assert got["next_token"]["max_abs_dlogprob"] < 1e-4 and got["choice"]["agree_classify"] == 6


def test_parity_chat_refuses_what_it_does_not_check(tiny_qwen_mlx):
    from click.testing import CliRunner

    from mlx_slm.cli import main

    r = CliRunner().invoke(main, ["parity", "--chat", "--model", str(tiny_qwen_mlx), "--reranker", "qwen3"])
    assert r.exit_code == 2 and "--chat checks the chat route" in r.output
