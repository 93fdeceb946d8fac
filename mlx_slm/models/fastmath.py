"""SiLU and attention for MLX's CPU backend, through numpy's vectorized float32 exp.

On the CPU, MLX's `exp`/`sigmoid` is a scalar loop: `silu(gate) * up` of one Qwen 0.5B
layer at 512 tokens took 40 ms there against 4 to 9 ms in numpy (which vectorizes exp),
and attention's softmax was most of attention's time.

numpy reads and writes MLX's CPU buffers without a copy (`np.asarray` of an evaluated
array is a writable view). So both functions work *in place* in a buffer that the
forward just made and nobody else holds (`up`, the attention scores), and hand that
same MLX array on: no new allocation, no copy back. Row blocks are small enough to
stay in the L2 cache across the several passes, and are split over the cores (up to four threads;
numpy releases the GIL in its loops). Attention runs whole in numpy, its small products
included, with one BLAS thread per worker (see `attention`).

A polynomial exp written in MLX ops and `mx.compile`d was also tried: 12 to 20 ms alone,
but as slow as the native op inside the whole forward (measured), so it is not used.

The model chooses these paths once, when it is loaded, only on the CPU in float32
(`mlx_slm.models.base.choose_ops`); on Metal and CUDA the native fused ops are the fast ones.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import math
import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import mlx.core as mx
import numpy as np

MASKED = -1e30  # additive bias of a masked key: finite (no inf - inf), and exp() of it is exactly 0
BLOCK_FLOATS = 32768  # ~128 KB per block: a few blocks fit in L2 during the passes
ATTENTION_BLOCK_FLOATS = 1 << 17  # scores per attention block (512 KB): measured best of 16K-128K
STACKED_ROWS = 224  # rows of a long prompt's score GEMMs (query heads x positions): measured best of 64-448
# The softmax in base 2: the scores are scaled by log2(e) with the 1/sqrt(D) they already take, so
# exp(x) is exp2(x log2 e), and numpy's float32 exp2 runs 2x faster than its exp (0.21 against
# 0.44 ms for 224 x 4,096 scores, measured) with a smaller error (1.0e-7 against 2.0e-7 relative,
# float64 the reference). The mask's bias holds 0 or MASKED, the same in either base.
LOG2E = 1.4426950408889634
MIN_PARALLEL_FLOATS = 1 << 18  # below ~1 MB a second thread costs more than it saves
ROOMY_FROM = 32 << 20  # MLX's CPU buffer cache limit by default: a forward needing more gets more (`room`)

_pool: ThreadPoolExecutor | None = None
_setters: list[Callable[[int], int]] | None = None


@functools.cache  # asked on every call of every kernel: os.cpu_count() costs ~25 us in a container
def _threads() -> int:
    # A process given a share of the cores (a Ray worker) is told so in its environment.
    for var in ("MLX_SLM_THREADS", "OPENBLAS_NUM_THREADS"):
        v = os.environ.get(var, "")
        if v.isdigit() and int(v) > 0:
            return min(4, int(v))
    return max(1, min(4, os.cpu_count() or 1))


def _blas_local_setters() -> list[Callable[[int], int]]:
    """`openblas_set_num_threads_local` of every OpenBLAS loaded in this process.

    It sets the BLAS thread count of the calling thread only (OpenBLAS >= 0.3.27), so our
    workers run numpy's matmuls on one thread each without touching anyone else's setting.
    Empty when numpy's BLAS is not such an OpenBLAS (then attention keeps its matmuls in MLX).
    """
    global _setters
    if _setters is None:
        _setters = []
        try:
            with open("/proc/self/maps") as f:
                paths = sorted({line.split()[-1] for line in f if "openblas" in line.lower() and "/" in line})
        except OSError:
            paths = []
        for path in paths:
            try:
                fn = ctypes.CDLL(path).openblas_set_num_threads_local
            except (OSError, AttributeError):
                continue
            fn.argtypes, fn.restype = [ctypes.c_int], ctypes.c_int
            _setters.append(fn)
    return _setters


def _worker_init() -> None:
    for fn in _blas_local_setters():
        fn(1)


def _get_pool() -> ThreadPoolExecutor:
    global _pool
    if _pool is None:
        _pool = ThreadPoolExecutor(_threads(), thread_name_prefix="mlx-slm-fastmath", initializer=_worker_init)
    return _pool


def _in_pool(
    spans: list[tuple[int, ...]], work: Callable[..., None], cost: Callable[[tuple[int, ...]], float] | None = None
) -> None:
    """Run work(*span) over the spans on the worker threads, in shares of equal total cost.

    Without `cost`, spans are taken as equal: contiguous, even runs. With it, the costliest
    span goes first to the least-loaded worker (longest-processing-time first).
    """
    t = min(_threads(), len(spans))
    if cost is None:
        per = -(-len(spans) // t)
        chunks = [spans[i : i + per] for i in range(0, len(spans), per)]
    else:
        chunks = [[] for _ in range(t)]
        load = [0.0] * t
        for sp in sorted(spans, key=cost, reverse=True):
            i = load.index(min(load))
            chunks[i].append(sp)
            load[i] += cost(sp)
    futures = [_get_pool().submit(lambda c=c: [work(*sp) for sp in c]) for c in chunks]
    for f in futures:
        f.result()


def _for_rows(n_rows: int, row_floats: int, work: Callable[[int, int], None]) -> None:
    """Call work(lo, hi) over row blocks, split across threads when the array is big enough."""
    block = max(1, BLOCK_FLOATS // max(1, row_floats))
    spans = [(lo, min(n_rows, lo + block)) for lo in range(0, n_rows, block)]
    t = _threads()
    if t == 1 or len(spans) < 2 or n_rows * row_floats < MIN_PARALLEL_FLOATS:
        for lo, hi in spans:
            work(lo, hi)
        return
    _in_pool(spans, work)


@contextlib.contextmanager
def room(tokens: int, keys: int, hidden: int, intermediate: int) -> Iterator[None]:
    """MLX's buffer cache made roomy enough for one long forward's buffers while it runs, then
    put back (which empties it).

    On the CPU MLX keeps at most 32 MiB of freed buffers for reuse; a long prompt's are larger (at
    4,096 tokens of Qwen2.5-0.5B: the MLP's 80 MB, the mask's 64 MB), so each layer got fresh
    memory from the kernel and zeroed it page by page: 1.25 million page faults and about 10 % of
    the forward's CPU time in the kernel (measured: 4.2 s of system time against 41 s of user
    time). Within this context the layers reuse the first layer's buffers (20 thousand faults at
    2,048 tokens instead of 490 thousand); after it the limit is what it was, so a server's
    memory does not keep a long prompt's buffers."""
    need = 4 * tokens * (3 * intermediate + 8 * hidden + keys)  # float32: the MLP's, the rows', the mask's
    prev = mx.set_cache_limit(need) if need > ROOMY_FROM else None
    if prev is not None and prev >= need:  # already roomy (set by the user): left as it was
        mx.set_cache_limit(prev)
        prev = None
    try:
        yield
    finally:
        _forward.memo = None  # the mask's figures (`_clear_starts`) live for one forward
        if prev is not None:
            mx.set_cache_limit(prev)


