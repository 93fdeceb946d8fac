"""The benchmark workload reproduces SPEC.md's published statistics (Qwen2.5 tokenizer)."""

import pytest

from mlx_slm.text.workload import stratified_sample, tickets


def test_tickets_shape():
    t = tickets()
    assert len(t) == 600
    assert t[0][0].startswith("My card was charged twice") and t[0][1] == "billing"
    assert t[4][1] == "technical" and t[5][1] == "account"
    assert min(len(x.split()) for x, _ in t) == 12 and max(len(x.split()) for x, _ in t) == 400


def test_stratified_sample_keeps_range():
    lengths = list(range(100))
    s = stratified_sample(lengths, 10)
    assert len(s) == 10 and s[0] == 0 and s[-1] == 99


@pytest.mark.slow
@pytest.mark.real
def test_published_statistics_under_qwen_tokenizer():
    from transformers import AutoTokenizer

    from benchmarks.workload import check_statistics
    from mlx_slm.weights.sources import fetch_gguf

    g = fetch_gguf("qwen2.5-coder-0.5b")
    tok = AutoTokenizer.from_pretrained(str(g.parent), gguf_file=g.name)
    stats = check_statistics(tok)
    assert (stats["min"], stats["median"], stats["max"], stats["total"]) == (48, 94, 449, 73555)
    assert round(stats["global_max_ratio"], 2) == 3.66
    assert round(stats["sorted32_padding_pct"], 1) == 7.6
    assert round(stats["arbitrary32_padding_pct"], 1) == 65.6
