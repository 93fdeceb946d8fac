"""Benchmark runner: `python benchmarks/run.py --help` (the same as `mlx-slm bench` in a checkout)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the checkout: `benchmarks` and `mlx_slm`

import mlx_slm  # noqa: E402,F401  (optimized BLAS before mlx.core)
from benchmarks.harness import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
