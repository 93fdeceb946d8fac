"""`mlx-slm train`: labelled texts in, a task with a learned head out.

    labelled file -> rows (io.read_rows, gold labels checked) -> prompts (the Classifier's
    own render, prefix cache and batch plan) -> hidden states of every candidate layer in
    one forward pass per batch (Engine.features) -> cross-validation and fit (heads.fit)
    -> task file (task.Task with its head)

The forward runs once per text, to the deepest candidate layer; the per-layer table then
sets each layer's cross-validated accuracy against the seconds per item a forward
stopped there costs (measured for the deepest, scaled by the blocks run for the rest).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .errors import UserError
from .heads import DEFAULT_FOLDS, POOLINGS, Candidate, Head, candidate_name, fit, format_table, min_per_label
from .prompts import DEFAULT_SYSTEM, DEFAULT_TEMPLATE


class TrainError(UserError, ValueError):
    """Training data or options that cannot give a head; the message names the file, line and fix."""


@dataclass
class TrainingData:
    path: str
    texts: list[str]
    gold: np.ndarray  # label indices
    labels: tuple[str, ...]
    lines: list[int]  # the input line of each text
    sha256: str


def read_training_data(
    path: str,
    labels: Sequence[str] | None = None,
    *,
    fmt: str | None = None,
    text_field: str = "text",
    id_field: str = "id",
    text_column: str = "text",
    id_column: str | None = "id",
    gold_field: str = "label",
    folds: int = DEFAULT_FOLDS,
) -> TrainingData:
    """Every row must hold a text and a gold label. `labels`: the label set (None: the data's
    own labels, sorted); a label in the data outside it, a label with fewer than
    `min_per_label(folds)` examples, an empty file: a `TrainError` naming the fix."""
    from .convert import sha256_file
    from .io import read_rows

    if path in ("-", None):
        raise TrainError("train reads a file (its sha256 goes into the task): give the labelled data's path")
    rows = list(read_rows(path, fmt, text_field, id_field, text_column, id_column, gold=gold_field))
    if not rows:
        raise TrainError(
            f"{path} is empty: give it labelled texts, one a row (a {text_field!r} and a {gold_field!r} field)"
        )
    for r in rows:
        if r.error is not None:
            raise TrainError(f"{path}: {r.error}")
        if r.gold is None or not str(r.gold).strip():
            raise TrainError(
                f"{path}: line {r.line}: no gold label in {gold_field!r}: add it, or name its field with --gold-field"
            )
        if str(r.gold) != str(r.gold).strip():  # else ' billing' became a label of its own beside 'billing'
            raise TrainError(
                f"{path}: line {r.line}: gold label {str(r.gold)!r} has spaces around it: remove them (labels are "
                "compared exactly)"
            )
    gold = [str(r.gold) for r in rows]
    if labels is None:
        labels = sorted(set(gold))
        if len(labels) < 2:
            raise TrainError(
                f"{path}: every row has the label {labels[0]!r}: a head needs examples of at least two labels"
            )
    from .labels import validate

    labels = tuple(validate(labels))
    known = set(labels)
    outside: dict[str, int] = {}
    for r, g in zip(rows, gold):
        if g not in known:
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
    need = min_per_label(folds)
    if counts.min() < need:
        short = [f"{labels[i]!r} has {counts[i]}" for i in np.flatnonzero(counts < need)]
        raise TrainError(
            f"{path}: too few examples: {'; '.join(short[:8])}{' ...' if len(short) > 8 else ''}. A head needs at "
            f"least {need} examples per label (one per cross-validation fold, --folds {folds}): add examples "
            "of those labels, or leave them out of --labels and the data"
        )
    return TrainingData(path, [str(r.text) for r in rows], y, labels, [r.line for r in rows], sha256_file(Path(path)))


def default_layers(n: int) -> list[int]:
    """Candidate layers when none are given: every eighth of the depth from a quarter down
    (6, 9, ..., 24 for a 24-layer model), the last included."""
    return sorted({max(1, round(n * i / 8)) for i in range(2, 9)})


def parse_layers(spec: str | None, n: int) -> list[int]:
    """--layers: "auto" (default_layers), "all", or comma-separated layer numbers 1..n."""
    if spec in (None, "", "auto"):
        return default_layers(n)
    if spec == "all":
        return list(range(1, n + 1))
    try:
        got = sorted({int(x) for x in spec.split(",") if x.strip()})
    except ValueError:
        raise TrainError(f"--layers {spec!r}: give 'auto', 'all' or layer numbers like 6,12,{n}") from None
    bad = [x for x in got if not 1 <= x <= n]
    if not got or bad:
        raise TrainError(f"--layers {spec!r}: the model has layers 1 to {n}; {bad or 'none given'} is out of range")
    return got


def candidates(layers: Sequence[int], n: int, pair: bool = True, poolings: Sequence[str] = POOLINGS) -> list[Candidate]:
    """Per pooling: one candidate per layer, and the last two layers side by side when the
    last is a candidate."""
    sets = [(x,) for x in layers]
    if pair and n >= 2 and n in layers:
        sets.append((n - 1, n))
    return [Candidate.of(c, p) for p in poolings for c in sets]


def train(
    clf: Any,
    data: TrainingData,
    *,
    layers: str | Sequence[int] | None = "auto",
    layer: int | None = None,
    folds: int = DEFAULT_FOLDS,
    seed: int = 0,
    window: int = 1024,
    poolings: Sequence[str] = POOLINGS,
    progress: Callable[[str], None] = lambda _m: None,
) -> Head:
    """Fit a head on `data` with the classifier's model and prompt (`clf`: a `Classifier` in
    head mode, e.g. `head_classifier`). `layer` forces that layer (it is added to the
    candidates); `poolings` are the poolings weighed ("last", "mean")."""
    n = len(clf.model.layers)
    cand_layers = parse_layers(layers, n) if layers is None or isinstance(layers, str) else list(layers)
    if layer is not None:
        if not 1 <= layer <= n:
            raise TrainError(f"--layer {layer}: the model has layers 1 to {n}")
        cand_layers = sorted(set(cand_layers) | {layer})
    cands = candidates(cand_layers, n, poolings=poolings)
    feature_layers = sorted({x for c in cands for x in c.layers})
    progress(
        f"features: {len(data.texts)} texts, layers {', '.join(map(str, feature_layers))} "
        f"(one forward to layer {max(feature_layers)} per batch), pooled: {', '.join(poolings)}"
    )
    feats, errors, st = clf.features(data.texts, feature_layers, window=window, poolings=poolings)
    for i, e in enumerate(errors):
        if e is not None:
            raise TrainError(f"{data.path}: line {data.lines[i]}: {e}")
    per_item = st.seconds / max(1, len(data.texts))
    deepest = max(feature_layers)

    # Blocks cost the same each: a forward stopped at layer l costs about l / deepest of this one.
    def secs(c: Candidate) -> float:
        return per_item * max(c.layers) / deepest

    t0 = time.perf_counter()
    head = fit(
        feats,
        feature_layers,
        data.gold,
        data.labels,
        cands,
        forced=(layer,) if layer is not None else None,
        folds=folds,
        seed=seed,
        seconds_per_item=secs,
        progress=progress,
    )
    head.info.update(
        {
            "data": Path(data.path).name,
            "data_sha256": data.sha256,
            "feature_seconds": round(st.seconds, 3),
            "feature_items_per_s": round(len(data.texts) / st.seconds, 3) if st.seconds else None,
            "seconds_per_item_note": f"measured to layer {deepest}, scaled by the blocks run",
            "train_seconds": round(st.seconds + time.perf_counter() - t0, 3),
        }
    )
    return head


def head_classifier(engine: Any, labels: Sequence[str], system: str | None, template: str, **kwargs: Any) -> Any:
    """A classifier in head mode with an untrained (zero) head: its prompt, prefix cache and
    batch plan give `train` its features; no label tokens are run or checked."""
    from .classifier import Classifier

    dim = int(engine.model.args.hidden_size)
    k = len(labels)
    zero = Head(tuple(labels), (1,), np.zeros(dim), np.ones(dim), np.zeros((k, dim)), np.zeros(k))
    return Classifier(engine, labels, system, template, head=zero, **kwargs)


def run_train(
    data_path: str,
    save_task: str,
    *,
    model: str,
    labels: Sequence[str] | None = None,
    descriptions: Mapping[str, str] | None = None,
    system: str | None = DEFAULT_SYSTEM,
    template: str = DEFAULT_TEMPLATE,
    examples_file: str | None = None,
    read: Mapping[str, Any] | None = None,
    layers: str | None = "auto",
    layer: int | None = None,
    folds: int = DEFAULT_FOLDS,
    seed: int = 0,
    dtype: str | None = None,
    dequantize: bool | None = None,
    window: int = 1024,
    poolings: Sequence[str] = POOLINGS,
    progress: Callable[[str], None] = lambda _m: None,
    **clf_kwargs: Any,
) -> tuple[Any, str]:
    """The `train` command: read the data (before the model loads: its problems fail first),
    fit the head, save the task. Returns (the `Task`, the per-layer table as text).
    `read`: read_training_data's field options (fmt, text_field, gold_field, ...)."""
    from .convert import versions
    from .engine import Engine
    from .prompts import check_template, fill_system, read_examples
    from .task import Task

    if folds < 2:
        raise TrainError(f"--folds {folds}: cross-validation needs at least 2 folds")
    data = read_training_data(data_path, labels, folds=folds, **(read or {}))
    # As typed (--system, --template): every {word} checked, {{ }} literal braces.
    system = fill_system(system or None, data.labels, descriptions)
    template = check_template(template)
    examples = read_examples(examples_file, data.labels) if examples_file else ()
    progress(f"loading {model}")
    engine = Engine.load(model, dtype, dequantize)
    clf = head_classifier(engine, data.labels, system, template, examples=examples, **clf_kwargs)
    head = train(
        clf,
        data,
        layers=layers,
        layer=layer,
        folds=folds,
        seed=seed,
        window=window,
        poolings=poolings,
        progress=progress,
    )
    task = Task(
        model=model,
        labels=data.labels,
        system=system,
        template=template,
        examples=clf.format.examples,
        weights_sha256=engine.weights_sha256,
        versions=versions(),
        head=head,
    )
    task.save(save_task)
    return task, format_table(head)


__all__ = [
    "TrainError",
    "TrainingData",
    "candidate_name",
    "candidates",
    "default_layers",
    "head_classifier",
    "parse_layers",
    "read_training_data",
    "run_train",
    "train",
]
