"""Long inputs: our forward against Transformers' on one text of 256 to 8,192 tokens.

    python -m benchmarks.long_inputs [--model qwen2.5-coder-0.5b] [--lengths 256,1024,4096,8192]
        [--rounds 3] [--threads 2] [--out benchmarks/results]

For each length, one text of exactly that many tokens (the workload's tickets one after
another, tokenized once, cut) runs through the whole model once, in float32, batch 1, as a
classification prompt does: every layer over every position, the last position's logits over
the vocabulary. Both sides run the same token ids on the same weights:

* ours: the model `mlx-slm serve` loads (float32 on the CPU) and its forward (`last_only`, the
  fastmath ops this machine chooses), then the LM head on the last position;
* Transformers: `AutoModelForCausalLM` in float32 (its default SDPA attention, causal),
  `logits_to_keep=1`, `torch.set_num_threads(--threads)`, in a child process without our BLAS
  preload (`Transformers`, kept for the run).

A shared machine is noisy, so the two sides alternate text by text: in each round, each length
runs on both sides one after the other (ours first in odd rounds, Transformers first in even
ones), and the figures are the medians over `--rounds` (the speed-up: the median of the pairs'
ratios, each pair's two forwards measured back to back).
Reported per length: tokens/s of each, the speed-up (Transformers' seconds over ours), the
matmul floor (tokens/s at the measured matmul peak, the weights' products alone), and the
largest |logit| difference from Transformers at the last position, and the admission estimate:
what `mlx-slm serve` prices one such text at before running it (its `RateTracker` after the
warm-up `serve` runs, `service.core.warm_up`, on this very engine) against our measured time
(the server refuses an item priced over its --request-timeout). Up to `--unblocked-max`
tokens, ours also runs with the whole (unblocked) attention (`fastmath.attention` with one
block per (row, KV head): every score of the causal square computed, the mask applied), and
the largest |logit| difference between our two paths is reported too.

Results: `--out`/NAME.{json,md,png} (`--name`, default long-inputs).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

import mlx_slm  # noqa: F401  (BLAS before mlx)
from benchmarks.record import run_line, run_record


def token_ids(tokenizer: Any, lengths: list[int]) -> dict[int, list[int]]:
    """One text per length: the workload's tickets one after another, tokenized, cut to the length."""
    from mlx_slm.text.workload import tickets

    text = "\n".join(t for t, _ in tickets(600))
    ids = list(tokenizer.encode(text, add_special_tokens=False))
    while len(ids) < max(lengths):
        ids = ids + ids
    return {n: ids[:n] for n in lengths}


def _b64(a: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(a, dtype=np.float32).tobytes()).decode()


def _unb64(s: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(s), dtype=np.float32)


