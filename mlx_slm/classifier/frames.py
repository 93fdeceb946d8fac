"""pandas frames in and out: a DataFrame's texts classified, the predictions added as the CSV
output's columns (`Classifier.classify_frame`). It takes the classifier as an argument."""

from __future__ import annotations

from typing import Any

from ..text.calibration import CalibrationSpec, Calibrator
from ..text.inputs import check_frame, check_new_columns


def classify_frame(
    clf: Any,
    df: Any,
    text_column: str = "text",
    calibration: str | Calibrator | CalibrationSpec | None = None,
    min_confidence: float | None = None,
    *,
    prefix: str = "",
    progress: bool = False,
) -> Any:
    """A copy of `df` with `clf`'s predictions of its `text_column` (see `Classifier.classify_frame`)."""
    check_frame(df, text_column, prefix)
    cal = clf.calibration if calibration is None else CalibrationSpec.of(calibration)
    conf = clf.min_confidence if min_confidence is None else min_confidence
    # the CSV output's columns (each question's, with several), less the input's id and line
    shape = clf.spec.record_shape(calibrated=cal.applies, abstains=conf is not None)
    names = shape.frame_columns
    check_new_columns(df, names, prefix)
    preds = clf.classify(list(df[text_column]), cal, conf, progress=progress)
    cols = shape.frame(preds, cal.method if cal.applies else None)
    out = df.copy()
    for c in names:
        out[prefix + c] = cols[c]
    return out
