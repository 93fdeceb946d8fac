import json

import pytest

from benchmarks.harness import flops_per_token, main


@pytest.mark.slow
def test_bench_runs_modes_and_writes_results(tiny_qwen_mlx, tmp_path):
    out = tmp_path / "res"
    rc = main(
        [
            "--model",
            str(tiny_qwen_mlx),
            "--n",
            "6",
            "--modes",
            "ours-default,ours-item,ours-arbitrary",
            "--results",
            str(out),
        ]
    )
    assert rc == 0
    res = json.loads(next(out.glob("*.json")).read_text())
    rows = {r["mode"]: r for r in res["rows"]}
    assert set(rows) == {"hf-item", "ours-default", "ours-item", "ours-arbitrary"}  # hf-item is the reference
    for r in rows.values():
        assert r["agree"] == r["total"] == 6 and r["max_abs_dprob"] < 1e-5
        assert {"seconds", "items_per_s", "processed_tokens", "padding_pct", "speedup_vs_hf_best"} <= set(r)
    # one padded batch of all six vs. sorted, budgeted batches after the shared prefix
    assert rows["ours-default"]["processed_tokens"] < rows["ours-arbitrary"]["processed_tokens"]
    assert rows["ours-arbitrary"]["padding_pct"] > rows["ours-default"]["padding_pct"]
    m = res["machine"]
    assert m["matmul_peak_gflops"] == max(m["matmul_peak_start_gflops"], m["matmul_peak_end_gflops"]) > 0
    for r in rows.values():  # "of peak" is taken against the higher of the two readings
        assert abs(r["peak_fraction"] - r["gflops"] / m["matmul_peak_gflops"]) < 1e-3
    assert next(out.glob("*.png")).stat().st_size > 1000


def test_flops_per_token_qwen05b():
    cfg = dict(
        hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2
    )
    # 24 layers x (q,o: 896x896 each; k,v: 896x128 each; gate, up, down: 896x4864 each), x2 FLOPs
    assert flops_per_token(cfg) == 2 * 24 * (2 * 896 * 896 + 2 * 896 * 128 + 3 * 896 * 4864)


@pytest.mark.slow
def test_bench_runs_without_pytorch(tiny_qwen_mlx, tmp_path, monkeypatch):
    """No torch: the reference row is skipped, our rows are timed, nothing crashes."""
    site = tmp_path / "site"
    site.mkdir()
    # The children (Transformers modes) start as if PyTorch were not installed.
    (site / "sitecustomize.py").write_text("import sys\nsys.modules['torch'] = None\n")
    monkeypatch.setenv("PYTHONPATH", f"{site}:{__import__('os').environ.get('PYTHONPATH', '')}")
    out = tmp_path / "res"
    rc = main(["--model", str(tiny_qwen_mlx), "--n", "4", "--modes", "ours-default", "--out", str(out)])
    assert rc == 0
    res = json.loads(next(out.glob("*.json")).read_text())
    assert [r["mode"] for r in res["rows"]] == ["ours-default"]
    assert res["rows"][0]["agree"] is None and res["rows"][0]["items_per_s"] > 0
    assert "| ours-default |" in next(out.glob("*.md")).read_text()
