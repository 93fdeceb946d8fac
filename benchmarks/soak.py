"""A soak of `mlx-slm serve`: a real server on 127.0.0.1 under a bounded mixed load for N minutes.

    python -m benchmarks.soak                                  # SmolLM2-135M, 30 minutes, 3 clients
    python -m benchmarks.soak --minutes 4 --out /tmp/soak      # a shorter run
    python -m benchmarks.soak --model DIR --minutes 3 --minute-seconds 20   # a tiny model, 1 minute in all

The server serves a task of two questions (`--questions questions.jsonl`, written from
`QUESTIONS` here), so a plain /v1/classify body is answered with both answers; every other
option is the server's default (`--request-timeout` and `--state-cache` are passed only when given
here). Before the clients start, the decision routes' state cache is filled to its bound (`prime`;
`--no-prime` skips it), so that RSS after the warm-up measures leaks, not a bounded cache filling.
A fixed number of clients (`--clients`) send requests one after another, each drawn from a seeded mix:

    classify       /v1/classify with the request's own labels (1-3 texts)
    questions      /v1/classify on the served questions task
    chat_choice    /v1/chat/completions with guided_choice
    chat_logprobs  max_tokens 1, logprobs, top_logprobs 5
    embeddings     /v1/embeddings (1-3 texts)
    rerank         /v1/rerank, if the model is a reranker (otherwise skipped, and the run says why)
    systemone      /v1/systemone: a ticket as the state, a choice, a noul and a score question
    decisions      /v1/decisions (OpenAI's shape): a predicate and a choice question
    bad            a hostile body (bad JSON, wrong types, a schema's `required` holding a list, too
                   many choices): a 4xx is the expected answer
    disconnect     a classify request that the client abandons after 20-300 ms
    heavy          a chat request of 300 long choices: answered 200; or refused at admission, 504
                   while other work waits or runs (priced over half the request timeout) or 413
                   (priced over all of it)

Every `--sample-seconds` the sampler reads the server's RSS (`ps`), /health and the /metrics
gauges. The results are kept per minute: RSS, p50 and p99 latency of the answered model requests,
throughput and status counts. At the end, once the clients have stopped, the run checks that the
worker goes idle (queue 0, nothing running) within one request timeout, and then sends SIGTERM.

The checks:

* rss: RSS grows less than 10 % from the end of the warm-up to the end of the run;
* p50: the p50 of the second half of the post-warm-up minutes is less than 20 % above the first half's;
* no_5xx: no 5xx except a `heavy` request's 504, one of its expected answers;
* no_lost: every request gets an answer, or the 4xx its kind expects (a `disconnect` excepted);
* dropped: the work of timed-out and abandoned requests is dropped: /health never says
  "stalled", the worker is idle within one request timeout of the last request, and the items
  computed after their request had gone (`mlx_slm_items_total{outcome="late"}`: at most the
  batch running when it left) are at most 3 per gone request (a request holds up to 3 texts);
* shutdown: SIGTERM exits 0, with no "terminate called" in the log.

Results go to `--out` as NAME.json, NAME.md (the table) and NAME.png (the plot) (`--name`,
default soak), with the machine and the command. Only 127.0.0.1 is contacted. The latencies are the machine's: on a
shared CPU they are noisy, which is why the p50 check compares halves rather than single minutes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
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
LABELS = ["billing", "technical", "account"]
QUESTIONS = [
    {"name": "team", "question": "Which team should handle this ticket?", "labels": LABELS},
    {"name": "urgent", "question": "When must this ticket be answered?", "labels": ["today", "this week"]},
]
MIX = {  # kind: weight
    "classify": 20,
    "questions": 15,
    "chat_choice": 15,
    "chat_logprobs": 10,
    "embeddings": 15,
    "rerank": 5,
    "systemone": 8,
    "decisions": 7,
    "bad": 10,
    "disconnect": 5,
    "heavy": 1,
}
MODEL_KINDS = (
    "classify",
    "questions",
    "chat_choice",
    "chat_logprobs",
    "embeddings",
    "rerank",
    "systemone",
    "decisions",
)
EXPECTED = {k: {200} for k in (*MODEL_KINDS, "disconnect")} | {"bad": {400, 404, 413, 422}, "heavy": {200, 413, 504}}
RSS_GROWTH, P50_DRIFT = 0.10, 0.20


# ----------------------------------------------------------------------------- the server


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def rss_mb(pid: int) -> float | None:
    """The resident set of process `pid` in MB (`ps`, on Linux and macOS alike)."""
    try:
        out = subprocess.run(["ps", "-o", "rss=", "-p", str(pid)], capture_output=True, text=True, timeout=10)
        return round(int(out.stdout.strip()) / 1024, 1)
    except (ValueError, OSError, subprocess.TimeoutExpired):
        return None


class Server:
    """`mlx-slm serve` in a child process on a free loopback port, its log in a file."""

    def __init__(
        self, model: str, questions: Path, log: Path, options: list[str] | None = None, startup_timeout: float = 900
    ):
        import httpx

        self.port = _free_port()
        self.url = f"http://{HOST}:{self.port}"
        # The served task (two questions) and the socket; every other option at the server's
        # default unless `options` names it (--request-timeout, --state-cache: `main`'s own flags).
        self.args = ["serve", "--model", model, "--questions", str(questions), "--host", HOST]
        self.args += ["--port", str(self.port), *(options or [])]
        self.log = log
        env = {k: v for k, v in os.environ.items() if k != "MLX_SLM_API_KEY"}
        with open(log, "w") as f:
            self.proc = subprocess.Popen([sys.executable, "-m", "mlx_slm.cli", *self.args], stdout=f, stderr=f, env=env)
        t0 = time.perf_counter()
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited: {log.read_text()[-2000:]}")
            try:
                if httpx.get(self.url + "/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.perf_counter() - t0 > startup_timeout:
                self.proc.kill()
                raise RuntimeError("the server did not become healthy in time")
            time.sleep(0.5)
        self.startup_s = round(time.perf_counter() - t0, 1)

    def sigterm(self) -> dict[str, Any]:
        """SIGTERM, and how the process ended: its exit status, the seconds it took, the log's last line."""
        t0 = time.perf_counter()
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(300)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        log = self.log.read_text()
        return {
            "exit_status": code,
            "seconds": round(time.perf_counter() - t0, 2),
            "aborted": "terminate called" in log,
            "log_tail": log.strip().splitlines()[-1:] if log.strip() else [],
        }


