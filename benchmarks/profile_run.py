"""Where one default run's time goes: the real Classifier, every op group timed in place.

    python benchmarks/profile_run.py [--n 120] [--model qwen2.5-coder-0.5b]

Runs the CLI's default path (prefix cache, sorted, token budget, label rows) on a
length-stratified sample of the workload twice: once untouched (the wall time to
explain), once with each op group wrapped so that its inputs are evaluated before and
its output after a timer. MLX's CPU stream runs ops one after another, so these
syncs move little time around; the instrumented total is printed beside the plain
one so the distortion is visible. Writes a markdown table to stdout and JSON to
the results folder.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from transformers import AutoTokenizer

import mlx_slm  # noqa: F401  (optimized BLAS before mlx.core)
from mlx_slm.classifier.classifier import Classifier
from mlx_slm.engine.engine import Engine
from mlx_slm.ground.blas import matmul_peak
from mlx_slm.models import base as model_mod
from mlx_slm.models import fastmath, flops_per_token, load_model
from mlx_slm.text.workload import stratified_sample, tickets
from mlx_slm.weights.sources import materialise

T: dict[str, float] = defaultdict(float)
N: dict[str, int] = defaultdict(int)


def _leaves(x):
    if isinstance(x, mx.array):
        return [x]
    if isinstance(x, (list, tuple)):
        return [a for y in x for a in _leaves(y)]
    return []


def timed(name, fn):
    def wrapper(*args, **kwargs):
        pending = _leaves(list(args) + list(kwargs.values()))
        if pending:
            mx.eval(*pending)
        t = time.perf_counter()
        out = fn(*args, **kwargs)
        mx.eval(*_leaves(out))
        T[name] += time.perf_counter() - t
        N[name] += 1
        return out

    return wrapper


def instrument() -> None:
    """Wrap each op group where the forward calls it (classes and module functions)."""
    nn.Linear.__call__ = timed("matmuls (q,k,v,o,gate,up,down)", nn.Linear.__call__)
    nn.RMSNorm.__call__ = timed("rms_norm", nn.RMSNorm.__call__)
    nn.Embedding.__call__ = timed("embedding lookup", nn.Embedding.__call__)
    model_mod.Attention._rope = timed("rope", model_mod.Attention._rope)
    fastmath.silu_mul = timed("silu(g)*u (numpy)", fastmath.silu_mul)
    fastmath.attention = timed("attention core (scores, softmax, @v)", fastmath.attention)
    model_mod.build_mask = timed("mask build", model_mod.build_mask)
    fastmath.additive_mask = timed("mask build", fastmath.additive_mask)
    model_mod.Model.logits = timed("label-row logits", model_mod.Model.logits)
    Classifier.prepare = timed("render + tokenize", Classifier.prepare)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--n", type=int, default=120)
    ap.add_argument("--results", default="benchmarks/results")
    a = ap.parse_args()
    path = materialise(a.model)
    m = load_model(path)
    tok = AutoTokenizer.from_pretrained(str(path))
    texts = [t for t, _ in tickets()]
    lens = [len(x) for x in tok(texts)["input_ids"]]
    sub = [texts[i] for i in stratified_sample(lens, a.n)]
    Classifier(Engine(m, tok)).classify(sub[:4])  # warm-up

    t = time.perf_counter()
    plain = Classifier(Engine(m, tok))
    plain_run = plain.run(sub, window=len(sub))
    list(plain_run)
    wall = time.perf_counter() - t

    instrument()
    t = time.perf_counter()
    c = Classifier(Engine(m, tok))
    c.classify(sub)
    wall_i = time.perf_counter() - t

    peak = matmul_peak()["mlx"]
    fpt = flops_per_token(json.loads((path / "config.json").read_text()))
    tokens = plain_run.stats.processed_tokens
    named = sum(T.values())
    rows = sorted(T.items(), key=lambda kv: -kv[1]) + [
        ("other (Python, concat/reshape/residual adds, batching)", wall_i - named)
    ]
    lines = [
        f"`python benchmarks/profile_run.py --n {a.n} --model {a.model}`",
        "",
        f"plain run: {wall:.2f} s, {len(sub) / wall:.2f} items/s, {tokens:,} processed tokens, "
        f"{fpt * tokens / wall / 1e9:.0f} GFLOP/s = {100 * fpt * tokens / wall / 1e9 / peak:.0f} % of the "
        f"{peak:.0f} GFLOP/s matmul peak; instrumented run: {wall_i:.2f} s",
        "",
        "| op group | calls | seconds | % of instrumented run |",
        "|---|---|---|---|",
    ]
    for name, sec in rows:
        lines.append(f"| {name} | {N.get(name, '')} | {sec:.2f} | {100 * sec / wall_i:.1f} |")
    mm = T["matmuls (q,k,v,o,gate,up,down)"]
    lines.append("")
    lines.append(
        f"matmuls alone: {fpt * tokens / mm / 1e9:.0f} GFLOP/s over processed tokens "
        f"(the last layer runs q, o and the MLP on one position only, so this overstates it slightly)"
    )
    print("\n".join(lines))
    out = Path(a.results)
    out.mkdir(parents=True, exist_ok=True)
    (out / "profile-run.json").write_text(
        json.dumps(
            {
                "n": len(sub),
                "model": a.model,
                "plain_seconds": wall,
                "instrumented_seconds": wall_i,
                "processed_tokens": tokens,
                "matmul_peak_gflops": peak,
                "flops_per_token": fpt,
                "groups": {k: {"seconds": v, "calls": N[k]} for k, v in T.items()},
            },
            indent=2,
        )
        + "\n"
    )


if __name__ == "__main__":
    main()
