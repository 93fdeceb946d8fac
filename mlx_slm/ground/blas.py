"""Load an optimized CBLAS before `mlx.core` on Linux.

MLX's Linux wheel links a bundled *reference* BLAS: a float32 matmul runs at a few
GFLOP/s, about 30x below what the same CPU does with OpenBLAS. The shared library
resolves `cblas_sgemm` through the global symbol scope first, so putting an
optimized CBLAS there (``RTLD_GLOBAL``) before `mlx.core` is loaded makes MLX use it.

This module must be imported before anything imports `mlx.core`; `mlx_slm/__init__.py`
imports it first. It never raises: a missing library only leaves a note that
`mlx-slm doctor` and the classifier turn into a warning with the fix.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import platform
import sys
import time

#: Path of the CBLAS library we loaded, or None.
LOADED: str | None = None
#: Why nothing was loaded (None when something was, or when not needed).
PROBLEM: str | None = None

FIX = (
    "install an optimized CBLAS: `sudo apt-get install libopenblas0-pthread` on Debian/Ubuntu "
    "(or point MLX_SLM_BLAS at a libopenblas.so / libblis.so / libmkl_rt.so)"
)


def _candidates() -> list[str]:
    env = os.environ.get("MLX_SLM_BLAS")
    if env:
        return [env]
    arch = platform.machine()
    found: list[str] = []
    for pattern in (
        f"/usr/lib/{arch}-linux-gnu/openblas-pthread/libopenblas.so.0",
        f"/usr/lib/{arch}-linux-gnu/openblas-openmp/libopenblas.so.0",
        f"/usr/lib/{arch}-linux-gnu/libopenblas.so.0",
        "/usr/lib64/libopenblas.so.0",
        "/usr/lib64/libopenblasp.so.0",
        "/usr/lib/libopenblas.so.0",
        f"/usr/lib/{arch}-linux-gnu/blis-pthread/libblis.so.4",
        f"/usr/lib/{arch}-linux-gnu/libmkl_rt.so",
    ):
        found.extend(sorted(glob.glob(pattern)))
    name = ctypes.util.find_library("openblas")
    if name:
        found.append(name)
    return found


def _load() -> None:
    global LOADED, PROBLEM
    if sys.platform != "linux" or os.environ.get("MLX_SLM_BLAS") == "none":
        return
    if "mlx.core" in sys.modules:
        PROBLEM = "mlx.core was imported before mlx_slm, so its reference BLAS is already bound"
        return
    # OpenBLAS reads this once, when it loads: how long its idle workers spin before they
    # sleep (default 2^28 cycles, ~0.1 s). MLX calls a matmul every few ms, so they would
    # never sleep, and between matmuls they take the cores from the numpy SiLU and
    # attention (fastmath): measured 6.8 -> 4.1 ms for one attention call after a matmul.
    # Set only while our library loads (a user's value wins), so nothing else inherits it.
    own_timeout = "OPENBLAS_THREAD_TIMEOUT" not in os.environ
    if own_timeout:
        os.environ["OPENBLAS_THREAD_TIMEOUT"] = "4"  # 2^4 cycles: the minimum
    try:
        for path in _candidates():
            try:
                lib = ctypes.CDLL(path, mode=os.RTLD_GLOBAL)
                lib.cblas_sgemm  # noqa: B018 - it must be a CBLAS, not only a Fortran BLAS
            except (OSError, AttributeError):
                continue
            LOADED = path
            return
    finally:
        if own_timeout:
            del os.environ["OPENBLAS_THREAD_TIMEOUT"]
    PROBLEM = "no optimized CBLAS found; MLX uses its bundled reference BLAS"


_load()


def matmul_peak(sizes: tuple[int, ...] = (1024, 2048), reps: int = 4) -> dict[str, float]:
    """Best float32 GEMM rate (GFLOP/s) of MLX and of numpy on this machine.

    What `mlx-slm doctor` prints and what the benchmark divides by: one routine, so the two
    never disagree about the peak."""

    import mlx.core as mx  # lazy: after the BLAS preload
    import numpy as np  # lazy: after the BLAS preload

    best = {"mlx": 0.0, "numpy": 0.0}
    for n in sizes:
        a, b = mx.random.normal((n, n)), mx.random.normal((n, n))
        mx.eval(a @ b)
        t = time.perf_counter()
        for _ in range(reps):
            mx.eval(a @ b)
        best["mlx"] = max(best["mlx"], 2 * reps * n**3 / (time.perf_counter() - t) / 1e9)
        an, bn = np.asarray(a), np.asarray(b)
        an @ bn
        t = time.perf_counter()
        for _ in range(reps):
            an @ bn
        best["numpy"] = max(best["numpy"], 2 * reps * n**3 / (time.perf_counter() - t) / 1e9)
    return best
