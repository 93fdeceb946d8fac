"""The CPU fast paths (numpy, in place, threaded) against MLX's native ops."""

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

import mlx_slm  # noqa: F401
from mlx_slm.models import FASTMATH, build_mask, fastmath


@pytest.mark.parametrize("rows", [3, 700])  # 700 x 512 floats crosses the threading threshold
def test_silu_mul_matches_native_and_writes_only_up(rows):
    g = mx.random.normal((rows, 512), key=mx.random.key(1)) * 4
    u = mx.random.normal((rows, 512), key=mx.random.key(2))
    want = nn.silu(g) * u
    g_before = np.array(g)
    got = fastmath.silu_mul(g, u * 1.0)  # a fresh `up`, as the MLP hands it over
    np.testing.assert_allclose(np.array(got), np.array(want), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(np.array(g), g_before)  # the gate is read, never written


@pytest.mark.parametrize("rows", [3, 700])
def test_gelu_tanh_mul_matches_native_and_writes_only_up(rows):
    """PyTorch's gelu(approximate="tanh") gate, through exp: against MLX's gelu_approx."""
    g = mx.random.normal((rows, 512), key=mx.random.key(11)) * 4
    g = mx.concatenate([g, mx.full((1, 512), -200.0), mx.full((1, 512), 200.0)])  # exp over/underflow
    u = mx.random.normal((rows + 2, 512), key=mx.random.key(12))
    want = nn.gelu_approx(g) * u
    g_before = np.array(g)
    got = fastmath.gelu_tanh_mul(g, u * 1.0)
    np.testing.assert_allclose(np.array(got), np.array(want), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(np.array(g), g_before)


@pytest.mark.parametrize("B,L,C", [(1, 5, 0), (3, 120, 27), (5, 16, 27)])
# 6000: one (row, KV head) per block, or 16 queries of it; 1: 16 queries per block
@pytest.mark.parametrize("block", [fastmath.ATTENTION_BLOCK_FLOATS, 6000, 1])
@pytest.mark.parametrize("impl", ["numpy", "numpy-causal", "mlx"])
def test_attention_matches_sdpa_with_padding_and_prefix(B, L, C, block, impl):
    if impl == "mlx" and block != fastmath.ATTENTION_BLOCK_FLOATS:
        pytest.skip("the MLX-products path has no blocks")
    Hq, Hkv, D = 14, 2, 64
    q = mx.random.normal((B, Hq, L, D), key=mx.random.key(3))
    k = mx.random.normal((B, Hkv, C + L, D), key=mx.random.key(4))
    v = mx.random.normal((B, Hkv, C + L, D), key=mx.random.key(5))
    real = np.ones((B, L), dtype=bool)
    real[0, : L // 3] = False  # left padding on the first row
    mask = build_mask(mx.array(real), None, C, last_only=False)
    want = mx.fast.scaled_dot_product_attention(q, k, v, scale=D**-0.5, mask=mask)
    mx.eval(want)
    k_before, v_before = np.array(k), np.array(v)
    bias = fastmath.additive_mask(mask)
    if impl.startswith("numpy"):
        if not fastmath._blas_local_setters():
            pytest.skip("numpy's BLAS is not an OpenBLAS with a per-thread setting: fastmath keeps the products in MLX")
        # a fresh q, as RoPE hands it over; "causal" skips the keys after each query block
        got = fastmath.attention(q * 1.0, k, v, D**-0.5, bias, causal=impl.endswith("causal"), block=block)
    else:
        got = fastmath._attention_mlx(q, k, v, D**-0.5, bias)
    np.testing.assert_allclose(np.array(got), np.array(want), rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(np.array(k), k_before)  # keys and values are read, never written
    np.testing.assert_array_equal(np.array(v), v_before)


def test_attention_last_position_only():
    """The last layer's shape: one query per row against the whole cache."""
    B, Hq, Hkv, S, D = 4, 14, 2, 40, 64
    q = mx.random.normal((B, Hq, 1, D), key=mx.random.key(6))
    k = mx.random.normal((B, Hkv, S, D), key=mx.random.key(7))
    v = mx.random.normal((B, Hkv, S, D), key=mx.random.key(8))
    real = np.ones((B, S), dtype=bool)
    real[1, :9] = False
    mask = build_mask(mx.array(real), None, 0, last_only=True)
    want = mx.fast.scaled_dot_product_attention(q, k, v, scale=D**-0.5, mask=mask)
    mx.eval(want)
    got = fastmath.attention(q * 1.0, k, v, D**-0.5, fastmath.additive_mask(mask))
    np.testing.assert_allclose(np.array(got), np.array(want), rtol=1e-4, atol=1e-5)


# ----------------------------------------------------------------------------- long prompts: query spans


def test_stacked_rows_fill_a_gemm_of_about_224_rows():
    """The rep query heads of one KV head stacked: about `STACKED_ROWS` rows per GEMM, a multiple of 8."""
    assert [fastmath.stacked_rows(r) for r in (1, 2, 3, 7, 14, 64)] == [224, 112, 80, 32, 16, 16]


class _Spans(FASTMATH.__class__):
    """Every attention in query spans (block 1: no whole unit fits)."""

    def attention(self, q, k, v, scale, mask):
        return fastmath.attention(q, k, v, scale, mask, causal=True, block=1)


class _Whole(FASTMATH.__class__):
    """Every attention whole: one block per (row, KV head), every score of the square computed."""

    def attention(self, q, k, v, scale, mask):
        return fastmath.attention(q, k, v, scale, mask, causal=True, block=1 << 62)


@pytest.mark.parametrize("arch", ["qwen2", "llama", "qwen3", "gemma3"])
def test_query_spans_equal_the_whole_attention_in_the_forward(tiny_arch, arch, monkeypatch):
    """A long prompt's attention in query spans (each stopping at its last query's key) gives the
    whole attention's hidden states and KV, within float32 tolerance, through every mask the
    forward builds: left padding, per-row RoPE offsets, a shared prefix (broadcast), a cache with
    padding inside (`cache_mask`), a tree (question branches: explicit positions, each token
    seeing its ancestors), sliding windows (qwen3, gemma3), and the last layer's last position."""
    if not fastmath._blas_local_setters():
        pytest.skip("numpy's BLAS is not an OpenBLAS with a per-thread setting: fastmath keeps the products in MLX")
    from mlx_slm.models import NATIVE, Tree, load_model
    from tests.forward_parity import padded

    monkeypatch.setattr(fastmath, "STACKED_ROWS", 16)  # spans of 16 query positions: several per row here
    m = load_model(tiny_arch.mlx(arch))
    rng = np.random.default_rng(7)
    prefix = rng.integers(5, 300, 9).tolist()
    rows = [rng.integers(5, 300, n).tolist() for n in (70, 41, 3)]
    _, kv = m(mx.array([prefix]))
    ids, mask, offs = padded(rows, 0, cache_len=len(prefix))
    B, L = ids.shape
    cache_mask = mx.concatenate([mx.ones((B, len(prefix)), dtype=mx.bool_), mask], axis=1)
    # two branches of 20 tokens after each row: each token sees the row and its own branch's earlier tokens
    T = 40
    visible = np.tril(np.ones((T, T), bool))
    visible[20:, :20] = False
    positions = (np.array(offs)[:, None] + L + np.concatenate([np.arange(20), np.arange(20)])[None]).astype(np.int32)
    branch = mx.array(rng.integers(5, 300, (B, T)))

    def run(ops):
        m.ops = ops
        try:
            h, kv2 = m(ids, mask, offs, cache=kv, last_only=False)
            last, _ = m(ids, mask, offs, cache=kv)
            t, _ = m(branch, None, None, cache=kv2, cache_mask=cache_mask, last_only=False,
                     tree=Tree(mx.array(positions), mx.array(visible)))  # fmt: skip
            mx.eval(h, last, t, kv2)
            return [np.array(x) for x in (h, last, t, kv2[-1][0], kv2[-1][1])]
        finally:
            m.ops = FASTMATH

    spans, whole, native = run(_Spans()), run(_Whole()), run(NATIVE)
    real = np.array(mask)
    for name, a, b, c in zip(("hidden", "last", "branches", "keys", "values"), spans, whole, native):
        if name == "hidden":  # a padding position's state is no real token's: compare the real ones
            a, b, c = a[real], b[real], c[real]
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=2e-5, err_msg=f"{arch}: {name}, spans vs whole")
        np.testing.assert_allclose(a, c, rtol=1e-4, atol=5e-5, err_msg=f"{arch}: {name}, spans vs MLX's own")


def test_room_raises_the_buffer_cache_for_a_long_forward_and_puts_it_back():
    """A long forward gets a buffer cache roomy enough to reuse its layers' buffers; afterwards the
    limit is what it was (a server keeps no long prompt's buffers), and a user's roomier limit stays."""
    before = mx.set_cache_limit(fastmath.ROOMY_FROM)
    try:
        with fastmath.room(4096, 4096, 896, 4864):
            inside = mx.set_cache_limit(0)
            mx.set_cache_limit(inside)
        assert inside > fastmath.ROOMY_FROM
        assert mx.set_cache_limit(fastmath.ROOMY_FROM) == fastmath.ROOMY_FROM
        with fastmath.room(16, 16, 896, 4864):  # short: nothing changes
            assert mx.set_cache_limit(fastmath.ROOMY_FROM) == fastmath.ROOMY_FROM
        mx.set_cache_limit(1 << 40)
        with fastmath.room(4096, 4096, 896, 4864):
            assert mx.set_cache_limit(1 << 40) == 1 << 40
        assert mx.set_cache_limit(before) == 1 << 40
    finally:
        mx.set_cache_limit(before)