_forward = threading.local()  # per forward (a thread runs one at a time): what its mask's spans hold


def _clear_starts(bias: mx.array, bn: np.ndarray, S: int, Lq: int, rows: int) -> np.ndarray:
    """(B, spans): whether a span's queries see every key before the span's first query's own
    position (the bias is 0 there: no padding, window or tree masks them), so that only the
    span's diagonal block needs the bias added. Read once per forward's mask (every layer and
    KV head shares it), kept until the forward ends (`room`)."""
    memo = getattr(_forward, "memo", None)
    if memo is not None and memo[0] is bias and memo[1] == rows:
        return memo[2]
    starts = range(0, Lq, rows)
    clear = np.array(
        [[not bn[b, 0, i0 : min(Lq, i0 + rows), : S - Lq + i0].any() for i0 in starts] for b in range(bn.shape[0])]
    )
    _forward.memo = (bias, rows, clear)
    return clear


def additive_mask(mask: mx.array) -> mx.array:
    """Boolean mask -> float32 bias (0 where attended, MASKED elsewhere); built once per forward."""
    return mx.where(mask, 0.0, MASKED).astype(mx.float32)


def silu_mul(gate: mx.array, up: mx.array) -> mx.array:
    """silu(gate) * up = gate * up / (1 + exp(-gate)), written into `up`'s buffer.

    `up` must be a fresh array that nothing else reads (the MLP's own projection).
    """
    up = mx.contiguous(up)
    mx.eval(gate, up)
    g = np.asarray(gate).reshape(-1, gate.shape[-1])
    u = np.asarray(up).reshape(-1, up.shape[-1])

    def work(lo: int, hi: int) -> None:
        gg, uu = g[lo:hi], u[lo:hi]
        t = np.negative(gg)
        np.exp(t, out=t)
        t += 1.0
        uu *= gg
        uu /= t

    _for_rows(g.shape[0], g.shape[1], work)
    return up


