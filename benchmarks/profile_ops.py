"""Where one layer's time goes: each op of one decoder layer, timed alone.

    python benchmarks/profile_ops.py [--model qwen2.5-coder-0.5b] [--tokens 512] [--batch 4]

Times (median of several runs, ms) each matmul group, the MLP activation (native
`silu(g) * u` against `fastmath.silu_mul`), attention (`mx.fast.scaled_dot_product_attention`
against `fastmath.attention`), the norms and RoPE, on the real layer-0 weights in the
compute dtype. Writes a markdown table to stdout and JSON to the results folder.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn

import mlx_slm  # noqa: F401
from mlx_slm.models import FASTMATH, NATIVE, build_mask, fastmath, load_model
from mlx_slm.models.base import Context
from mlx_slm.weights.sources import materialise


def timeit(f, reps: int = 7) -> float:
    mx.eval(f())
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        mx.eval(f())
        ts.append(time.perf_counter() - t)
    return 1000 * statistics.median(ts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--tokens", type=int, default=512, help="tokens per batch (batch x length)")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--results", default="benchmarks/results")
    a = ap.parse_args()
    m = load_model(materialise(a.model))
    layer = m.layers[0]
    at = layer.self_attn
    B, L = a.batch, a.tokens // a.batch
    d = m.args.hidden_size
    x = mx.random.normal((B, L, d)).astype(m.head_weight().dtype)
    mask = build_mask(mx.ones((B, L), dtype=mx.bool_), None, 0, last_only=False)
    offs = mx.zeros((B,), dtype=mx.int32)
    h = layer.input_layernorm(x)
    q = at.q_proj(h).reshape(B, L, at.n_heads, -1).transpose(0, 2, 1, 3)
    k = at.k_proj(h).reshape(B, L, at.n_kv_heads, -1).transpose(0, 2, 1, 3)
    v = at.v_proj(h).reshape(B, L, at.n_kv_heads, -1).transpose(0, 2, 1, 3)
    g, u = layer.mlp.gate_proj(h), layer.mlp.up_proj(h)
    act = nn.silu(g) * u
    mx.eval(h, q, k, v, g, u, act)
    ctx = {}
    for ops in (NATIVE, FASTMATH):  # one forward's context (masks in each ops' form) per ops
        m.ops = ops
        ctx[ops.name] = Context(m, mx.ones((B, L), dtype=mx.bool_), None, 0, offs, False)
    rows = {
        "q,k,v,o matmuls": timeit(lambda: [at.q_proj(h), at.k_proj(h), at.v_proj(h), at.o_proj(h)]),
        "gate,up,down matmuls": timeit(
            lambda: [layer.mlp.gate_proj(h), layer.mlp.up_proj(h), layer.mlp.down_proj(act)]
        ),
        "silu(g)*u native": timeit(lambda: nn.silu(g) * u),
        "silu(g)*u numpy (fastmath)": timeit(lambda: fastmath.silu_mul(g, u)),
        "attention mx.fast.sdpa": timeit(
            lambda: mx.fast.scaled_dot_product_attention(q, k, v, scale=at.scale, mask=mask)
        ),
        "attention numpy softmax (fastmath)": timeit(
            lambda: fastmath.attention(q, k, v, at.scale, fastmath.additive_mask(mask))
        ),
        "2x rms_norm": timeit(lambda: [layer.input_layernorm(x), layer.post_attention_layernorm(x)]),
        "rope q,k": timeit(lambda: [at._rope(q, offs), at._rope(k, offs)]),
        "mask build": timeit(lambda: build_mask(mx.ones((B, L), dtype=mx.bool_), None, 0, last_only=False)),
        "whole layer, native ops": timeit(lambda: layer(x, ctx[NATIVE.name], None, False)[0]),
        "whole layer, fastmath (default on CPU)": timeit(lambda: layer(x, ctx[FASTMATH.name], None, False)[0]),
    }
    flops = (
        2
        * B
        * L
        * (sum(p.size for n, p in nn.utils.tree_flatten(layer.parameters()) if n.endswith("weight") and p.ndim == 2))
    )
    rows_md = ["| op | ms |", "|---|---|"] + [f"| {k} | {v:.1f} |" for k, v in rows.items()]
    mm = rows["q,k,v,o matmuls"] + rows["gate,up,down matmuls"]
    print(f"one layer, {B} x {L} tokens, {m.head_weight().dtype}, {mx.default_device()}")
    print("\n".join(rows_md))
    print(f"\nmatmuls: {flops / mm / 1e6:.0f} GFLOP/s")
    out = Path(a.results)
    out.mkdir(parents=True, exist_ok=True)
    (out / "profile-ops.json").write_text(
        json.dumps({"batch": B, "length": L, "ms": rows, "matmul_gflops": flops / mm / 1e6}, indent=2) + "\n"
    )


if __name__ == "__main__":
    main()