# ---------------------------------------------------------------------------- Transformers (the child)
def worker(src: str, threads: str) -> int:
    """Transformers' forward, timed, for each text the parent sends: one JSON line in ({"ids"}),
    one out ({"seconds", "logits": base64 float32}); the first line out says it is ready."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    answer = os.fdopen(os.dup(1), "w")  # the protocol's own stdout; anything else printed goes to stderr
    os.dup2(2, 1)
    hf_logging.disable_progress_bar()
    torch.set_num_threads(int(threads))
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
    ready = {"attention": str(model.config._attn_implementation), "threads": torch.get_num_threads()}
    answer.write(json.dumps(ready) + "\n")
    answer.flush()
    for line in sys.stdin:
        x = torch.tensor([json.loads(line)["ids"]])
        with torch.inference_mode():
            t0 = time.perf_counter()
            logits = model(x, use_cache=False, logits_to_keep=1).logits[0, -1]
            seconds = time.perf_counter() - t0
        answer.write(json.dumps({"seconds": seconds, "logits": _b64(logits.float().numpy())}) + "\n")
        answer.flush()
    return 0


class Transformers:
    """The worker in a child process without our BLAS preload (MLX_SLM_BLAS=none, as
    `parity.reference.run_in_child`: PyTorch shares no BLAS threads with MLX there), kept for the
    whole run so that each of our forwards has Transformers' beside it."""

    def __init__(self, src: str, threads: int):
        env = {**os.environ, "MLX_SLM_BLAS": "none"}
        cmd = [sys.executable, "-m", "benchmarks.long_inputs", "--worker", src, str(threads)]
        root = Path(__file__).resolve().parent.parent
        self.proc = subprocess.Popen(cmd, cwd=root, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.info = self._read()

    def _read(self) -> dict[str, Any]:
        line = self.proc.stdout.readline()  # type: ignore[union-attr]
        if not line:
            raise RuntimeError(f"the Transformers worker ended (exit status {self.proc.wait()})")
        return json.loads(line)

    def forward(self, ids: list[int]) -> tuple[float, np.ndarray]:
        """(seconds, last-position logits) of one text through Transformers' model."""
        self.proc.stdin.write(json.dumps({"ids": ids}) + "\n")  # type: ignore[union-attr]
        self.proc.stdin.flush()  # type: ignore[union-attr]
        got = self._read()
        return got["seconds"], _unb64(got["logits"])

    def close(self) -> None:
        self.proc.stdin.close()  # type: ignore[union-attr]
        self.proc.wait(60)


# ---------------------------------------------------------------------------- ours
class Unblocked:
    """The fastmath ops with the whole attention: one block per (batch row, KV head), the scores of
    the whole causal square computed and masked (the path before query spans), for the check."""

    def __init__(self, ops: Any):
        self.ops, self.name = ops, "fastmath-unblocked"

    def __getattr__(self, name: str) -> Any:
        return getattr(self.ops, name)

    def attention(self, q: Any, k: Any, v: Any, scale: float, mask: Any) -> Any:
        from mlx_slm.models import fastmath

        return fastmath.attention(q, k, v, scale, mask, causal=True, block=1 << 62)


def forward(model: Any, ids: list[int]) -> tuple[float, np.ndarray]:
    """(seconds, last-position logits) of one text through our model."""
    import mlx.core as mx

    x = mx.array([ids])
    t0 = time.perf_counter()
    hidden, _ = model(x, last_only=True)
    logits = model.logits(hidden)
    mx.eval(logits)
    seconds = time.perf_counter() - t0
    return seconds, np.array(logits[0], dtype=np.float32)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--lengths", default="256,1024,4096,8192", help="tokens of each text")
    ap.add_argument("--rounds", type=int, default=3, help="rounds over the lengths, both sides each (medians)")
    ap.add_argument("--threads", type=int, default=2, help="Transformers' torch threads (ours: the machine's)")
    ap.add_argument("--unblocked-max", type=int, default=4096, help="longest text ours also runs unblocked")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    ap.add_argument("--name", default="long-inputs", help="the result files' name (NAME.json, NAME.md, NAME.png)")
    ap.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        return worker(*a.worker)
    from mlx_slm.ground.blas import matmul_peak
    from mlx_slm.models import fastmath, flops_per_token
    from mlx_slm.service import TaskCache, classifier_loader
    from mlx_slm.service.core import warm_up
    from mlx_slm.service.metrics import RateTracker, attention_share

    lengths = [int(x) for x in a.lengths.split(",")]
    peak0 = matmul_peak()["mlx"]
    tasks = TaskCache(1)  # the served classifier, loaded and warmed as `mlx-slm serve` does (float32 on the CPU)
    tasks.load(classifier_loader(a.model, dtype="float32")())
    engine = tasks.loaded.clf.engine  # type: ignore[union-attr]
    speed = RateTracker(attention_share(engine.model.args))
    warm_up(tasks, lambda seconds, tokens: speed.observe(tokens, seconds))
    model, src = engine.model, str(engine.path)
    per_token = flops_per_token(json.loads((engine.path / "config.json").read_text()))
    texts = token_ids(engine.tokenizer, lengths)
    for ids in (texts[lengths[0]][:64], texts[lengths[0]]):  # warm-up, untimed
        forward(model, ids)
    ours: dict[int, list[float]] = {n: [] for n in lengths}
    theirs: dict[int, list[float]] = {n: [] for n in lengths}
    logits: dict[int, np.ndarray] = {}
    ref: dict[int, np.ndarray] = {}
    hf = Transformers(src, a.threads)
    try:
        for ids in (texts[lengths[0]][:64], texts[lengths[0]]):  # its warm-up, untimed
            hf.forward(ids)
        for r in range(a.rounds):
            for n in lengths:  # each length on both sides in turn, who goes first alternating by round
                for side in ("ours", "transformers") if r % 2 == 0 else ("transformers", "ours"):
                    if side == "ours":
                        seconds, logits[n] = forward(model, texts[n])
                        ours[n].append(seconds)
                    else:
                        seconds, ref[n] = hf.forward(texts[n])
                        theirs[n].append(seconds)
                    print(f"round {r + 1}: {side} {n:>6} tokens: {seconds:.2f} s", file=sys.stderr)
    finally:
        hf.close()
    unblocked: dict[int, float] = {}
    own = model.ops
    model.ops = Unblocked(own)
    try:
        for n in [n for n in lengths if n <= a.unblocked_max]:
            unblocked[n] = float(np.abs(forward(model, texts[n])[1] - logits[n]).max())
    finally:
        model.ops = own
    peak1 = matmul_peak()["mlx"]
    peak = max(peak0, peak1)
    rows = []
    for n in lengths:
        ratios = [t / o for t, o in zip(theirs[n], ours[n])]
        rows.append(
            {
                "tokens": n,
                "ours_seconds": [round(s, 3) for s in ours[n]],
                "transformers_seconds": [round(s, 3) for s in theirs[n]],
                "ours_tps": round(n / statistics.median(ours[n]), 1),
                "transformers_tps": round(n / statistics.median(theirs[n]), 1),
                "x_transformers": round(statistics.median(ratios), 3),
                "x_transformers_rounds": [round(x, 3) for x in ratios],
                "floor_tps": round(peak * 1e9 / per_token, 1),
                "max_logit_diff": float(np.abs(logits[n] - ref[n]).max()),
                "max_logit_diff_unblocked": unblocked.get(n),
                "estimate_s": round(speed.estimate(n), 2),
                "estimate_over_ours": round(speed.estimate(n) / statistics.median(ours[n]), 3),
            }
        )
    out = {
        **run_record("benchmarks.long_inputs", a.model, argv, peak0, peak1),
        "ours": {"ops": str(own.name), "threads": fastmath._threads(), "stacked_rows": fastmath.STACKED_ROWS},
        "transformers": hf.info,
        "rounds": a.rounds,
        "estimate": {"fixed_s": round(speed.fixed, 4), "per_token_s": speed.per_token, "attention": speed.attention},
        "rows": rows,
    }
    write(out, a.out, a.name)
    return 0


def write(out: dict[str, Any], folder: Path, name: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.json").write_text(json.dumps(out, indent=2) + "\n")
    t, o = out["transformers"], out["ours"]
    lines = [
        f"# Long inputs: one text's forward, ours against Transformers ({out['model']}, float32, {out['date']})",
        "",
        run_line(out),
        "",
        f"Ours: the {o['ops']} ops, {o['threads']} threads; Transformers: {t['attention']} attention, "
        f"{t['threads']} torch threads, in a child without our BLAS preload. Medians of {out['rounds']} rounds "
        "(in each, every length on both sides back to back, who goes first alternating); the speed-up is the "
        "median of the pairs' ratios (Transformers' seconds over ours).",
        "",
        "| tokens | ours tokens/s | Transformers tokens/s | x Transformers (rounds) | matmul floor tokens/s | "
        "max abs logit diff vs Transformers | max abs logit diff, blocked vs whole attention | "
        "admission estimate s (x ours) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in out["rows"]:
        rounds = ", ".join(f"{x:.2f}" for x in r["x_transformers_rounds"])
        unb = "not run" if r["max_logit_diff_unblocked"] is None else f"{r['max_logit_diff_unblocked']:.1e}"
        lines.append(
            f"| {r['tokens']:,} | {r['ours_tps']} | {r['transformers_tps']} | **{r['x_transformers']:.2f}** "
            f"({rounds}) | {r['floor_tps']} | {r['max_logit_diff']:.1e} | {unb} | {r['estimate_s']} "
            f"({r['estimate_over_ours']:.2f}) |"
        )
    (folder / f"{name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    ns = [r["tokens"] for r in out["rows"]]
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(10, 4))
    ax.plot(ns, [r["ours_tps"] for r in out["rows"]], "o-", label="ours")
    ax.plot(ns, [r["transformers_tps"] for r in out["rows"]], "^--", label="Transformers")
    ax.plot(ns, [r["floor_tps"] for r in out["rows"]], ":", label="matmul floor (weights' products at the peak)")
    ax.set_xlabel("tokens in the text")
    ax.set_ylabel("tokens/s")
    ax.set_xscale("log", base=2)
    ax.legend()
    ax.set_title("Throughput, one text, float32")
    bx.plot(ns, [r["x_transformers"] for r in out["rows"]], "o-")
    bx.axhline(1.0, color="grey", lw=0.8)
    bx.axhline(1.1, color="grey", lw=0.8, ls=":")
    bx.set_xlabel("tokens in the text")
    bx.set_ylabel("x Transformers (median of the rounds)")
    bx.set_xscale("log", base=2)
    bx.set_title("Speed-up")
    fig.suptitle(f"Long inputs ({out['model']})")
    fig.tight_layout()
    fig.savefig(folder / f"{name}.png", dpi=120)


if __name__ == "__main__":
    sys.exit(main())
