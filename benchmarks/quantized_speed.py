"""The forward of one MLX-quantized directory, dequantized at load against kept packed.

    mlx-slm convert smollm2-135m --out /tmp/smol-q4 --quantize 4
    python benchmarks/quantized_speed.py /tmp/smol-q4 [--batch 8] [--tokens 128] [--reps 3] [--float16]

Times (best of `--reps`, after one warm-up) the forward (hidden states at the last position,
no head) of a `batch x tokens` batch on MLX's default device: weights dequantized to float32
at load (the CPU default), kept packed with float32 activations (`--keep-quantized`), and,
with `--float16`, kept packed with float16 activations (very slow on the CPU: use a few tokens).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import mlx_slm  # noqa: F401  (the optimized BLAS before mlx.core)

# isort: split
import mlx.core as mx

from mlx_slm.models import flops_per_token, load_model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("path", type=Path)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--float16", action="store_true", help="Also time packed weights with float16 activations.")
    a = ap.parse_args()
    fpt = flops_per_token(json.loads((a.path / "config.json").read_text()))
    B, L = a.batch, a.tokens
    ids = mx.array([[(i * 7 + j * 13) % 40000 + 10 for j in range(L)] for i in range(B)], dtype=mx.int32)
    runs = [("dequantized, float32", dict(keep_quantized=False)), ("kept packed, float32", dict(keep_quantized=True))]
    if a.float16:
        runs.append(("kept packed, float16", dict(keep_quantized=True, dtype=mx.float16)))
    print(f"{a.path}: {B} x {L} tokens, {mx.default_device()}")
    for label, kw in runs:
        m = load_model(a.path, **kw)
        mx.eval(m(ids)[0])
        best = float("inf")
        for _ in range(a.reps):
            t = time.perf_counter()
            mx.eval(m(ids)[0])
            best = min(best, time.perf_counter() - t)
        print(
            f"  {label:22s} {best:7.2f} s  {B * L / best:8,.0f} tokens/s  {fpt * B * L / best / 1e9:6.1f} GFLOP/s",
            flush=True,
        )


if __name__ == "__main__":
    main()