# ----------------------------------------------------------------------------- the load


def texts() -> list[str]:
    from mlx_slm.text.workload import tickets

    return [t for t, _ in tickets(200)]


def bad_bodies(rng: random.Random) -> tuple[str, bytes]:
    """One hostile request (a path and its body): each is a 4xx by contract."""
    user = [{"role": "user", "content": "My card was charged twice"}]
    schema = {"type": "object", "properties": {"c": {"enum": LABELS}}, "required": [["c"]]}
    many = [f"choice number {i} about the account and the invoice" for i in range(2000)]
    bodies = [
        ("/v1/classify", b'{"text": '),
        ("/v1/classify", b'{"text": "hello \\ud800"}'),
        ("/v1/classify", json.dumps({"texts": [1, 2]}).encode()),
        ("/v1/classify", json.dumps({"text": "x", "labels": "billing"}).encode()),
        ("/v1/chat/completions", json.dumps({"messages": user, "guided_choice": "yes"}).encode()),
        ("/v1/chat/completions", json.dumps({"messages": user, "guided_choice": many}).encode()),
        (
            "/v1/chat/completions",
            json.dumps(
                {
                    "messages": user,
                    "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}},
                }
            ).encode(),
        ),
        ("/v1/chat/completions", json.dumps({"messages": user, "max_tokens": 5}).encode()),
        ("/v1/embeddings", json.dumps({"input": "x", "encoding_format": []}).encode()),
        ("/v1/embeddings", json.dumps({"input": "x", "model": ["m"]}).encode()),
        ("/v1/embeddings", json.dumps({"input": []}).encode()),
        ("/v1/rerank", json.dumps({"query": "", "documents": ["a"]}).encode()),
    ]
    return rng.choice(bodies)