GELU_TANH_C = -2.0 * math.sqrt(2.0 / math.pi)  # gelu_tanh(x) = x * sigmoid(2 sqrt(2/pi) (x + 0.044715 x^3))


def gelu_tanh_mul(gate: mx.array, up: mx.array) -> mx.array:
    """gelu_tanh(gate) * up (PyTorch's `gelu(approximate="tanh")`), written into `up`'s buffer.

    0.5 (1 + tanh(z)) = 1 / (1 + exp(-2z)), so the tanh form is computed through the same
    vectorized exp as `silu_mul`: gate * up / (1 + exp(-2 sqrt(2/pi) (gate + 0.044715 gate^3))).
    `up` must be a fresh array that nothing else reads.
    """
    up = mx.contiguous(up)
    mx.eval(gate, up)
    g = np.asarray(gate).reshape(-1, gate.shape[-1])
    u = np.asarray(up).reshape(-1, up.shape[-1])
    c = np.float32(GELU_TANH_C)

    def work(lo: int, hi: int) -> None:
        gg, uu = g[lo:hi], u[lo:hi]
        t = np.square(gg)
        t *= np.float32(0.044715)
        t += np.float32(1.0)
        t *= gg
        t *= c
        with np.errstate(over="ignore"):  # exp overflows to inf for very negative gates: the result is 0
            np.exp(t, out=t)
        t += np.float32(1.0)
        uu *= gg
        uu /= t

    _for_rows(g.shape[0], g.shape[1], work)
    return up


