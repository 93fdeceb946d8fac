"""Ray scale-out on one machine: the local CLI against `classify --ray` with 1 and 2 workers.

    python -m benchmarks.ray_scaling                 # the 600-ticket workload, default model
    python -m benchmarks.ray_scaling --n 60 --model smollm2-135m --out /tmp   # a quick check

Each configuration runs `mlx-slm classify` in its own process on the same JSONL input:
`local` (one process, all cores), `ray-1` (`--ray --workers 1`: one actor with all cores),
`ray-2` (`--ray --workers 2`: the cores split, one BLAS thread each). Reported: wall time
(process start to exit: imports, model load, Ray start included), the run's own items/s
(its summary line; for Ray from the first request to the last row, actor start and model
load on the worker included), labels equal to the local run. Ray's own costs are measured
apart on the same rows and blocks with an identity UDF in an actor pool: `ray.init`, actor
start, and per block / per row dispatch. The projection to N machines uses these figures.
Results: `--out`/ray-scaling.{json,md} (and a PNG when matplotlib is there).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def _classify(inp: Path, out: Path, model: str, extra: list[str]) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "mlx_slm.cli", "classify", str(inp), "-o", str(out), "--model", model, *extra]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if p.returncode not in (0, 1):
        raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    m = re.search(r"in ([\d.]+) s, ([\d.]+) items/s", p.stderr)
    labels = [json.loads(x).get("label") for x in out.read_text().splitlines()]
    return {
        "args": extra,
        "wall_s": round(wall, 1),
        "run_s": float(m.group(1)) if m else None,
        "items_per_s": float(m.group(2)) if m else None,
        "labels": labels,
    }


def ray_overheads(n_rows: int, blocks: int, workers: int) -> dict[str, Any]:
    """Ray's fixed and per-unit costs with an identity UDF (no model): what Ray adds."""
    import ray

    import mlx_slm.ray as mray

    t0 = time.perf_counter()
    mray.init(num_cpus=os.cpu_count())
    init_s = time.perf_counter() - t0

    class Identity:
        def __call__(self, batch: Any) -> Any:
            return batch

    rows = [{"row": i, "text": "x" * 200} for i in range(n_rows)]
    out: dict[str, Any] = {"ray_init_s": round(init_s, 2)}
    for nb in (1, blocks):
        ds = ray.data.from_items(rows, override_num_blocks=nb)
        t0 = time.perf_counter()
        got = 0
        for b in ds.map_batches(
            Identity, batch_format="pyarrow", batch_size=math.ceil(n_rows / nb), concurrency=workers, num_cpus=1
        ).iter_batches(batch_format="pyarrow", batch_size=None):
            got += b.num_rows
        out[f"identity_{nb}_blocks_s"] = round(time.perf_counter() - t0, 3)
    # Fixed cost (actor start, plan) ~ the 1-block run; the rest, spread over the extra blocks.
    out["per_block_ms"] = round(
        1000 * (out[f"identity_{blocks}_blocks_s"] - out["identity_1_blocks_s"]) / max(1, blocks - 1), 2
    )
    out["fixed_s"] = out["identity_1_blocks_s"]
    # Per row on the driver: turning result rows back into predictions (what --ray adds per row).
    import pyarrow as pa

    tbl = pa.table({"row": list(range(n_rows)), "label": ["a"] * n_rows, "error": [None] * n_rows})
    t0 = time.perf_counter()
    for _ in tbl.to_pylist():
        pass
    out["driver_per_row_us"] = round(1e6 * (time.perf_counter() - t0) / n_rows, 2)
    ray.shutdown()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--n", type=int, default=600, help="workload tickets (all 600 by default)")
    ap.add_argument("--configs", default="local,ray-1,ray-2")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    a = ap.parse_args(argv)
    from mlx_slm.workload import tickets

    texts = [t for t, _ in tickets()][: a.n]
    res: dict[str, Any] = {
        "model": a.model,
        "n": len(texts),
        "date": time.strftime("%Y-%m-%d"),
        "cpu_count": os.cpu_count(),
        "runs": {},
    }
    extra = {"local": [], "ray-1": ["--ray", "--workers", "1"], "ray-2": ["--ray", "--workers", "2"]}
    with tempfile.TemporaryDirectory() as d:
        inp = Path(d) / "in.jsonl"
        inp.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in enumerate(texts)))
        for name in a.configs.split(","):
            r = _classify(inp, Path(d) / f"{name}.jsonl", a.model, extra[name])
            res["runs"][name] = r
            print(f"  {name}: wall {r['wall_s']} s, run {r['run_s']} s, {r['items_per_s']} items/s", file=sys.stderr)
    ref = res["runs"].get("local")
    ref_labels = ref["labels"] if ref else None
    for r in res["runs"].values():
        r["labels_equal_local"] = ref_labels is not None and r.pop("labels") == ref_labels
        if ref and ref["items_per_s"] and r["items_per_s"]:
            r["items_per_s_vs_local"] = round(r["items_per_s"] / ref["items_per_s"], 3)
            r["wall_vs_local"] = round(ref["wall_s"] / r["wall_s"], 3)
    blocks = math.ceil(len(texts) / max(1, math.ceil(len(texts) / 4)))
    res["overheads"] = ray_overheads(len(texts), max(2, blocks * 2), 2)
    res["projection"] = projection(res)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "ray-scaling.json").write_text(json.dumps(res, indent=2) + "\n")
    md = table(res)
    (out / "ray-scaling.md").write_text(md)
    print(md)
    return 0


