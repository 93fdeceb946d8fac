"""Typed decisions (System One's /v1/systemone, OpenAI's /v1/decisions): ours against
Transformers' own decision path on the same model and machine.

    python -m benchmarks.decisions [--model qwen2.5-coder-0.5b] [--n 12] [--counts 1,4,16]
        [--batch 8] [--out benchmarks/results]

The requests: `--n` workload tickets (stratified by length, as `benchmarks.questions`) as
states, each asked the first c of sixteen triage questions (noul, choice with descriptions,
score) for each c in `--counts`. Both sides answer the same System One requests:

* Transformers: `transformers.decision` as its decision pipeline and `transformers serve` run
  it (`prepare_inputs`: one full prompt per question, the model's forward with `logits_to_keep`
  at each mark, the label tokens' logits, `process_scores`, softmax), in a child process
  without our BLAS preload, float32, one request at a time (its pipeline does not batch).
* ours, one request at a time: a `Decider` (the state's tokens once, each question a branch
  after it) with the state cache off: each request's latency;
* ours, batched: `--batch` requests per `Decider.decide` call (what the server's micro-batches
  run when requests arrive together): throughput;
* ours, a state asked again: the same request twice with the state cache on (the second runs
  only its questions).

Reported per count: requests/s and mean latency of each, the speed-up, the tokens each side
ran (ours: the state once plus every question's own tokens, the token floor; Transformers':
every question's whole prompt) and the floor's seconds at the measured matmul peak, the
second request's speed-up with the state cache, and the largest probability difference from
Transformers (float32 on both sides: within 1e-4 is the goal).

`--reference-n K` runs Transformers on the first K requests of each count only (a short run: it
is the slow side); its figures are then its mean per request, and the speed-up and the tokens
compare ours on those same requests (the batched speed-up: ours over all requests).

Results: `--out`/decisions.{json,md,png}.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

import mlx_slm  # noqa: F401  (BLAS before mlx)
from benchmarks.record import in_child, run_line, run_record

NOUL, CHOICE, SCORE = "noul", "choice", "score"
# Sixteen triage questions about a support ticket, in System One's form.
QUESTIONS: dict[str, dict[str, Any]] = {
    "team": {
        "type": CHOICE,
        "instructions": "Which team should handle this ticket?",
        "criteria": {"billing": "Payments, invoices, refunds", "technical": "Bugs, outages", "account": None},
    },
    "urgent": {"type": NOUL, "instructions": "Does this ticket need an answer today?"},
    "angry": {"type": SCORE, "instructions": "How upset is the customer?", "criteria": ["Calm", "Annoyed", "Angry"]},
    "refund": {"type": NOUL, "instructions": "Does the customer ask for money back?"},
    "product": {"type": CHOICE, "instructions": "Which product is it about?", "criteria": {"app": None, "website": None, "card": None}},
    "repeat": {"type": NOUL, "instructions": "Has the customer written about this before?"},
    "bug": {"type": NOUL, "instructions": "Does the ticket report a software bug?", "criteria": {"true": "A fault in our software"}},
    "security": {"type": NOUL, "instructions": "Could the account be at risk?"},
    "churn": {"type": NOUL, "instructions": "Might the customer leave us?"},
    "effort": {"type": SCORE, "instructions": "How much work to solve it?", "criteria": ["Minutes", "Hours", "Days"]},
    "language": {"type": NOUL, "instructions": "Is the ticket written in English?"},
    "payment": {"type": NOUL, "instructions": "Is a payment mentioned in the ticket?"},
    "login": {"type": NOUL, "instructions": "Is logging in part of the problem?"},
    "polite": {"type": SCORE, "instructions": "How polite is the customer?", "criteria": ["Rude", "Neutral", "Polite", "Warm"]},
    "priority": {"type": CHOICE, "instructions": "What priority should it get?", "criteria": {"low": None, "normal": None, "high": None}},
    "channel": {"type": CHOICE, "instructions": "Where should the answer go?", "criteria": {"email": None, "phone": None}},
}  # fmt: skip


def states_of(n: int) -> list[str]:
    """`n` workload tickets, stratified by length (every (600/n)-th of the 600 sorted by words)."""
    from mlx_slm.text.workload import tickets

    all_t = [t for t, _ in tickets(600)]
    order = sorted(range(600), key=lambda i: len(all_t[i].split()))
    return [all_t[order[int(k * 600 / n)]] for k in range(n)]


def requests_of(states: list[str], c: int) -> list[dict[str, Any]]:
    qs = dict(list(QUESTIONS.items())[:c])
    return [{"model": "jev-latest", "state": s, "questions": qs} for s in states]


# ---------------------------------------------------------------------------- Transformers (the child)
def worker(job_path: str, out_path: str) -> int:
    """Transformers' decision path on each request, one at a time, timed: {seconds, tokens, answers}."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.decision import DecisionConfig, label_token_ids, prepare_inputs
    from transformers.decision.modeling_utils import process_scores
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    job = json.loads(Path(job_path).read_text())
    if job.get("threads"):
        torch.set_num_threads(job["threads"])
    model = AutoModelForCausalLM.from_pretrained(job["src"], dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(job["src"])
    cfg = DecisionConfig.from_pretrained(job["src"])
    out: dict[str, Any] = {}
    first = next(iter(job["requests"].values()))[0]
    for inputs, _ in prepare_inputs(cfg, first, tok):  # warm-up, untimed: the first forward's one-off costs
        inputs = dict(inputs)
        inputs.pop("marks")
        with torch.inference_mode():
            model(**inputs, use_cache=False, logits_to_keep=1)
    for c, reqs in job["requests"].items():
        rows = []
        for req in reqs:
            t0 = time.perf_counter()
            got, tokens = {}, 0
            try:
                prompts = prepare_inputs(cfg, req, tok)
                for _, questions in prompts:
                    label_token_ids(tok, tuple(questions[0].labels))  # refuses labels that are not single tokens
            except ValueError as e:  # e.g. Yes/No not single tokens of a toy tokenizer: Transformers cannot ask it
                rows.append({"error": str(e)})
                continue
            for inputs, questions in prompts:
                inputs = dict(inputs)
                marks = inputs.pop("marks")
                tokens += int(inputs["input_ids"].shape[-1])
                with torch.inference_mode():
                    logits = model(**inputs, use_cache=False, logits_to_keep=marks - 1).logits[0]
                labels = [logits[i, label_token_ids(tok, tuple(q.labels))] for i, q in enumerate(questions)]
                scores = process_scores(cfg, inputs["input_ids"], marks, questions, labels)
                got |= {q.name: s.softmax(-1).tolist() for q, s in zip(questions, scores)}
            rows.append({"seconds": time.perf_counter() - t0, "tokens": tokens, "answers": got})
        out[c] = rows
        print(f"transformers {c:>2} questions: {sum(r.get('seconds', 0) for r in rows):.1f} s", file=sys.stderr)
    Path(out_path).write_text(json.dumps(out))
    return 0


# ---------------------------------------------------------------------------- ours
def ours(model: str, requests: dict[int, list[dict[str, Any]]], batch: int) -> dict[int, dict[str, Any]]:
    """Per count: one-at-a-time latencies (state cache off), batched throughput, the second of two
    identical requests with the state cache on, each request's probabilities and tokens."""
    from mlx_slm.classifier.decider import Decider
    from mlx_slm.text.decisions.systemone import parse_systemone

    cold = Decider.load(model, state_cache=0)
    warm = Decider(cold.engine, cold.config, state_cache=64, answer_cache=False)  # its questions run again
    parsed = {c: [parse_systemone(r, cold.config) for r in reqs] for c, reqs in requests.items()}
    cold.decide(parsed[min(parsed)][:1])  # warm-up: the first forward's one-off costs
    out: dict[int, dict[str, Any]] = {}
    for c, reqs in parsed.items():
        lat, results = [], []
        for r in reqs:
            t0 = time.perf_counter()
            (res,) = cold.decide([r])
            lat.append(time.perf_counter() - t0)
            results.append(res)
        t0 = time.perf_counter()
        for k in range(0, len(reqs), batch):
            cold.decide(reqs[k : k + batch])
        batched = time.perf_counter() - t0
        first, second = [], []
        for r in reqs:
            t0 = time.perf_counter()
            warm.decide([r])
            t1 = time.perf_counter()
            (again,) = warm.decide([r])
            first.append(t1 - t0)
            second.append(time.perf_counter() - t1)
            assert again.cached_tokens > 0, "the state cache did not serve the second request"
        out[c] = {
            "latencies": lat,
            "batched_seconds": batched,
            "first_seconds": first,
            "second_seconds": second,
            "tokens": [int(r.input_tokens) for r in results],
            "answers": [
                {q.key: np.asarray(p, dtype=np.float64).tolist() for q, p in zip(req.questions, r.probabilities)}
                for req, r in zip(reqs, results)
            ],
        }
        print(f"ours {c:>2} questions: {sum(lat):.2f} s one at a time, {batched:.2f} s batched", file=sys.stderr)
    return out


def max_diff(a: list[dict[str, list[float]]], b: list[dict[str, list[float]]]) -> float:
    return max(
        (max(abs(x - y) for x, y in zip(pa[k], pb[k])) for pa, pb in zip(a, b) for k in pa if isinstance(pb, dict)),
        default=float("nan"),
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--n", type=int, default=12, help="tickets (requests per count)")
    ap.add_argument("--counts", default="1,4,16", help="questions per request")
    ap.add_argument("--batch", type=int, default=8, help="requests per decide call for the throughput row")
    ap.add_argument(
        "--reference-n", type=int, help="Transformers runs only the first N requests of each count (its mean per request "
        "is what compares; default: all)",
    )  # fmt: skip
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    ap.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        return worker(*a.worker)
    from mlx_slm.engine.engine import Engine
    from mlx_slm.ground.blas import matmul_peak
    from mlx_slm.models import flops_per_token

    counts = [int(x) for x in a.counts.split(",")]
    states = states_of(a.n)
    requests = {c: requests_of(states, c) for c in counts}
    peak0 = matmul_peak()["mlx"]
    engine = Engine.load(a.model)  # resolved and converted once; both sides read these weights
    src = str(engine.path)
    per_token = flops_per_token(json.loads((engine.path / "config.json").read_text()))
    del engine
    mine = ours(src, requests, a.batch)
    k = a.reference_n or a.n
    ref = in_child("benchmarks.decisions", {"src": src, "requests": {str(c): r[:k] for c, r in requests.items()}})
    peak1 = matmul_peak()["mlx"]
    peak = max(peak0, peak1)
    rows = []
    for c in counts:
        m, t = mine[c], [r for r in ref[str(c)] if "seconds" in r]
        if not t:  # Transformers refused every request (its error in the JSON): nothing to compare
            raise SystemExit(f"{c} questions: Transformers' path refused them: {ref[str(c)][0]['error']}")
        hf_secs = [r["seconds"] for r in t]
        n = len(states)
        floor = sum(m["tokens"])
        row = {
            "questions": c,
            "requests": n,
            "transformers_requests": len(hf_secs),
            "transformers_rps": round(len(hf_secs) / sum(hf_secs), 3),
            "transformers_latency_s": round(statistics.mean(hf_secs), 4),
            "ours_latency_same_s": round(statistics.mean(m["latencies"][: len(hf_secs)]), 4),
            "ours_rps": round(n / sum(m["latencies"]), 3),
            "ours_latency_s": round(statistics.mean(m["latencies"]), 4),
            "ours_batched_rps": round(n / m["batched_seconds"], 3),
            # against ours on the same requests (Transformers may have run only the first --reference-n)
            "x_transformers": round(statistics.mean(hf_secs) / statistics.mean(m["latencies"][: len(hf_secs)]), 2),
            "x_transformers_batched": round(statistics.mean(hf_secs) / (m["batched_seconds"] / n), 2),
            "repeat_first_s": round(statistics.mean(m["first_seconds"]), 4),
            "repeat_second_s": round(statistics.mean(m["second_seconds"]), 4),
            "x_repeat": round(sum(m["first_seconds"]) / sum(m["second_seconds"]), 2),
            "ours_tokens": floor,
            "transformers_tokens": sum(r["tokens"] for r in t),  # its requests'
            "ours_tokens_same": sum(m["tokens"][: len(t)]),  # ours on the same requests
            "floor_seconds": round(floor * per_token / (peak * 1e9), 4),
            "max_prob_diff": max_diff(m["answers"], [r["answers"] for r in t]),
        }
        rows.append(row)
    one = next((r for r in rows if r["questions"] == 1), None)
    for r in rows:
        r["x_latency_of_one_question"] = round(r["ours_latency_s"] / one["ours_latency_s"], 2) if one else None
    out = {**run_record("benchmarks.decisions", a.model, argv, peak0, peak1), "states": len(states), "rows": rows}
    write(out, a.out)
    return 0


def write(out: dict[str, Any], folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "decisions.json").write_text(json.dumps(out, indent=2) + "\n")
    lines = [
        f"# Typed decisions against Transformers' decision path ({out['model']}, {out['date']}, "
        f"{out['states']} workload tickets per row)",
        "",
        run_line(out),
        "",
        "| questions | Transformers req/s | ours req/s (one at a time) | ours req/s (batched) | x Transformers "
        "(one / batched) | latency s: Transformers / ours | x 1-question latency | repeated state: 1st / 2nd s "
        "(x) | tokens: Transformers / ours (the same requests) | floor s per request | max prob diff |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in out["rows"]:
        lines.append(
            f"| {r['questions']} | {r['transformers_rps']} | {r['ours_rps']} | {r['ours_batched_rps']} | "
            f"{r['x_transformers']} / {r['x_transformers_batched']} | {r['transformers_latency_s']} / "
            f"{r['ours_latency_same_s']} | {r['x_latency_of_one_question']} | {r['repeat_first_s']} / "
            f"{r['repeat_second_s']} ({r['x_repeat']}) | {r['transformers_tokens']} / {r['ours_tokens_same']} | "
            f"{r['floor_seconds'] / r['requests']:.4f} | {r['max_prob_diff']:.1e} |"
        )
    (folder / "decisions.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    qs = [r["questions"] for r in out["rows"]]
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(10, 4))
    ax.plot(qs, [r["ours_batched_rps"] for r in out["rows"]], "o-", label="ours, batched")
    ax.plot(qs, [r["ours_rps"] for r in out["rows"]], "s-", label="ours, one at a time")
    ax.plot(qs, [r["transformers_rps"] for r in out["rows"]], "^--", label="Transformers' decision path")
    ax.set_xlabel("questions per request")
    ax.set_ylabel("requests/s")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.legend()
    ax.set_title("Throughput")
    bx.plot(qs, [r["ours_latency_s"] for r in out["rows"]], "s-", label="ours")
    bx.plot(qs, [r["repeat_second_s"] for r in out["rows"]], "d:", label="ours, state asked again")
    bx.plot(qs, [r["transformers_latency_s"] for r in out["rows"]], "^--", label="Transformers")
    bx.plot(qs, [r["floor_seconds"] / r["requests"] for r in out["rows"]], ":", label="token floor at the matmul peak")
    bx.set_xlabel("questions per request")
    bx.set_ylabel("seconds per request")
    bx.set_xscale("log", base=2)
    bx.set_yscale("log")
    bx.legend()
    bx.set_title("Latency")
    fig.suptitle(f"Typed decisions ({out['model']})")
    fig.tight_layout()
    fig.savefig(folder / "decisions.png", dpi=120)


if __name__ == "__main__":
    sys.exit(main())
