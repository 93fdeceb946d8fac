"""The CPU fast paths (numpy, in place, threaded) against MLX's native ops."""

import mlx_slm  # noqa: F401
import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

from mlx_slm import fastmath
from mlx_slm.model import build_mask


@pytest.mark.parametrize("rows", [3, 700])  # 700 x 512 floats crosses the threading threshold
def test_silu_mul_matches_native_and_writes_only_up(rows):
    g = mx.random.normal((rows, 512), key=mx.random.key(1)) * 4
    u = mx.random.normal((rows, 512), key=mx.random.key(2))
    want = nn.silu(g) * u
    g_before = np.array(g)
    got = fastmath.silu_mul(g, u * 1.0)  # a fresh `up`, as the MLP hands it over
    np.testing.assert_allclose(np.array(got), np.array(want), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(np.array(g), g_before)  # the gate is read, never written


@pytest.mark.parametrize("B,L,C", [(1, 5, 0), (3, 120, 27)])  # the second runs the threaded path
def test_attention_matches_sdpa_with_padding_and_prefix(B, L, C):
    Hq, Hkv, D = 14, 2, 64
    q = mx.random.normal((B, Hq, L, D), key=mx.random.key(3))
    k = mx.random.normal((B, Hkv, C + L, D), key=mx.random.key(4))
    v = mx.random.normal((B, Hkv, C + L, D), key=mx.random.key(5))
    real = np.ones((B, L), dtype=bool)
    real[0, : L // 3] = False  # left padding on the first row
    mask = build_mask(mx.array(real), None, C, last_only=False)
    want = mx.fast.scaled_dot_product_attention(q, k, v, scale=D**-0.5, mask=mask)
    got = fastmath.attention(q, k, v, D**-0.5, fastmath.additive_mask(mask))
    np.testing.assert_allclose(np.array(got), np.array(want), rtol=1e-4, atol=1e-5)