def projection(res: dict[str, Any]) -> dict[str, Any]:
    """Items/s on N machines like this one, one worker each, from the measured figures.

    A worker's rate is ray-1's steady rate; Ray adds its fixed start-up once and a per-block
    cost; the driver handles every row (its per-row cost bounds the total)."""
    r1 = res["runs"].get("ray-1")
    ov = res["overheads"]
    if not r1 or not r1.get("items_per_s"):
        return {}
    per_item_s = 1 / r1["items_per_s"]
    driver_cap = 1e6 / ov["driver_per_row_us"] if ov["driver_per_row_us"] else float("inf")
    out = {}
    for n_machines in (1, 2, 4, 8, 16, 64):
        rate = min(n_machines / per_item_s, driver_cap)
        out[str(n_machines)] = {
            "items_per_s": round(rate, 2),
            "hours_for_10M": round(1e7 / rate / 3600 + ov["fixed_s"] / 3600, 1),
        }
    return out


def table(res: dict[str, Any]) -> str:
    lines = [
        f"# Ray scale-out on one {res['cpu_count']}-core machine: {res['model']}, {res['n']} workload tickets "
        f"({res['date']})",
        "",
        "| run | wall s | run s | items/s | items/s vs local | labels = local |",
        "|---|---|---|---|---|---|",
    ]
    for name, r in res["runs"].items():
        lines.append(
            f"| {name} | {r['wall_s']} | {r['run_s']} | {r['items_per_s']} | {r.get('items_per_s_vs_local')} | "
            f"{r['labels_equal_local']} |"
        )
    ov = res["overheads"]
    lines += [
        "",
        f"Ray's own costs (identity UDF, same rows): `ray.init` {ov['ray_init_s']} s; one block through an "
        f"actor pool {ov['fixed_s']} s (actor start included); {ov['per_block_ms']} ms per further block; "
        f"{ov['driver_per_row_us']} us per row on the driver to read results back.",
    ]
    if res.get("projection"):
        lines += ["", "| machines (one worker each) | items/s | hours for 10 M tickets |", "|---|---|---|"]
        for n, p in res["projection"].items():
            lines.append(f"| {n} | {p['items_per_s']} | {p['hours_for_10M']} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