def attention(
    q: mx.array,
    k: mx.array,
    v: mx.array,
    scale: float,
    bias: mx.array,
    causal: bool = False,
    block: int = ATTENTION_BLOCK_FLOATS,
) -> mx.array:
    """Grouped-query attention with an additive mask, written into `q`'s buffer.

    q: (B, Hq, Lq, D), fresh (nothing else reads it: the forward's RoPE output);
    k, v: (B, Hkv, S, D); bias: (B, 1, Lq, S). `causal`: the caller promises that query i
    never sees a key after S - Lq + i (the bias masks them), so they may be skipped. The
    query heads that share a KV head are stacked along the rows (a free reshape), so K and
    V are never repeated. Every query sees at least itself, so no row is all-masked.

    With numpy's OpenBLAS this runs whole in numpy: blocks of (batch row, KV head) pairs
    (about `block` score floats each, so the softmax passes stay in cache) go to the worker
    threads, each doing scores = q k^T, the softmax and p v with a one-thread BLAS call. A
    longer prompt goes in spans of its query positions, the `rep` heads of one KV head stacked
    into one GEMM of about `STACKED_ROWS` rows; with `causal`, a span's products stop at its
    last query's key. One head's 16 rows per GEMM ran the products well under the machine's
    rate: stacked, one layer's attention at 4,096 tokens in Qwen2.5-0.5B's shape took 0.49 s
    instead of 0.77 s (measured side by side; `benchmarks.long_inputs` times the forward).
    MLX's batched matmul loops over these small products at well under the machine's
    rate, and numpy's BLAS called from the main thread leaves its own worker threads
    spinning against MLX's (measured 1.86x slower end to end), hence one BLAS thread per
    worker. The softmax's 1/sum is applied to the (Lq, D) output, not the (Lq, S) scores, and
    it runs in base 2 (`LOG2E`): the bias must hold only 0 and MASKED (`additive_mask`'s).
    Without a per-thread BLAS setting the products stay in MLX (`_attention_mlx`).
    """
    if not _blas_local_setters():
        return _attention_mlx(q, k, v, scale, bias)
    B, Hq, Lq, D = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    rep = Hq // Hkv
    q, k, v = mx.contiguous(q), mx.contiguous(k), mx.contiguous(v)
    mx.eval(q, k, v, bias)
    qn = np.asarray(q)
    if not qn.flags.c_contiguous:  # the output is written through this view: it must be q's buffer
        raise ValueError("attention: q must be a contiguous MLX array")
    qn = qn.reshape(B * Hkv, rep * Lq, D)
    kn = np.asarray(k).reshape(B * Hkv, S, D)
    vn = np.asarray(v).reshape(B * Hkv, S, D)
    bn = np.asarray(bias).reshape(B, 1, Lq, S)
    # A block holds whole batch rows (all their KV heads, one bias slice broadcast over them)
    # or, when one (row, KV head) unit is already too big (the scores grow with Lq x S), a span
    # of its query positions, the rep query heads of that KV head stacked into one matrix.
    unit = rep * Lq * S
    if unit <= block:
        per = block // unit
        per = (per // Hkv) * Hkv if per >= Hkv else max(d for d in range(1, per + 1) if Hkv % d == 0)
        spans = [(lo, min(B * Hkv, lo + per), 0, Lq) for lo in range(0, B * Hkv, per)]
        _in_pool(spans, lambda lo, hi, i0, i1: _whole_units(qn, kn, vn, bn, scale * LOG2E, Hkv, lo, hi))
        return q
    rows = stacked_rows(rep)
    spans = [(u, u + 1, i, min(Lq, i + rows)) for u in range(B * Hkv) for i in range(0, Lq, rows)]
    qh = qn.reshape(B * Hkv, rep, Lq, D)
    clear = _clear_starts(bias, bn, S, Lq, rows) if causal else None

    ones = np.ones(S, np.float32)  # the softmax's row sums as a matrix-vector product: 4x numpy's pairwise sum
    scale2 = scale * LOG2E

    def part(u: int, _: int, i0: int, i1: int) -> None:
        # With a causal mask the queries up to i1 need only the keys up to the cache plus i1:
        # the masked upper half of a long prompt's scores is never computed.
        se = S - Lq + i1 if causal else S
        # The bias where it can mask: the whole span, or (nothing masked before the span's first
        # query, as in one unpadded text) its diagonal block only: one pass over the scores saved.
        lo = S - Lq + i0 if clear is not None and clear[u // Hkv, i0 // rows] else 0
        qc = qh[u, :, i0:i1].reshape(rep * (i1 - i0), D) * scale2  # its own copy: one GEMM for the rep heads
        out = _span(qc, kn[u], vn[u], bn[u // Hkv, 0, i0:i1], rep, se, lo, ones[:se])
        qh[u, :, i0:i1] = out.reshape(rep, i1 - i0, D)  # these queries are consumed: their rows of q hold the output

    # Cost of a span ~ queries x keys it computes; the workers get equal shares.
    _in_pool(spans, part, cost=lambda sp: (sp[3] - sp[2]) * (S - Lq + sp[3] if causal else S))
    return q


def _span(
    qc: np.ndarray, k: np.ndarray, v: np.ndarray, b: np.ndarray, rep: int, se: int, lo: int, ones: np.ndarray
) -> np.ndarray:
    """One span's attention over keys :se: qc (rep x n, D), scaled into base 2 (`LOG2E`); k, v
    (S, D); b (n, S) the span's bias rows, added from key `lo` on; `ones` (se,). Returns
    (rep x n, D)."""
    s = qc @ k[:se].T  # (rep x queries, keys)
    s.reshape(rep, b.shape[0], se)[:, :, lo:] += b[:, lo:se]
    s -= s.max(axis=-1, keepdims=True)
    np.exp2(s, out=s)
    total = s @ ones
    out = s @ v[:se]
    out /= total[:, None]
    return out


def stacked_rows(rep: int) -> int:
    """Query positions per span of a long prompt's attention: with the `rep` query heads of one KV
    head stacked, about `STACKED_ROWS` rows per GEMM (a multiple of 8, at least 16)."""
    n = -(-STACKED_ROWS // rep)
    return max(16, -(-n // 8) * 8)


def _whole_units(
    qn: np.ndarray, kn: np.ndarray, vn: np.ndarray, bn: np.ndarray, scale: float, Hkv: int, lo: int, hi: int
) -> None:
    """Attention of whole (batch row, KV head) units lo:hi (a short prompt's), written into q's rows:
    qn (B*Hkv, rep*Lq, D), kn and vn (B*Hkv, S, D), bn (B, 1, Lq, S); `scale` into base 2 (`LOG2E`)."""
    Lq, S = bn.shape[2], bn.shape[3]
    qc = qn[lo:hi]  # (n, rep*Lq, D), a view into q
    qc *= scale
    s = np.matmul(qc, kn[lo:hi].swapaxes(-1, -2))  # scores, (n, rep*Lq, S)
    if hi - lo >= Hkv:
        s.reshape(-1, Hkv * (qc.shape[1] // Lq), Lq, S)[...] += bn[lo // Hkv : hi // Hkv]
    else:
        s.reshape(-1, Lq, S)[...] += bn[lo // Hkv]
    s -= s.max(axis=-1, keepdims=True)
    np.exp2(s, out=s)
    total = s.sum(axis=-1, keepdims=True)
    np.matmul(s, vn[lo:hi], out=qc)  # q of these rows is consumed: overwrite it
    qc /= total


def _attention_mlx(q: mx.array, k: mx.array, v: mx.array, scale: float, bias: mx.array) -> mx.array:
    """The same, with the two products in MLX and only the softmax in numpy (in place)."""
    B, Hq, Lq, D = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    rep = Hq // Hkv
    scores = (q * scale).reshape(B, Hkv, rep * Lq, D) @ k.swapaxes(-1, -2)  # (B, Hkv, rep*Lq, S), fresh
    mx.eval(scores, bias)
    s = np.asarray(scores).reshape(B * Hkv, rep, Lq, S)
    bn = np.asarray(bias).reshape(B, Lq, S)

    def work(lo: int, hi: int) -> None:
        for r in range(lo, hi):  # one (batch row, KV head) per step: rep x Lq x S floats
            blk = s[r]
            blk += bn[r // Hkv]
            blk -= blk.max(axis=-1, keepdims=True)
            np.exp(blk, out=blk)
            blk /= blk.sum(axis=-1, keepdims=True)

    _for_rows(B * Hkv, rep * Lq * S, work)
    return (scores @ v).reshape(B, Hq, Lq, D)
