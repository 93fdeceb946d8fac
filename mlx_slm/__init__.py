"""mlx-slm: fast, verified text classification with small language models on MLX."""

import logging as _logging
from importlib import import_module as _import_module

from .ground import blas as _blas  # noqa: F401  (must load an optimized CBLAS before mlx.core)
from .ground.version import __version__  # noqa: F401


class _NoTorchNotice(_logging.Filter):
    """Drop Transformers' "PyTorch was not found. Models won't be available ..." line: mlx-slm
    uses Transformers for tokenizers and configs only, and PyTorch is an optional extra (the
    reference path says so itself when it is needed). Every other Transformers message passes."""

    def filter(self, record: _logging.LogRecord) -> bool:
        return not str(record.msg).startswith("PyTorch was not found.")


_logging.getLogger("transformers").addFilter(_NoTorchNotice())

# Where each public name lives; imported on first use, so `import mlx_slm` stays light for the CLI's --help.
_HOMES = {
    "Calibration": "text.calibration",
    "CalibrationSpec": "text.calibration",
    "Classifier": "classifier",
    "Decider": "classifier.decider",
    "DecisionConfig": "text.decisions.settings",
    "DecisionRequest": "text.decisions.questions",
    "DecisionResult": "classifier.decider",
    "Embedder": "classifier",
    "Engine": "engine",
    "Head": "text.heads",
    "Prediction": "text.predictions",
    "Run": "classifier",
    "Stats": "text.predictions",
    "Task": "classifier",
    "train_head": "jobs.train",
}
__all__ = sorted(_HOMES)


def __dir__() -> list[str]:
    """The module's names with the public ones not imported yet (`dir(mlx_slm)`, `help(mlx_slm)` and
    completion list them; none is imported until it is used)."""
    return sorted(set(globals()) | set(_HOMES))


def __getattr__(name: str):
    if name in _HOMES:
        return getattr(_import_module(f".{_HOMES[name]}", __name__), name)
    raise AttributeError(f"module 'mlx_slm' has no attribute {name!r}")
