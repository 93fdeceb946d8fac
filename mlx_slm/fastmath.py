"""SiLU and softmax for MLX's CPU backend, through numpy's vectorized float32 exp.

On the CPU, MLX's `exp`/`sigmoid` is a scalar loop: `silu(gate) * up` of one Qwen 0.5B
layer at 512 tokens took 40 ms there against 4 to 9 ms in numpy (which vectorizes exp),
and attention's softmax was most of attention's time. numpy reads MLX's CPU buffers
without a copy, so each of these costs one `mx.eval` and one copy back.

A polynomial exp written in MLX ops and `mx.compile`d was also tried: 12 to 20 ms alone,
but as slow as the native op inside the whole forward (measured), so it is not used.

The model chooses these paths only on the CPU in float32 (`Model.use_cpu_math`); on
Metal and CUDA the native fused ops are the fast ones.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

MASKED = -1e30  # additive bias of a masked key: finite (no inf - inf), and exp() of it is exactly 0


def additive_mask(mask: mx.array) -> mx.array:
    """Boolean mask -> float32 bias (0 where attended, MASKED elsewhere); built once per forward."""
    return mx.where(mask, 0.0, MASKED).astype(mx.float32)


def silu_mul(gate: mx.array, up: mx.array) -> mx.array:
    """silu(gate) * up = gate * up / (1 + exp(-gate)), in numpy (evaluates its inputs)."""
    mx.eval(gate, up)
    g = np.asarray(gate)
    t = np.negative(g)
    np.exp(t, out=t)
    t += 1.0
    np.divide(g, t, out=t)
    t *= np.asarray(up)
    return mx.array(t)


def attention(q: mx.array, k: mx.array, v: mx.array, scale: float, bias: mx.array) -> mx.array:
    """Grouped-query attention with an additive mask; matmuls in MLX, softmax in numpy.

    q: (B, Hq, Lq, D); k, v: (B, Hkv, S, D); bias: (B, 1, Lq, S). Query heads are grouped
    over their shared KV head by a reshape, so K and V are never repeated. Every query
    sees at least itself, so no row is all-masked.
    """
    B, Hq, Lq, D = q.shape
    Hkv = k.shape[1]
    q = (q * scale).reshape(B, Hkv, Hq // Hkv, Lq, D)
    scores = q @ k[:, :, None].swapaxes(-1, -2) + bias[:, :, None]  # (B, Hkv, rep, Lq, S)
    mx.eval(scores)
    s = np.array(scores)  # a private copy to work in place
    s -= s.max(axis=-1, keepdims=True)
    np.exp(s, out=s)
    s /= s.sum(axis=-1, keepdims=True)
    return (mx.array(s) @ v[:, :, None]).reshape(B, Hq, Lq, D)
