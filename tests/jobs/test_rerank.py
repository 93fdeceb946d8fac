"""`mlx-slm rerank`'s work (`jobs/rerank.py`): queries and their documents in, each query's documents
best first out; a model that cannot rerank says what it is and what works."""

from __future__ import annotations

import pytest

from tests.train_cli import run, write_rows


@pytest.mark.parametrize("scorer", [[], ["--reranker", "qwen3"], ["--reranker", "question"]])
def test_rerank_on_an_embedding_model_says_it_is_one_and_what_works(tmp_path, tiny_arch, scorer):
    """`--reranker qwen3`, which the first refusal suggested, said "features_only: not a setting of rerank"."""
    q = write_rows(tmp_path / "q.jsonl", [{"query": "card charged", "documents": ["refund please", "reset password"]}])
    r = run(["rerank", q, "--model", tiny_arch.st_mlx("qwen2"), *scorer])
    assert r.exit_code == 2, r.output
    assert "is an embedding model" in r.output and "cosine of their embeddings" in r.output
    assert "features_only" not in r.output
