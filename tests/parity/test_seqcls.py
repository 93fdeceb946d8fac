"""Parity of the classifiers people have trained (`parity/seqcls.py`): `mlx-slm parity` on a sequence
classifier (texts and pairs, each head form) and on a reranker, against Transformers in a child; a
reference that differs fails with exit 1, and the label-scoring options are refused."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from mlx_slm.cli import main
from tests.seqcls_cases import FORMS, seqcls_rows, write_jsonl


def run(args, **kw):
    return CliRunner().invoke(main, args, catch_exceptions=False, **kw)


@pytest.fixture(scope="module")
def models(tiny_arch) -> dict:
    return {form: tiny_arch.seqcls_mlx(*case) for form, case in FORMS.items()}


# --------------------------------------------------------------------------- parity


@pytest.mark.slow
@pytest.mark.parametrize("form", ["label", "multi", "score"])
def test_parity_of_a_sequence_classifier_with_pairs(models, form, tmp_path):
    inp = write_jsonl(tmp_path / "in.jsonl", seqcls_rows(16))
    r = run(["parity", "--model", str(models[form]), "--input", inp, "--n", "16", "--json"])
    assert r.exit_code == 0, r.output
    rep = json.loads(r.stdout)
    a = rep["forward_exactness"]
    assert rep["forward_ok"] and rep["form"] == form and rep["n"] == 15 and rep["pairs"] == 6
    assert a["agree"] == a["total"] == a["encodings_equal"] == 15 and a["max_abs_dprob"] <= 1e-4
    text = run(["parity", "--model", str(models[form]), "--n", "8"])
    assert text.exit_code == 0 and "-> PASS" in text.stdout and "(2 pairs)" in text.stdout


@pytest.mark.slow
def test_parity_fails_with_exit_1_and_refuses_lm_options(models, monkeypatch):
    from mlx_slm.parity import seqcls as seqcls_parity

    monkeypatch.setitem(seqcls_parity.SEQCLS_TOLERANCE, "float32", 0.0)  # no difference allowed: it must fail
    r = CliRunner().invoke(main, ["parity", "--model", str(models["label"]), "--n", "6"])
    assert r.exit_code == 1 and "-> FAIL" in r.stdout
    bad = CliRunner().invoke(main, ["parity", "--model", str(models["label"]), "--labels", "a,b"])
    assert bad.exit_code == 2 and "has no LM head" in bad.output


@pytest.mark.slow
@pytest.mark.parametrize("reranker", ["seqcls", "qwen3", "question"])
def test_parity_of_a_reranker(models, reranker, tmp_path):
    model = models["score"] if reranker == "seqcls" else _yes_no_lm(tmp_path)
    extra = ["--template", "Query: {query}\nDocument: {text}\nRelevant?"] if reranker == "question" else []
    r = run(["parity", "--model", str(model), "--reranker", reranker, "--n", "12", "--json", *extra])
    assert r.exit_code == 0, r.output
    rep = json.loads(r.stdout)
    assert rep["forward_ok"] and rep["scoring"] == f"rerank ({reranker})" and rep["queries"] == 4
    assert rep["forward_exactness"]["max_abs_dscore"] <= 1e-4 and rep["tokens"]["processed"] > 0


def _yes_no_lm(tmp_path):
    from mlx_slm.weights.convert import convert
    from tests.conftest import make_tiny

    hf = make_tiny(tmp_path / "hf", "qwen2", words=("yes", "no"))
    return convert(hf, tmp_path / "lm", dtype="float32", progress=None)
