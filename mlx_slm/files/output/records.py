"""Output records and columns, by their names of before: the shape itself lives in
`mlx_slm.text.records` (`RecordShape`), the one builder of the JSONL object, the flat
CSV/TSV/Parquet row, `classify_frame`'s row and Ray's."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...text.records import RecordShape, answer_record, flat_answers, flat_record, result_record


def question_columns(questions: Sequence[Any], raw: bool = False, abstain: bool = False) -> list[str]:
    """CSV/TSV/Parquet header of a run that asks several questions (see `flat_answers`): with
    calibration each question's raw probabilities too, with a confidence threshold its flag."""
    return RecordShape.of(questions=questions, calibrated=raw, abstains=abstain).columns


def columns_of(settings: dict[str, Any]) -> list[str]:
    """The flat columns of a run, from its manifest's settings (labels, or questions as recorded)."""
    return RecordShape.from_settings(settings).columns


def csv_columns(labels: Sequence[str], raw: bool = False, abstain: bool = False) -> list[str]:
    """CSV/TSV header: calibrated runs add the raw probabilities, abstaining runs a flag."""
    return RecordShape.of(labels, calibrated=raw, abstains=abstain).columns


__all__ = [
    "RecordShape",
    "answer_record",
    "columns_of",
    "csv_columns",
    "flat_answers",
    "flat_record",
    "question_columns",
    "result_record",
]
