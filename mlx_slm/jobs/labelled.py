"""Labelled texts read for training: the one reader of a file of texts and gold labels.

`train` (a head, several heads, a fine-tune, `--finetune auto`) and `--none-data` read their
files here, so a row without a text or a gold label, a label outside the label set or too few
examples of one are refused the same way, naming the file, the line and the fix, before any
model loads.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from ..files.readers import ReadSpec, read_rows
from ..ground.errors import UserError
from ..ground.textfiles import has_lone_surrogate
from ..text.heads import DEFAULT_FOLDS, min_per_label
from ..text.labels import GOLD_MISSING, GOLD_SPACES, MIN_LABELS, gold_problem, validate
from ..weights.convert import sha256_file


class TrainError(UserError, ValueError):
    """Training data or options that cannot give a head; the message names the file, line and fix."""


def check_folds(folds: Any) -> None:
    """Cross-validation needs at least 2 folds (checked before any model work, by every entry)."""
    if isinstance(folds, bool) or not isinstance(folds, int) or folds < 2:
        raise TrainError(f"folds={folds!r}: cross-validation needs at least 2 folds")


@dataclass
class TrainingData:
    path: str
    texts: list[Any]  # a text, or (text, pair) where the row has a second text (as classify reads it)
    gold: np.ndarray  # label indices
    labels: tuple[str, ...]
    lines: list[int]  # the input line of each text
    sha256: str


def _check_golds(path: str, rows: Sequence[Any], gold_field: str) -> None:
    """Every row read, with a gold label of a usable form (its line named otherwise): present, no
    spaces around it, valid Unicode (the tokenizer encodes it)."""
    for r in rows:
        if r.error is not None:
            raise TrainError(f"{path}: {r.error}")
        kind = gold_problem(None if r.gold is None else str(r.gold))  # the form only: labels may come from the data
        if kind == GOLD_MISSING:
            raise TrainError(
                f"{path}: line {r.line}: no gold label in {gold_field!r}: add it, or name its field with --gold-field "
                '(an out-of-scope example: label it, e.g. "oos", and train with --none-label oos)'
            )
        if kind is None and has_lone_surrogate(str(r.gold)):  # a label the tokenizer cannot encode
            raise TrainError(
                f"{path}: line {r.line}: gold label {str(r.gold)!r} in {gold_field!r} holds an unpaired surrogate "
                "escape (not valid Unicode): fix the label"
            )
        if kind == GOLD_SPACES:  # else ' billing' became a label of its own beside 'billing'
            raise TrainError(
                f"{path}: line {r.line}: gold label {str(r.gold)!r} has spaces around it: remove them (labels are "
                "compared exactly)"
            )


def read_training_data(
    path: str,
    labels: Sequence[str] | None = None,
    *,
    spec: ReadSpec | None = None,
    folds: int = DEFAULT_FOLDS,
    need: tuple[int, str] | None = None,
    what: str = "a head",
) -> TrainingData:
    """Every row must hold a text and a gold label, read as `spec` says (its format, fields and
    second text, as classify reads them: a row with a pair is a (text, pair) item, which the
    prompt takes ({pair} in the template) or refuses by its line; the gold label from
    `spec.gold`, else `spec.gold_field`). `labels`: the label set (None: the data's own labels,
    sorted); a label in the data outside it, a label with fewer than `min_per_label(folds)`
    examples (`need`: another minimum, and why), an empty file: a `TrainError` naming the fix.
    `what` is trained (the messages' words)."""

    spec = spec or ReadSpec()
    gold_field = spec.gold if isinstance(spec.gold, str) else spec.gold_field
    text_field = spec.text_field
    if path in ("-", None):
        raise TrainError("train reads a file (its sha256 goes into the task): give the labelled data's path")
    rows = list(read_rows(path, replace(spec, gold=gold_field)))
    if not rows:
        raise TrainError(
            f"{path} is empty: give it labelled texts, one a row (a {text_field!r} and a {gold_field!r} field)"
        )

    _check_golds(path, rows, gold_field)
    gold = [str(r.gold) for r in rows]
    if labels is None:
        labels = sorted(set(gold))
        if len(labels) < MIN_LABELS:
            raise TrainError(
                f"{path}: every row has the label {labels[0]!r}: {what} needs examples of at least two labels"
            )
    labels = tuple(validate(labels))
    outside: dict[str, int] = {}
    for r, g in zip(rows, gold):
        if gold_problem(g, labels) is not None:
            outside.setdefault(g, r.line)
    if outside:
        shown = ", ".join(f"{g!r} (line {n})" for g, n in list(outside.items())[:8])
        raise TrainError(
            f"{path}: labels in the data that are not in --labels: {shown}"
            f"{' ...' if len(outside) > 8 else ''}: add them to --labels (or --labels-file), or drop those rows"
        )
    index = {lab: i for i, lab in enumerate(labels)}
    y = np.array([index[g] for g in gold], dtype=np.int64)
    counts = np.bincount(y, minlength=len(labels))
    least, why = need or (
        min_per_label(folds),
        f"A head needs at least {min_per_label(folds)} examples per label (one per cross-validation fold, --folds "
        f"{folds}): add examples of those labels, or leave them out of --labels and the data",
    )
    if counts.min() < least:
        short = [f"{labels[i]!r} has {counts[i]}" for i in np.flatnonzero(counts < least)]
        raise TrainError(f"{path}: too few examples: {'; '.join(short[:8])}{' ...' if len(short) > 8 else ''}. {why}")
    return TrainingData(path, [r.item for r in rows], y, labels, [r.line for r in rows], sha256_file(Path(path)))
