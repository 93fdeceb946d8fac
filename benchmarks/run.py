"""Benchmark runner: `python benchmarks/run.py --help` (same as `mlx-slm bench`)."""

import sys

import mlx_slm  # noqa: F401  (optimized BLAS before mlx.core)
from mlx_slm.bench import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
