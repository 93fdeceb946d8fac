"""mlx-slm: fast, verified text classification with small language models on MLX."""

from . import _blas  # noqa: F401  (must load an optimized CBLAS before mlx.core)

__version__ = "0.1.0"
