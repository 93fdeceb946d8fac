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


def ray_overheads(workers: int = 2, reps: int = 3) -> dict[str, Any]:
    """What Ray itself adds, with an identity UDF in an actor pool (no model), medians of `reps`:
    `ray.init`; a one-block dataset (plan, actor start, one dispatch); per further block
    (600 rows in 1 vs 60 blocks); per row (60 blocks of 600 vs 60,000 rows of ~200 chars)."""
    import statistics

    import pyarrow as pa
    import ray

    import mlx_slm.ray as mray

    t0 = time.perf_counter()
    mray.init(num_cpus=os.cpu_count())
    out: dict[str, Any] = {"ray_init_s": round(time.perf_counter() - t0, 2)}

    class Identity:
        def __call__(self, batch: Any) -> Any:
            return batch

    def timed(n_rows: int, blocks: int) -> float:
        rows = [{"row": i, "text": "x" * 200} for i in range(n_rows)]
        ds = ray.data.from_items(rows, override_num_blocks=blocks)
        t = time.perf_counter()
        got = 0
        mapped = ds.map_batches(
            Identity,
            batch_format="pyarrow",
            batch_size=math.ceil(n_rows / blocks),
            compute=ray.data.ActorPoolStrategy(size=min(workers, blocks)),
            num_cpus=1,
        )
        for b in mapped.iter_batches(batch_format="pyarrow", batch_size=None):
            got += b.num_rows
        assert got == n_rows
        return time.perf_counter() - t

    timed(600, 1)  # warm: worker processes started, modules imported
    med = {k: statistics.median(timed(*k) for _ in range(reps)) for k in ((600, 1), (600, 60), (60000, 60))}
    out["one_block_s"] = round(med[(600, 1)], 3)
    out["per_block_ms"] = round(1000 * (med[(600, 60)] - med[(600, 1)]) / 59, 2)
    out["per_row_us"] = round(1e6 * (med[(60000, 60)] - med[(600, 60)]) / 59400, 2)
    # Per row on the driver: turning result rows back into predictions (what --ray adds per row).
    tbl = pa.table({"row": list(range(60000)), "label": ["a"] * 60000, "error": [None] * 60000})
    t0 = time.perf_counter()
    for _ in tbl.to_pylist():
        pass
    out["driver_per_row_us"] = round(1e6 * (time.perf_counter() - t0) / 60000, 2)
    ray.shutdown()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--n", type=int, default=600, help="workload tickets (all 600 by default)")
    ap.add_argument("--configs", default="local,ray-1,ray-2")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    ap.add_argument(
        "--reuse", help="take the classify runs from this earlier results JSON; measure only Ray's own costs again"
    )
    a = ap.parse_args(argv)
    from mlx_slm.text.workload import tickets

    texts = [t for t, _ in tickets()][: a.n]
    res: dict[str, Any] = {
        "model": a.model,
        "n": len(texts),
        "date": time.strftime("%Y-%m-%d"),
        "cpu_count": os.cpu_count(),
        "runs": {},
    }
    extra = {"local": [], "ray-1": ["--ray", "--workers", "1"], "ray-2": ["--ray", "--workers", "2"]}
    if a.reuse:
        old = json.loads(Path(a.reuse).read_text())
        res.update({k: old[k] for k in ("model", "n", "date", "cpu_count", "runs")})
        res["runs_reused_from"] = a.reuse
        a.configs = ""
    with tempfile.TemporaryDirectory() as d:
        inp = Path(d) / "in.jsonl"
        inp.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in enumerate(texts)))
        for name in filter(None, a.configs.split(",")):
            r = _classify(inp, Path(d) / f"{name}.jsonl", a.model, extra[name])
            res["runs"][name] = r
            print(f"  {name}: wall {r['wall_s']} s, run {r['run_s']} s, {r['items_per_s']} items/s", file=sys.stderr)
    ref = res["runs"].get("local")
    ref_labels = ref.get("labels") if ref else None
    for r in res["runs"].values():
        if "labels" in r:
            r["labels_equal_local"] = ref_labels is not None and r.pop("labels") == ref_labels
        if ref and ref["items_per_s"] and r["items_per_s"]:
            r["items_per_s_vs_local"] = round(r["items_per_s"] / ref["items_per_s"], 3)
            r["wall_vs_local"] = round(ref["wall_s"] / r["wall_s"], 3)
    res["overheads"] = ray_overheads()
    res["projection"] = projection(res)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "ray-scaling.json").write_text(json.dumps(res, indent=2) + "\n")
    md = table(res)
    (out / "ray-scaling.md").write_text(md)
    plot(res, out / "ray-scaling.png")
    print(md)
    return 0


