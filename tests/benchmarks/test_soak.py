"""The soak (benchmarks/soak.py) end to end on a tiny model: a real `mlx-slm serve` on 127.0.0.1
for 45 s under its mixed load. Its correctness checks must hold (no 5xx, no lost answer, the
work of gone requests dropped, SIGTERM exits 0); its timings (RSS, p50) are reported, not asserted."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("httpx")
pytest.importorskip("uvicorn")
pytest.importorskip("matplotlib")


@pytest.mark.slow
def test_the_soak_runs_and_its_checks_hold(tiny_qwen_mlx, tmp_path):
    from benchmarks import soak

    out = tmp_path / "res"
    args = ["--model", str(tiny_qwen_mlx), "--minutes", "3", "--minute-seconds", "15", "--clients", "2"]
    soak.main([*args, "--sample-seconds", "2", "--out", str(out)])
    res = json.loads((out / "soak.json").read_text())
    for name in ("no_5xx", "no_lost", "dropped", "shutdown"):
        assert res["checks"][name]["ok"], (name, res["checks"][name])
    assert res["rerank_skipped"] and "reranker" in res["rerank_skipped"]  # the tiny causal LM is none: said why
    kinds = res["by_kind"]
    assert kinds["questions"]["statuses"].get("200") and kinds["embeddings"]["statuses"].get("200")
    assert set(kinds["bad"]["statuses"]) <= {"400", "404", "413", "422"}
    assert len(res["minutes_table"]) == 3 and all(r["rss_mb"] for r in res["minutes_table"])
    assert "| check | ok |" in (out / "soak.md").read_text() and (out / "soak.png").stat().st_size > 1000
    assert res["machine"] and res["command"].startswith("python -m benchmarks.soak")
    # the server at its defaults, the state cache filled before the clients: every pool state through both decision routes
    assert "--state-cache" not in res["server_command"] and "--request-timeout" not in res["server_command"]
    assert res["primed"]["statuses"] == {"200": 400} and res["primed"]["state_cache"] == 64
