"""Load test of `mlx-slm serve` on 127.0.0.1: items/s and latency percentiles under bounded load.

    python -m benchmarks.serve_load                                # default model, 96 requests per level
    python -m benchmarks.serve_load --model DIR --n 32 --out /tmp  # a quick check on another model

For each server configuration (dynamic batching as served by default, then batching off:
`--max-batch-items 1`) it starts `mlx-slm serve` on a free loopback port, waits for
/health, sends one warm-up request, and then, at each concurrency (1, 8, 32 by default),
sends the same `--n` single-text requests drawn from the 600-ticket workload (a fixed,
seeded sample) with that many clients in flight, stopping new requests at `--time-cap`
seconds. It reports completed requests, errors, items/s (completed / wall time) and
p50/p95/p99 latency, beside offline `mlx-slm classify` on the same texts (its own items/s
summary) and the p50 of classifying one text at a time with the loaded Python API.
Results go to `--out` as JSON and Markdown. Only 127.0.0.1 is ever contacted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

HOST = "127.0.0.1"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def sample_texts(n: int, seed: int = 0) -> list[str]:
    from mlx_slm.text.workload import tickets

    all_ = [t for t, _ in tickets()]
    order = np.random.default_rng(seed).permutation(len(all_))
    return [all_[i] for i in order[:n]]


def _pct(xs: list[float], q: float) -> float | None:
    return round(float(np.percentile(xs, q)) * 1000, 1) if xs else None


class Server:
    def __init__(self, model: str, extra: list[str], startup_timeout: float):
        self.port = _free_port()
        self.url = f"http://{HOST}:{self.port}"
        env = {**os.environ}
        env.pop("MLX_SLM_API_KEY", None)
        cmd = [
            sys.executable,
            "-m",
            "mlx_slm.cli",
            "serve",
            "--model",
            model,
            "--host",
            HOST,
            "--port",
            str(self.port),
            "-q",
            "--max-queue-items",
            "4096",
            "--request-timeout",
            "3600",
            *extra,
        ]
        t0 = time.perf_counter()
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
        import httpx

        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {self.proc.stderr.read().decode()[-2000:]}")  # type: ignore[union-attr]
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.perf_counter() - t0 > startup_timeout:
                self.stop()
                raise RuntimeError("server did not become healthy in time")
            time.sleep(0.2)
        self.startup_s = time.perf_counter() - t0

    def stop(self) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.proc.wait()


async def _drive(url: str, texts: list[str], concurrency: int, time_cap: float) -> dict[str, Any]:
    import httpx

    lat: list[float] = []
    errors: dict[str, int] = {}
    queue_ms: list[float] = []
    next_i = 0
    t_start = time.perf_counter()
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=3600) as client:

        async def worker() -> None:
            nonlocal next_i
            while next_i < len(texts) and time.perf_counter() - t_start < time_cap:
                i = next_i
                next_i += 1
                t0 = time.perf_counter()
                try:
                    r = await client.post("/v1/classify", json={"text": texts[i]})
                except httpx.HTTPError as e:
                    errors[type(e).__name__] = errors.get(type(e).__name__, 0) + 1
                    continue
                if r.status_code == 200:
                    lat.append(time.perf_counter() - t0)
                    queue_ms.append(r.json()["queue_ms"])
                else:
                    errors[str(r.status_code)] = errors.get(str(r.status_code), 0) + 1

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - t_start
    return {
        "concurrency": concurrency,
        "sent": next_i,
        "completed": len(lat),
        "errors": errors,
        "wall_s": round(wall, 3),
        "items_per_s": round(len(lat) / wall, 3) if wall else 0.0,
        "p50_ms": _pct(lat, 50),
        "p95_ms": _pct(lat, 95),
        "p99_ms": _pct(lat, 99),
        "mean_queue_ms": round(float(np.mean(queue_ms)), 1) if queue_ms else None,
        "capped": next_i < len(texts),
    }


def _batch_stats(url: str) -> dict[str, float]:
    import httpx

    text = httpx.get(url + "/metrics").text
    out = {}
    for name in ("mlx_slm_batch_items_sum", "mlx_slm_batch_items_count", "mlx_slm_batch_tokens_sum"):
        m = re.search(rf"^{name} (\S+)$", text, re.M)
        out[name] = float(m.group(1)) if m else 0.0
    return out


def run_server_levels(
    model: str, extra: list[str], texts: list[str], levels: list[int], time_cap: float, startup_timeout: float
) -> dict[str, Any]:
    srv = Server(model, extra, startup_timeout)
    rows = []
    try:
        asyncio.run(_drive(srv.url, texts[:1], 1, time_cap))  # warm-up: first request's one-off costs
        for c in levels:
            before = _batch_stats(srv.url)
            row = asyncio.run(_drive(srv.url, texts, c, time_cap))
            after = _batch_stats(srv.url)
            n_b = after["mlx_slm_batch_items_count"] - before["mlx_slm_batch_items_count"]
            row["mean_batch_items"] = (
                round((after["mlx_slm_batch_items_sum"] - before["mlx_slm_batch_items_sum"]) / n_b, 2) if n_b else None
            )
            rows.append(row)
            print(
                f"  {' '.join(extra) or 'batching on'}: c={c} {row['completed']}/{len(texts)} done, "
                f"{row['items_per_s']} items/s, p50 {row['p50_ms']} ms, p95 {row['p95_ms']} ms, "
                f"p99 {row['p99_ms']} ms, mean batch {row['mean_batch_items']}",
                file=sys.stderr,
                flush=True,
            )
    finally:
        code = srv.stop()
    return {"args": extra, "startup_s": round(srv.startup_s, 1), "exit_status": code, "levels": rows}


def offline_classify(model: str, texts: list[str]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as d:
        inp = Path(d) / "in.jsonl"
        inp.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in enumerate(texts)))
        t0 = time.perf_counter()
        p = subprocess.run(
            [
                sys.executable,
                "-m",
                "mlx_slm.cli",
                "classify",
                str(inp),
                "-o",
                str(Path(d) / "out.jsonl"),
                "--model",
                model,
            ],
            capture_output=True,
            text=True,
        )
        wall = time.perf_counter() - t0
    m = re.search(r"([\d.]+) items/s", p.stderr)
    return {
        "items": len(texts),
        "items_per_s": float(m.group(1)) if m else None,
        "wall_s_with_load": round(wall, 1),
        "exit_status": p.returncode,
    }


def api_single_latency(model: str, texts: list[str]) -> dict[str, Any]:
    from mlx_slm import Classifier

    clf = Classifier.load(model)
    clf.classify([texts[0]])  # warm: the prefix KV
    lat = []
    for t in texts:
        t0 = time.perf_counter()
        clf.classify([t])
        lat.append(time.perf_counter() - t0)
    return {"items": len(texts), "p50_ms": _pct(lat, 50), "p95_ms": _pct(lat, 95)}


def table(res: dict[str, Any]) -> str:
    lines = [
        f"# serve load: {res['model']}, {res['n']} single-text requests per level ({res['date']})",
        "",
        "| server | concurrency | completed | items/s | p50 ms | p95 ms | p99 ms | mean batch | errors |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for cfg in res["servers"]:
        name = " ".join(cfg["args"]) or "dynamic batching"
        for r in cfg["levels"]:
            lines.append(
                f"| {name} | {r['concurrency']} | {r['completed']}/{r['sent']}{' (capped)' if r['capped'] else ''} | "
                f"{r['items_per_s']} | {r['p50_ms']} | {r['p95_ms']} | {r['p99_ms']} | {r['mean_batch_items']} | "
                f"{r['errors'] or ''} |"
            )
    off = res.get("offline")
    if off:
        lines += [
            "",
            f"Offline `mlx-slm classify` on the same {off['items']} texts: {off['items_per_s']} items/s "
            f"(its own summary, model load excluded).",
        ]
    api = res.get("api_single")
    if api:
        lines += [f"Loaded Python API, one text per call: p50 {api['p50_ms']} ms, p95 {api['p95_ms']} ms."]
    best = res.get("ratio_c32_vs_offline")
    if best is not None:
        lines += [f"Served items/s at the highest concurrency / offline: {best:.2f}."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--n", type=int, default=96, help="requests per concurrency level (single texts)")
    ap.add_argument("--concurrency", default="1,8,32", help="comma-separated levels")
    ap.add_argument("--time-cap", type=float, default=240.0, help="seconds per level; no new requests after it")
    ap.add_argument("--startup-timeout", type=float, default=600.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--no-baselines", action="store_true", help="skip --max-batch-items 1, offline classify and the API"
    )
    ap.add_argument("--server-args", default="", help="extra `mlx-slm serve` options for the batching run")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    a = ap.parse_args(argv)
    levels = [int(x) for x in a.concurrency.split(",") if x.strip()]
    texts = sample_texts(a.n, a.seed)
    res: dict[str, Any] = {
        "model": a.model,
        "n": a.n,
        "levels": levels,
        "time_cap_s": a.time_cap,
        "seed": a.seed,
        "date": time.strftime("%Y-%m-%d"),
        "host": HOST,
        "cpu_count": os.cpu_count(),
        "servers": [],
    }
    res["servers"].append(
        run_server_levels(a.model, a.server_args.split(), texts, levels, a.time_cap, a.startup_timeout)
    )
    if not a.no_baselines:
        res["servers"].append(
            run_server_levels(a.model, ["--max-batch-items", "1"], texts, levels, a.time_cap, a.startup_timeout)
        )
        res["offline"] = offline_classify(a.model, texts)
        res["api_single"] = api_single_latency(a.model, texts[: min(len(texts), 32)])
        top = res["servers"][0]["levels"][-1]["items_per_s"]
        if res["offline"]["items_per_s"]:
            res["ratio_c32_vs_offline"] = round(top / res["offline"]["items_per_s"], 3)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"serve-load-{Path(a.model).name}-n{a.n}"
    (out / f"{stem}.json").write_text(json.dumps(res, indent=2) + "\n")
    (out / f"{stem}.md").write_text(table(res))
    print(table(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
