"""`mlx-slm parity` for embeddings: a sentence-transformers folder (found by its modules.json)
against sentence-transformers' `encode` in a child process, each text alone; a causal LM with
--embeddings against Transformers' last hidden state; and the comparison's own arithmetic."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from mlx_slm.cli import main
from mlx_slm.parity.embeddings import compare


def test_compare_is_relative_to_each_vector():
    ref = np.array([[1.0, 0.0, -2.0], [0.001, 0.002, 0.0]], dtype=np.float32)
    got = compare(ref + np.array([[0, 2e-4, 0], [0, 0, 2e-7]], dtype=np.float32), ref)
    assert got["max_rel_diff"] == pytest.approx(1e-4, rel=1e-3) and got["min_cosine"] > 0.99999
    assert compare(-ref, ref)["min_cosine"] == pytest.approx(-1)


@pytest.mark.slow
def test_parity_of_a_sentence_transformers_folder(tiny_arch, tmp_path, monkeypatch):
    monkeypatch.setenv("MLX_SLM_HOME", str(tmp_path / "home"))  # the float16 conversion goes there
    src = tiny_arch.st(layout="5", pooling="mean", include_prompt=False)
    r = CliRunner().invoke(main, ["parity", "--model", str(src), "--n", "8", "--prompt-name", "query", "--json"])
    assert r.exit_code == 0, r.output
    got = json.loads(r.stdout)
    assert got["forward_ok"] and got["forward"]["ids_equal"] == 8 and got["forward"]["min_cosine"] >= 0.9999
    assert got["embedding"]["pooling"] == "mean" and not got["embedding"]["include_prompt"]
    assert got["forward"]["prefix_saved_tokens"] > 0


@pytest.mark.slow
def test_parity_of_a_causal_lms_embeddings(tiny_arch):
    r = CliRunner().invoke(main, ["parity", "--model", str(tiny_arch.mlx("qwen2")), "--embeddings", "--n", "6"])
    assert r.exit_code == 0, r.output
    assert "Transformers' AutoModel" in r.stdout and "OK" in r.stdout
