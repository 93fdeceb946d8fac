"""mlx-slm: fast, verified text classification with small language models on MLX."""

import logging as _logging

from . import _blas  # noqa: F401  (must load an optimized CBLAS before mlx.core)


class _NoTorchNotice(_logging.Filter):
    """Drop Transformers' "PyTorch was not found. Models won't be available ..." line: mlx-slm
    uses Transformers for tokenizers and configs only, and PyTorch is an optional extra (the
    reference path says so itself when it is needed). Every other Transformers message passes."""

    def filter(self, record: _logging.LogRecord) -> bool:
        return not str(record.msg).startswith("PyTorch was not found.")


_logging.getLogger("transformers").addFilter(_NoTorchNotice())

__version__ = "0.1.0"
__all__ = ["Calibration", "Classifier", "Engine", "Prediction", "Run", "Stats"]


def __getattr__(name: str):  # lazy: `import mlx_slm` stays light for the CLI's --help
    if name in __all__:
        from . import classifier

        return getattr(classifier, name)
    raise AttributeError(f"module 'mlx_slm' has no attribute {name!r}")
