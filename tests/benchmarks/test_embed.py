"""The embeddings benchmark (benchmarks/embed.py): its token counts, and a run end to end on a
tiny model (slow: sentence-transformers in a child)."""

from __future__ import annotations

import json

import pytest

from benchmarks import embed


def test_floor_counts_the_shared_head_once_and_st_pads_sorted_batches():
    head = (1, 2, 3)
    ids = [[1, 2, 3, 9], [1, 2, 3, 9, 9], [7, 7]]
    assert embed.floor_tokens(ids, head) == 3 + 1 + 2 + 2
    assert embed.floor_tokens(ids, ()) == 11
    # sorted by characters, longest first: ("ccc": 6, "bb": 2 | "a": 4) in batches of 2
    assert embed.st_padded(["a", "bb", "ccc"], [4, 2, 6], batch=2) == 2 * 6 + 4


@pytest.mark.slow
def test_embed_benchmark_end_to_end(tiny_arch, tmp_path, monkeypatch):
    monkeypatch.setenv("MLX_SLM_HOME", str(tmp_path / "home"))  # our conversion of the folder goes there
    out, cache = tmp_path / "res", tmp_path / "cache"
    assert (
        embed.main(["--model", str(tiny_arch.mlx("qwen2")), "--n", "6", "--cache", str(cache), "--out", str(out)]) == 0
    )
    (built,) = cache.iterdir()
    assert (built / "modules.json").is_file() and (built / "2_Normalize").is_dir()
    res = json.loads((out / "embed.json").read_text())
    rows = {(r["prompt"], r["row"]): r for r in res["rows"]}
    assert list(rows) == [("query", "ours"), ("query", "st-b32"), ("none", "ours"), ("none", "st-b32")]
    for r in rows.values():
        assert r["min_cosine_vs_other"] >= 0.9999 and r["x_floor"] >= 0.99
    assert rows[("query", "ours")]["stats"]["prefix_saved_tokens"] > 0
    assert "| query | ours |" in (out / "embed.md").read_text() and (out / "embed.png").stat().st_size > 1000