def request(kind: str, rng: random.Random, pool: list[str]) -> tuple[str, bytes]:
    """The path and JSON body of one request of `kind`."""
    some = rng.sample(pool, rng.randint(1, 3))
    one = some[0]
    msgs = [{"role": "system", "content": "You sort support tickets."}, {"role": "user", "content": one}]
    body: dict[str, Any]
    if kind in ("classify", "disconnect"):
        path, body = "/v1/classify", {"texts": some, "labels": LABELS}
    elif kind == "questions":
        path, body = "/v1/classify", {"text": one}
    elif kind == "chat_choice":
        path, body = "/v1/chat/completions", {"messages": msgs, "guided_choice": LABELS}
    elif kind == "chat_logprobs":
        path, body = "/v1/chat/completions", {"messages": msgs, "max_tokens": 1, "logprobs": True, "top_logprobs": 5}
    elif kind == "embeddings":
        path, body = "/v1/embeddings", {"input": some}
    elif kind == "rerank":
        path, body = "/v1/rerank", {"query": one, "documents": rng.sample(pool, 4)}
    elif kind == "systemone":  # typed decisions: System One's shape, the state's tokens once per request
        qs = {
            "team": {"type": "choice", "instructions": "Which team handles it?", "criteria": dict.fromkeys(LABELS)},
            "urgent": {"type": "noul", "instructions": "Must it be answered today?"},
            "anger": {
                "type": "score",
                "instructions": "How angry is the customer?",
                "criteria": ["calm", "upset", "furious"],
            },
        }
        path, body = "/v1/systemone", {"model": "jev-latest", "state": one, "questions": qs}
    elif kind == "decisions":  # OpenAI's shape; a state asked again sometimes (the state cache)
        qs = [
            {"type": "predicate", "name": "refund", "instructions": "The customer asks for money back."},
            {
                "type": "choice",
                "name": "team",
                "instructions": "Which team?",
                "choices": [{"value": x} for x in LABELS],
            },
        ]
        path, body = "/v1/decisions", {"model": "gpt-6-luna", "input": one, "questions": qs}
    elif kind == "heavy":
        choices = [f"{i}: " + " ".join(rng.sample(pool, 1)[0].split()[:12]) for i in range(300)]
        path, body = "/v1/chat/completions", {"messages": msgs, "guided_choice": list(dict.fromkeys(choices))}
    else:
        return bad_bodies(rng)
    return path, json.dumps(body).encode()


async def client(
    k: int, url: str, kinds: list[str], weights: list[int], end: float, timeout: float, log: list[dict[str, Any]]
) -> None:
    """One client: a request at a time until `end`, each recorded (its kind, start, seconds, status)."""
    import httpx

    rng, pool = random.Random(1000 + k), texts()
    headers = {"content-type": "application/json"}
    async with httpx.AsyncClient(base_url=url, timeout=timeout) as http:
        while time.time() < end:
            kind = rng.choices(kinds, weights)[0]
            path, body = request(kind, rng, pool)
            t0 = time.time()
            rec: dict[str, Any] = {"kind": kind, "t": t0}
            try:
                if kind == "disconnect":
                    r = await asyncio.wait_for(http.post(path, content=body, headers=headers), rng.uniform(0.02, 0.3))
                else:
                    r = await http.post(path, content=body, headers=headers)
                rec["status"] = r.status_code
            except asyncio.TimeoutError:
                rec["status"] = "disconnected"
            except httpx.HTTPError as e:
                rec["status"], rec["error"] = "lost", type(e).__name__
            rec["s"] = time.time() - t0
            log.append(rec)
            await asyncio.sleep(rng.uniform(0, 0.1))


