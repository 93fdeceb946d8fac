"""Calibration fitted on labelled texts in memory: what `--calibration-data` and
`Classifier.fit_calibration` fit (a prior, or em's base), the classifier left unchanged.
It takes the classifier as an argument (its labels, kind and `classify_iter`)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from ..text.calibration import CalibrationError, CalibrationSpec, fit_labelled, gold_indices
from ..text.inputs import as_texts
from ..text.labels import LabelError, gold_problem, log_softmax


def fit_calibration(
    clf: Any,
    texts: Iterable[str],
    labels: Iterable[str],
    method: str | CalibrationSpec = "fit",
    *,
    window: int = 1024,
    progress: bool = False,
    source: str | None = None,
    lines: Sequence[int] | None = None,
) -> CalibrationSpec:
    """Calibration fitted on labelled texts in memory (what --calibration-data fits).

    `labels`: each text's gold label, one of this classifier's labels. `method`: "fit"
    (per-label offsets, maybe a temperature, applied as they are) or "em" (those offsets
    as the base on which each input re-estimates its own label mix). Returns the
    `CalibrationSpec` to classify with (`classify(texts, calibration=spec)`, or a
    `Task`'s calibration); its calibrator's `info` holds the cross-validated figures.
    A missing or empty text, a gold label that
    is not a label, or a prompt over the context is a `CalibrationError` naming the item
    (`source` and `lines`, when given, name the file and line instead)."""
    spec = CalibrationSpec.of(method, warmup=None if isinstance(method, CalibrationSpec) else clf.warmup)
    if spec.method not in ("fit", "em"):
        raise CalibrationError(f"fit_calibration fits 'fit' or 'em' calibration, not {spec.method!r}")
    if not clf.spec.calibrates:
        raise LabelError(clf.spec.no_calibration)
    texts, gold = list(as_texts(texts, None)), list(as_texts(labels, None))
    at = f"{source}: " if source else ""

    def where(i: int) -> str:
        return f"{at}line {lines[i]}" if lines is not None else f"{at}item {i}"

    if len(texts) != len(gold):
        raise CalibrationError(f"{at}{len(texts)} texts but {len(gold)} gold labels: give one label per text")
    if not texts:
        raise CalibrationError(f"{at}no labelled texts: give some (texts and their gold labels)")
    for i, g in enumerate(gold):
        if gold_problem(g, clf.labels) is not None:
            raise CalibrationError(
                f"{where(i)}: gold label {g!r} is not one of the labels {list(clf.labels)}: fix it, or add the label"
            )
    lp = []
    for p in clf.classify_iter(texts, window=window, progress=progress):
        if not p.ok:
            raise CalibrationError(f"{where(p.index)}: {p.error}")
        lp.append([p.scores[lab] for lab in clf.labels])
    cal = fit_labelled(log_softmax(np.array(lp)), gold_indices(gold, clf.labels), clf.labels)
    return replace(spec, base=cal) if spec.method == "em" else replace(spec, prior=cal)
