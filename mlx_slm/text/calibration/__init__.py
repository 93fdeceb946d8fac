"""Post-hoc calibration of label probabilities: undo a small model's label bias.

Small models prefer some labels whatever the input says. On this project's workload the
raw argmax was right 58.8 % of the time; dividing each item's label probabilities by
their mean over the input (batch calibration, Zhou et al. 2023) gave 87.8 %. The fix is
cheap because the bias is mostly one per-label offset in log space.

Every method here therefore has one form, applied to an (n, k) array of label
log-probabilities (or raw label scores: each row is normalized first, which changes
nothing below since per-row constants cancel):

    calibrated = log_softmax(log_probs / T - log_prior)

and differs only in how `log_prior` (one offset per label) and `T` are estimated:

- ``none``:  zeros, T = 1 (the raw model).
- ``batch``: log of the mean predicted distribution over the input (Zhou et al. 2023).
  Needs no labels, but assumes the input's classes are balanced: on an input skewed
  toward the label the model already favours, it removes the real skew along with the
  bias and can hurt.
- ``em``:    Saerens, Latinne & Decaestecker (2002) EM: estimates the input's label prior
  by maximum likelihood and moves the posteriors from the prior the model's posteriors
  assume (the *base*) to the estimated one. The principled fix for label shift, but only
  as good as the base: see `fit_em`.
- ``fit``:   offsets (and optionally T) fitted to a labelled sample by minimizing the
  log-loss of the gold labels, with cross-validated figures in `info`.

Streams: batch calibration needs the whole input's mean. A stream's caller buffers the
first `DEFAULT_WARMUP` items, calls `fit_batch` on them, and applies that calibrator to
the buffered items and every later one. That assumes the warm-up items are
representative of the rest (shuffle first if the input is sorted by label).

Pure numpy; nothing here needs MLX or a model.

The package: `calibrator` (the `Calibrator`, the shared constants and array checks),
`fitters` (batch, EM, the labelled fit, `fit` by name) and `run` (`CalibrationSpec` and the
per-run `Calibration`), each importing only the ones before it. Every name is importable
from `mlx_slm.text.calibration`.
"""

from .calibrator import (
    DEFAULT_WARMUP,
    FORMAT,
    INPUT_FLOOR,
    LOG_FLOOR,
    METHODS,
    PROB_DIGITS,
    VERSION,
    CalibrationError,
    Calibrator,
    gold_indices,
    written,
)
from .fitters import batch_log_prior, fit, fit_batch, fit_em, fit_labelled, stratified_folds
from .run import Calibration, CalibrationSpec

__all__ = [
    "PROB_DIGITS",
    "written",
    "METHODS",
    "DEFAULT_WARMUP",
    "INPUT_FLOOR",
    "FORMAT",
    "VERSION",
    "LOG_FLOOR",
    "CalibrationError",
    "gold_indices",
    "Calibrator",
    "batch_log_prior",
    "fit_batch",
    "fit_em",
    "fit_labelled",
    "stratified_folds",
    "fit",
    "CalibrationSpec",
    "Calibration",
]
