"""Elementwise math for MLX's CPU backend, where `exp` is a scalar loop.

On the CPU, MLX's `exp`/`sigmoid` cost about 30x a multiply per element, so the MLP's
`silu(gate) * up` and the softmax inside attention take half as long as the matmuls
around them. Here `exp` is rebuilt from ops that vectorize: range reduction by ln 2,
a degree-7 polynomial, and the power of two put into the float's exponent bits with
an integer shift. `mx.compile` fuses each function into one loop. Relative error is
about 1e-7, far inside the 1e-3 logit tolerance of the parity check.

These paths are chosen by device (`model.py`): on Metal and CUDA the native ops are
already fast, and the model uses them.
"""

from __future__ import annotations

import mlx.core as mx

_LOG2E = 1.4426950408889634
_LN2_HI = 0.693145751953125  # ln 2 split in two, so n * ln2 is exact for |n| < 2^11
_LN2_LO = 1.4286068203094173e-06
_C = [1.0 / f for f in (1, 1, 2, 6, 24, 120, 720, 5040)]  # 1/k!, k = 0..7


def exp(x: mx.array) -> mx.array:
    """float32 exp(x) from vectorizable ops; exactly 0 below -87 (masked scores), clipped above 88."""
    xc = mx.clip(x, -87.0, 88.0)
    n = mx.floor(xc * _LOG2E + 0.5)
    r = (xc - n * _LN2_HI) - n * _LN2_LO
    p = _C[7]
    for c in reversed(_C[:7]):
        p = p * r + c
    two_n = mx.left_shift(n.astype(mx.int32) + 127, 23).view(mx.float32)
    return mx.where(x < -87.0, 0.0, p * two_n)


@mx.compile
def silu_mul(gate: mx.array, up: mx.array) -> mx.array:
    """silu(gate) * up = gate * up / (1 + exp(-gate))."""
    return gate * up / (1.0 + exp(-gate))


MASKED = -1e30  # additive bias of a masked key: exp() of it is exactly 0, and it is finite (no inf - inf)


def additive_mask(mask: mx.array) -> mx.array:
    """Boolean mask -> float32 bias (0 where attended, MASKED elsewhere); built once per forward."""
    return mx.where(mask, 0.0, MASKED).astype(mx.float32)


@mx.compile
def _softmax(scores: mx.array, bias: mx.array) -> mx.array:
    s = scores + bias
    e = exp(s - mx.max(s, axis=-1, keepdims=True))
    return e / mx.sum(e, axis=-1, keepdims=True)


def attention(q: mx.array, k: mx.array, v: mx.array, scale: float, bias: mx.array) -> mx.array:
    """Grouped-query attention with an additive mask, softmax on the fast exp.

    q: (B, Hq, Lq, D); k, v: (B, Hkv, S, D); bias: (B, 1, Lq, S). Query heads are
    grouped over their shared KV head by a reshape, so K and V are never repeated.
    Every query sees at least itself, so no row is all-masked.
    """
    B, Hq, Lq, D = q.shape
    Hkv = k.shape[1]
    q = (q * scale).reshape(B, Hkv, Hq // Hkv, Lq, D)
    scores = q @ k[:, :, None].swapaxes(-1, -2)  # (B, Hkv, rep, Lq, S)
    w = _softmax(scores, bias[:, :, None])
    return (w @ v[:, :, None]).reshape(B, Hq, Lq, D)
