"""mlx-slm: fast, verified text classification with small language models on MLX."""

from . import _blas  # noqa: F401  (must load an optimized CBLAS before mlx.core)

__version__ = "0.1.0"
__all__ = ["Calibration", "Classifier", "Engine", "Prediction", "Run", "Stats"]


def __getattr__(name: str):  # lazy: `import mlx_slm` stays light for the CLI's --help
    if name in __all__:
        from . import classifier

        return getattr(classifier, name)
    raise AttributeError(f"module 'mlx_slm' has no attribute {name!r}")