async def sampler(srv: Server, end: float, every: float, out: list[dict[str, Any]]) -> None:
    """RSS, /health and the /metrics gauges every `every` seconds until `end`."""
    import httpx

    async with httpx.AsyncClient(base_url=srv.url, timeout=30) as http:
        while time.time() < end:
            rec: dict[str, Any] = {"t": time.time(), "rss_mb": rss_mb(srv.proc.pid)}
            try:
                h = await http.get("/health")
                rec["health"] = h.json().get("status", str(h.status_code))
                rec.update(gauges((await http.get("/metrics")).text))
            except httpx.HTTPError as e:
                rec["health"] = f"unreachable ({type(e).__name__})"
            out.append(rec)
            await asyncio.sleep(every)


def gauges(text: str) -> dict[str, float]:
    """The worker's gauges and the items' outcomes from /metrics text."""
    out: dict[str, float] = {}
    for name in ("mlx_slm_queue_items", "mlx_slm_running_items", "mlx_slm_worker_busy_seconds"):
        m = re.search(rf"^{name} (\S+)$", text, re.M)
        out[name] = float(m.group(1)) if m else 0.0
    for m in re.finditer(r'^mlx_slm_items_total\{outcome="(\w+)"\} (\S+)$', text, re.M):
        out[f"items_{m.group(1)}"] = float(m.group(2))
    return out


def wait_idle(url: str, within: float) -> float | None:
    """Seconds until the worker is idle (queue 0, nothing running), or None past `within`."""
    import httpx

    t0 = time.perf_counter()
    while time.perf_counter() - t0 < within:
        g = gauges(httpx.get(url + "/metrics", timeout=30).text)
        if g["mlx_slm_queue_items"] == 0 and g["mlx_slm_running_items"] == 0:
            return round(time.perf_counter() - t0, 2)
        time.sleep(0.2)
    return None


# ----------------------------------------------------------------------------- the figures


def _pct(xs: list[float], q: float) -> float | None:
    return round(float(np.percentile(xs, q)) * 1000, 1) if xs else None


def per_minute(log: list[dict[str, Any]], samples: list[dict[str, Any]], t0: float, n: int, span: float) -> list:
    """One row per window of `span` seconds: RSS (last sample), p50/p99 of answered model
    requests (ms), answered requests per second, and the status counts."""
    rows = []
    for i in range(n):
        lo, hi = t0 + i * span, t0 + (i + 1) * span
        recs = [r for r in log if lo <= r["t"] < hi]
        lat = [r["s"] for r in recs if r["kind"] in MODEL_KINDS and r["status"] == 200]
        rss = [s["rss_mb"] for s in samples if lo <= s["t"] < hi and s["rss_mb"] is not None]
        statuses: dict[str, int] = {}
        for r in recs:
            statuses[str(r["status"])] = statuses.get(str(r["status"]), 0) + 1
        answered = sum(1 for r in recs if isinstance(r["status"], int))
        rows.append(
            {
                "minute": i + 1,
                "rss_mb": rss[-1] if rss else None,
                "p50_ms": _pct(lat, 50),
                "p99_ms": _pct(lat, 99),
                "requests": len(recs),
                "answered_per_s": round(answered / span, 3),
                "statuses": dict(sorted(statuses.items())),
            }
        )
    return rows


