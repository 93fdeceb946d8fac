"""The optimized CBLAS loaded before `mlx.core` (`ground/blas.py`): the preload's environment and the
GEMM peak `mlx-slm doctor` prints."""

import mlx_slm  # noqa: F401


def test_openblas_thread_timeout_is_not_left_in_the_environment():
    """The preload sets OPENBLAS_THREAD_TIMEOUT only while MLX's OpenBLAS loads; children must not inherit it."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_THREAD_TIMEOUT"}
    code = "import os, mlx_slm; print(os.environ.get('OPENBLAS_THREAD_TIMEOUT'))"

    def seen(env: dict[str, str]) -> str:
        return subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        ).stdout.strip()

    assert seen(env) == "None"
    assert seen({**env, "OPENBLAS_THREAD_TIMEOUT": "20"}) == "20"  # a user's own value is kept


def test_matmul_peak_measures_mlx_and_numpy():
    from mlx_slm.ground import blas

    peak = blas.matmul_peak(sizes=(64,), reps=1)
    assert set(peak) == {"mlx", "numpy"} and all(v > 0 for v in peak.values())


def test_the_preload_says_what_it_loaded_or_why_not():
    """On Linux it loaded a CBLAS, or says why not (a note `mlx-slm doctor` turns into a warning with the fix)."""
    import os
    import sys

    from mlx_slm.ground import blas

    if sys.platform == "linux" and blas.LOADED is None and os.environ.get("MLX_SLM_BLAS") != "none":
        assert blas.PROBLEM and "apt-get install libopenblas0-pthread" in blas.FIX
    else:
        assert blas.PROBLEM is None