def projection(res: dict[str, Any]) -> dict[str, Any]:
    """Items/s on N machines like this one, from the measured figures.

    A machine gives the best Ray layout's rate measured here (which includes Ray's per-block
    and per-row costs); Ray's start-up is paid once; the driver reads every row back (its
    per-row cost bounds the total, far above these rates)."""
    rays = [r for k, r in res["runs"].items() if k.startswith("ray") and r.get("items_per_s")]
    ov = res["overheads"]
    if not rays:
        return {}
    per_item_s = 1 / max(r["items_per_s"] for r in rays)  # the best Ray layout on one machine
    driver_cap = 1e6 / ov["driver_per_row_us"] if ov["driver_per_row_us"] else float("inf")
    out: dict[str, Any] = {}
    for n_machines in (1, 2, 4, 8, 16, 64):
        rate = min(n_machines / per_item_s, driver_cap)
        out[str(n_machines)] = {
            "items_per_s": round(rate, 2),
            "hours_for_10M": round((1e7 / rate + ov["ray_init_s"] + ov["one_block_s"]) / 3600, 1),
        }
    return out


def plot(res: dict[str, Any], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot", file=sys.stderr)
        return
    names = list(res["runs"])
    vals = [res["runs"][k]["items_per_s"] or 0 for k in names]
    fig, ax = plt.subplots(figsize=(5, 3))
    ax.bar(names, vals, color=["#777" if k == "local" else "#3a7" for k in names])
    for i, v in enumerate(vals):
        ax.text(i, v, f"{v:.2f}", ha="center", va="bottom")
    ax.set_ylabel("items/s")
    ax.set_title(f"{res['model']}, {res['n']} tickets, {res['cpu_count']} cores")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


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
        f"Ray's own costs (identity UDF in a 2-actor pool, medians of 3 after a warm-up): `ray.init` "
        f"{ov['ray_init_s']} s; a one-block dataset {ov['one_block_s']} s; {ov['per_block_ms']} ms per further "
        f"block; {ov['per_row_us']} us per row through Ray (a difference of two timings: at this size, within "
        f"their noise of ~10 us); {ov['driver_per_row_us']} us per row on the driver to read results back.",
    ]
    loc, r1 = res["runs"].get("local"), res["runs"].get("ray-1")
    if loc and r1 and loc.get("run_s") and r1.get("run_s"):
        gap = r1["run_s"] - loc["run_s"]
        dispatch = 4 * ov["per_block_ms"] / 1000 + res["n"] * ov["per_row_us"] / 1e6
        lines += [
            "",
            f"ray-1 takes {gap:.0f} s longer than the local run; Ray's dispatch of its 4 blocks and {res['n']} rows "
            f"accounts for {dispatch:.2f} s of it. The rest is the worker's start and model load (counted in its run "
            "time) and Ray's own processes (raylet, GCS, the driver reading results) sharing the 2 cores with a "
            "worker of 2 threads: two workers of one thread each (ray-2) come within "
            f"{100 * (1 - res['runs'].get('ray-2', {}).get('items_per_s_vs_local', 1)):.0f} % of the local run.",
        ]
    if res.get("projection"):
        lines += [
            "",
            "Projection: N machines like this one, each giving the best Ray rate measured here, Ray's start-up once:",
            "",
            "| machines | items/s | hours for 10 M tickets |",
            "|---|---|---|",
        ]
        for n, p in res["projection"].items():
            lines.append(f"| {n} | {p['items_per_s']} | {p['hours_for_10M']} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