def checks(res: dict[str, Any], log: list[dict[str, Any]], samples: list[dict[str, Any]]) -> dict[str, Any]:
    """The run's checks (see the module docstring): each {"ok": bool, ...what it measured}."""
    warm, span = res["warmup_minutes"], res["minute_seconds"]
    t_warm = res["t0"] + warm * span
    rss = [s for s in samples if s["rss_mb"] is not None]
    after = next((s["rss_mb"] for s in rss if s["t"] >= t_warm), None)
    end = rss[-1]["rss_mb"] if rss else None
    growth = (end / after - 1) if after and end else None
    post = [r for r in log if r["t"] >= t_warm and r["kind"] in MODEL_KINDS and r["status"] == 200]
    mid = t_warm + (res["t_end"] - t_warm) / 2
    first, second = [r["s"] for r in post if r["t"] < mid], [r["s"] for r in post if r["t"] >= mid]
    drift = (_pct(second, 50) / _pct(first, 50) - 1) if first and second else None  # type: ignore[operator]
    bad_5xx = [
        r for r in log if isinstance(r["status"], int) and r["status"] >= 500 and r["status"] not in EXPECTED[r["kind"]]
    ]
    unexpected = [r for r in log if isinstance(r["status"], int) and r["status"] not in EXPECTED[r["kind"]]]
    lost = [r for r in log if r["status"] == "lost"]
    stalled = sum(1 for s in samples if s.get("health") == "stalled")
    final = res["final_metrics"]
    gone = sum(1 for r in log if r["status"] in ("disconnected", 504))
    late = final.get("items_late", 0)  # computed after its request had gone: at most its batch (3 texts)
    return {
        "rss": {
            "ok": growth is not None and growth < RSS_GROWTH,
            "after_warmup_mb": after,
            "end_mb": end,
            "growth": None if growth is None else round(growth, 4),
            "limit": RSS_GROWTH,
        },
        "p50": {
            "ok": drift is not None and drift < P50_DRIFT,
            "first_half_ms": _pct(first, 50),
            "second_half_ms": _pct(second, 50),
            "drift": None if drift is None else round(drift, 4),
            "limit": P50_DRIFT,
        },
        "no_5xx": {"ok": not bad_5xx, "count": len(bad_5xx), "examples": bad_5xx[:5]},
        "no_lost": {
            "ok": not lost and not unexpected,
            "lost": len(lost),
            "unexpected_status": len(unexpected),
            "examples": (lost + unexpected)[:5],
        },
        "dropped": {
            "ok": stalled == 0 and res["idle_after_s"] is not None and late <= 3 * gone,
            "stalled_samples": stalled,
            "idle_after_s": res["idle_after_s"],
            "requests_gone": gone,
            "items_dropped": final.get("items_dropped", 0),
            "items_late": final.get("items_late", 0),
        },
        "shutdown": {"ok": res["shutdown"]["exit_status"] == 0 and not res["shutdown"]["aborted"], **res["shutdown"]},
    }


# ----------------------------------------------------------------------------- the run


def prime(url: str, mix: dict[str, int], timeout: float) -> dict[str, Any]:
    """Fill the decision routes' state cache to its bound before the clients start: every state
    of the pool once through each decision route in the mix (the cache keeps recent states' keys
    and values, at most `--state-cache` states and 512 MiB; the pool holds more). A bounded cache
    filling is no leak: filled first, RSS after the warm-up measures what grows without bound
    (the first 30-minute run with decisions grew in steps to a plateau, +17 % after its warm-up,
    as the default 64-state cache filled)."""
    import httpx

    kinds = [k for k in ("systemone", "decisions") if k in mix]
    t0, n, statuses = time.perf_counter(), 0, {}
    with httpx.Client(base_url=url, timeout=timeout) as http:
        for text in texts():
            for kind in kinds:
                path, body = request(kind, random.Random(0), [text] * 3)  # its state: this text
                code = http.post(path, content=body, headers={"content-type": "application/json"}).status_code
                statuses[str(code)] = statuses.get(str(code), 0) + 1
                n += 1
    state_cache = httpx.get(url + "/v1/model", timeout=30).json().get("decisions", {}).get("state_cache")
    return {
        "requests": n,
        "seconds": round(time.perf_counter() - t0, 1),
        "statuses": statuses,
        "state_cache": state_cache,
    }


def rerank_support(url: str) -> str | None:
    """None when the served model reranks, else why not (its /v1/model "reranker" entry)."""
    import httpx

    info = httpx.get(url + "/v1/model", timeout=30).json().get("reranker") or {}
    return None if info.get("scorer") else str(info.get("why") or "the model is no reranker")


def soak(a: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    from mlx_slm.service import ServeOptions  # the server's defaults

    qfile = tmp / "questions.jsonl"
    qfile.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    options = [] if a.request_timeout is None else ["--request-timeout", f"{a.request_timeout:g}"]
    options += [] if a.state_cache is None else ["--state-cache", str(a.state_cache)]
    srv = Server(a.model, qfile, tmp / "server.log", options)
    timeout_s = ServeOptions().request_timeout_s if a.request_timeout is None else a.request_timeout
    try:
        skipped = rerank_support(srv.url)
        mix = {k: w for k, w in MIX.items() if not (k == "rerank" and skipped)}
        primed = prime(srv.url, mix, timeout_s + 60) if a.prime else None
        log: list[dict[str, Any]] = []
        samples: list[dict[str, Any]] = []
        span = a.minute_seconds
        t0 = time.time()
        end = t0 + a.minutes * span

        async def run() -> None:
            kinds, weights = list(mix), list(mix.values())
            timeout = timeout_s + 60  # the server must answer first
            jobs = [client(k, srv.url, kinds, weights, end, timeout, log) for k in range(a.clients)]
            await asyncio.gather(sampler(srv, end, a.sample_seconds, samples), *jobs)

        asyncio.run(run())
        t_end = time.time()
        idle = wait_idle(srv.url, timeout_s + 10)
        import httpx

        final = gauges(httpx.get(srv.url + "/metrics", timeout=30).text)
        samples.append({"t": time.time(), "rss_mb": rss_mb(srv.proc.pid), "health": "after"})
    finally:
        shutdown = srv.sigterm()
    res: dict[str, Any] = {
        "server_command": "mlx-slm " + " ".join(srv.args).replace(str(qfile), "questions.jsonl"),
        "startup_s": srv.startup_s,
        "minutes": a.minutes,
        "minute_seconds": span,
        "warmup_minutes": a.warmup_minutes,
        "clients": a.clients,
        "request_timeout_s": timeout_s,
        "mix": mix,
        "primed": primed,
        "rerank_skipped": skipped,
        "t0": t0,
        "t_end": t_end,
        "idle_after_s": idle,
        "final_metrics": final,
        "shutdown": shutdown,
        "requests": len(log),
        "by_kind": {k: _kind_row(log, k) for k in mix},
        "minutes_table": per_minute(log, samples, t0, a.minutes, span),
    }
    res["checks"] = checks(res, log, samples)
    return res


def _kind_row(log: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    recs = [r for r in log if r["kind"] == kind]
    statuses: dict[str, int] = {}
    for r in recs:
        statuses[str(r["status"])] = statuses.get(str(r["status"]), 0) + 1
    lat = [r["s"] for r in recs if r["status"] == 200]
    return {"requests": len(recs), "statuses": dict(sorted(statuses.items())), "p50_ms": _pct(lat, 50)}


def table(res: dict[str, Any]) -> str:
    from benchmarks.record import run_line

    lines = [
        f"# Soak: `mlx-slm serve` for {res['minutes']} x {res['minute_seconds']:g} s ({res['model']}, {res['date']})",
        "",
        run_line(res),
        "",
        f"Server: `{res['server_command']}` (ready in {res['startup_s']} s); {res['clients']} clients, one request "
        f"at a time each; warm-up: the first {res['warmup_minutes']} minute(s). Rerank: "
        + ("in the mix." if not res["rerank_skipped"] else f"skipped ({res['rerank_skipped']}).")
        + _primed(res.get("primed")),
        "",
        "| minute | RSS MB | p50 ms | p99 ms | answered/s | requests | statuses |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in res["minutes_table"]:
        st = ", ".join(f"{k}: {v}" for k, v in r["statuses"].items())
        lines.append(
            f"| {r['minute']} | {r['rss_mb']} | {r['p50_ms']} | {r['p99_ms']} | {r['answered_per_s']} | "
            f"{r['requests']} | {st} |"
        )
    lines += ["", "| kind | requests | statuses | p50 ms |", "|---|---|---|---|"]
    for k, r in res["by_kind"].items():
        st = ", ".join(f"{s}: {v}" for s, v in r["statuses"].items())
        lines.append(f"| {k} | {r['requests']} | {st} | {r['p50_ms']} |")
    lines += ["", "| check | ok | measured |", "|---|---|---|"]
    for name, c in res["checks"].items():
        shown = {k: v for k, v in c.items() if k not in ("ok", "examples", "log_tail")}
        lines.append(f"| {name} | {'yes' if c['ok'] else '**no**'} | {json.dumps(shown)} |")
    return "\n".join(lines) + "\n"


def _primed(p: dict[str, Any] | None) -> str:
    if not p:
        return ""
    st = ", ".join(f"{k}: {v}" for k, v in p["statuses"].items())
    return (
        f" Before the clients, the state cache ({p['state_cache']} states) was filled: {p['requests']} decision "
        f"requests, one per state of the pool and route, in {p['seconds']} s ({st})."
    )


def plot(res: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = res["minutes_table"]
    x = [r["minute"] for r in rows]
    fig, ax = plt.subplots(3, 1, figsize=(8, 8), sharex=True)
    rss = [r["rss_mb"] for r in rows]
    ax[0].plot(x, rss, marker="o")
    base = res["checks"]["rss"]["after_warmup_mb"]
    if base:  # the check's limit: what growth would fail it
        ax[0].axhline(base * (1 + RSS_GROWTH), color="r", ls="--", lw=1, label=f"+{RSS_GROWTH:.0%} after warm-up")
        ax[0].legend(loc="lower right")
    ax[0].set_ylim(0, 1.25 * max([v for v in rss if v] + [base or 0]))
    ax[0].set_ylabel("server RSS (MB)")
    ax[1].plot(x, [r["p50_ms"] for r in rows], marker="o", label="p50")
    ax[1].plot(x, [r["p99_ms"] for r in rows], marker="s", label="p99")
    ax[1].set_ylabel("latency (ms)")
    ax[1].legend()
    ax[2].plot(x, [r["answered_per_s"] for r in rows], marker="o")
    ax[2].set_ylabel("answered requests/s")
    ax[2].set_xlabel(f"minute ({res['minute_seconds']:g} s)")
    for a in ax:
        a.axvspan(0.5, res["warmup_minutes"] + 0.5, color="0.9")
        a.grid(alpha=0.3)
    fig.suptitle(f"mlx-slm serve soak: {res['model']}, {res['clients']} clients (grey: warm-up)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m", help="a model name or folder (default: SmolLM2-135M)")
    ap.add_argument("--minutes", type=int, default=30)
    ap.add_argument("--minute-seconds", type=float, default=60.0, help="a 'minute' of the table (shorter for tests)")
    ap.add_argument("--warmup-minutes", type=int, default=None, help="default: a tenth of the run, at least 1")
    ap.add_argument("--clients", type=int, default=3)
    ap.add_argument("--request-timeout", type=float, default=None, help="the server's (default: its own, 60 s)")
    ap.add_argument("--state-cache", type=int, default=None, help="the server's (default: its own, 64 states)")
    ap.add_argument(
        "--no-prime", dest="prime", action="store_false", help="do not fill the state cache before the clients start"
    )
    ap.add_argument("--name", default="soak", help="the result files' name (NAME.json, NAME.md, NAME.png)")
    ap.add_argument("--sample-seconds", type=float, default=5.0)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    a = ap.parse_args(argv)
    if a.warmup_minutes is None:
        a.warmup_minutes = max(1, a.minutes // 10)
    if a.minutes < a.warmup_minutes + 2:
        ap.error("--minutes must leave at least two minutes after the warm-up")
    from benchmarks.record import run_record
    from mlx_slm.ground.blas import matmul_peak

    peak0 = matmul_peak()["mlx"]
    with tempfile.TemporaryDirectory() as tmp:
        res = soak(a, Path(tmp))
    res = {**run_record("benchmarks.soak", a.model, argv, peak0, matmul_peak()["mlx"]), **res}
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{a.name}.json").write_text(json.dumps(res, indent=2) + "\n")
    (out / f"{a.name}.md").write_text(table(res))
    plot(res, out / f"{a.name}.png")
    print(table(res))
    return 0 if all(c["ok"] for c in res["checks"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
