"""`mlx-slm train`: labelled texts in, a task with a learned head out.

    labelled file -> rows (readers.read_rows, gold labels checked) -> prompts (the Classifier's
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

from ..classifier.classifier import Classifier
from ..classifier.task import Task
from ..engine.engine import Engine
from ..files.readers import read_rows
from ..ground.errors import UserError
from ..ground.textfiles import has_lone_surrogate
from ..kinds.head import HeadSettings
from ..kinds.questions import QuestionsSettings
from ..text.heads import (
    DEFAULT_FOLDS,
    POOLINGS,
    Candidate,
    Head,
    Search,
    candidate_name,
    fit,
    format_table,
    min_per_label,
)
from ..text.inputs import missing as _missing
from ..text.labels import GOLD_MISSING, GOLD_NOT_STRING, GOLD_SPACES, MIN_LABELS, gold_problem, validate
from ..text.prompts import (
    DEFAULT_SYSTEM,
    DEFAULT_TEMPLATE,
    check_plain_system,
    check_template,
    fill_system,
    folds_system,
    read_examples,
)
from ..text.questions import DEFAULT_SYSTEM as Q_SYSTEM
from ..text.questions import DEFAULT_TEMPLATE as Q_TEMPLATE
from ..text.questions import Question, QuestionError, check_name, check_questions
from ..weights.convert import sha256_file, versions


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
    fmt: str | None = None,
    text_field: str = "text",
    id_field: str = "id",
    text_column: str = "text",
    id_column: str | None = "id",
    gold_field: str = "label",
    pair: str | None = None,
    pair_required: bool = False,
    folds: int = DEFAULT_FOLDS,
    need: tuple[int, str] | None = None,
    what: str = "a head",
) -> TrainingData:
    """Every row must hold a text and a gold label; `pair`: the field (JSONL, Parquet) or column
    (CSV) of a second text, read as classify reads it (`TaskOptions.read_pair`): a row that has
    one is a (text, pair) item, which the prompt takes ({pair} in the template) or refuses by
    its line. `labels`: the label set (None: the data's
    own labels, sorted); a label in the data outside it, a label with fewer than
    `min_per_label(folds)` examples (`need`: another minimum, and why), an empty file: a
    `TrainError` naming the fix. `what` is trained (the messages' words)."""

    if path in ("-", None):
        raise TrainError("train reads a file (its sha256 goes into the task): give the labelled data's path")
    rows = list(
        read_rows(
            path,
            fmt,
            text_field,
            id_field,
            text_column,
            id_column,
            gold=gold_field,
            pair=pair,
            pair_required=pair_required,
        )
    )
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


def train_head(
    engine_or_classifier: Any,
    texts: Sequence[str],
    labels: Sequence[str],
    *,
    classes: Sequence[str] | None = None,
    system: str | None = DEFAULT_SYSTEM,
    template: str = DEFAULT_TEMPLATE,
    examples: Sequence[tuple[str, str]] = (),
    label_descriptions: Mapping[str, str] | None = None,
    layers: str | Sequence[int] | None = "auto",
    layer: int | None = None,
    folds: int = DEFAULT_FOLDS,
    seed: int = 0,
    window: int = 1024,
    poolings: Sequence[str] = POOLINGS,
    progress: bool = False,
    log: Callable[[str], None] | None = None,
    source: str | None = None,
    lines: Sequence[int] | None = None,
    extract: Callable[..., tuple[dict[str, np.ndarray], list[str | None], Any]] | None = None,
    **clf_kwargs: Any,
) -> Head:
    """A learned head trained from memory: `texts` and each one's gold label (`labels`).

    `engine_or_classifier`: an `Engine` (then `system`, `template`, `examples` and
    `clf_kwargs` such as batch_size or truncate make the prompt and batching), or a
    `Classifier` (its prompt, examples and batching are used, and its labels are the
    default `classes`). `classes`: the head's labels, in order (default: the sorted labels
    of `labels`); every one needs `min_per_label(folds)` examples. `{labels}` in `system`
    is filled with them, as a `Classifier` does: save the head in a `Task` with that prompt.

    One forward per text to the deepest candidate layer (`layers`: "auto", "all" or layer
    numbers; `layer` forces one), then `heads.fit` chooses the parts (layers x `poolings`),
    the estimator and a temperature by stratified `folds`-fold cross-validation (`seed`
    shuffles the folds). `mlx-slm train` runs this same function on its file's rows.
    `progress=True`: a tqdm bar over the feature extraction; `log`: each step's message.
    A text or label that cannot be used is a `TrainError` naming its item (`source` and
    `lines` name the file and line instead). `extract(clf, texts, layers, poolings, window,
    progress)`: where the features come from (default: `clf.features`, one forward per
    text); the scikit-learn estimator passes its cache of texts already run."""
    note = log or (lambda _m: None)
    at = f"{source}: " if source else ""

    def where(i: int) -> str:
        return f"{at}line {lines[i]}" if lines is not None else f"{at}item {i}"

    texts, gold = _check_items(texts, labels, folds, at, where)
    engine, classes, system, template, examples, clf_kwargs = _prompt_settings(
        engine_or_classifier, classes, system, template, examples, clf_kwargs
    )
    classes, y = _gold_indices(gold, classes, folds, at, where)
    clf = head_classifier(engine, classes, system, template, examples=examples, **clf_kwargs)
    cands, feature_layers = _candidate_parts(len(clf.model.layers), layers, layer, poolings)
    feats, st = _features(clf, texts, feature_layers, poolings, window, progress, extract, note, where)
    forced = (layer,) if layer is not None else None
    return _fit_timed(feats, feature_layers, y, classes, cands, st, forced, folds, seed, note)


def _features(
    clf: Any,
    texts: list[str],
    feature_layers: list[int],
    poolings: Sequence[str],
    window: int,
    progress: bool,
    extract: Callable[..., tuple[dict[str, np.ndarray], list[str | None], Any]] | None,
    note: Callable[[str], None],
    where: Callable[[int], str],
) -> tuple[dict[str, np.ndarray], Any]:
    """The pooled hidden states of every text (one forward to the deepest layer, or
    `extract`'s cache) and the run's stats; a text that could not run is a `TrainError`."""
    note(
        f"features: {len(texts)} texts, layers {', '.join(map(str, feature_layers))} "
        f"(one forward to layer {max(feature_layers)} per batch), pooled: {', '.join(poolings)}"
    )
    if extract is None:
        feats, errors, st = clf.features(texts, feature_layers, window=window, poolings=poolings, progress=progress)
    else:
        feats, errors, st = extract(clf, texts, feature_layers, tuple(poolings), window, progress)
    for i, e in enumerate(errors):
        if e is not None:
            raise TrainError(f"{where(i)}: {e}")
    return feats, st


def _fit_timed(
    feats: dict[str, np.ndarray],
    feature_layers: list[int],
    y: np.ndarray,
    classes: tuple[str, ...],
    cands: list[Candidate],
    st: Any,
    forced: tuple[int, ...] | None,
    folds: int,
    seed: int,
    note: Callable[[str], None],
) -> Head:
    """`heads.fit` on the extracted features, with each candidate's cost per item and the
    feature and training times (`st`: the extraction's stats) in the head's info."""
    per_item = st.seconds / max(1, st.items)  # the texts run now (a cache may have held the others)
    deepest = max(feature_layers)

    # Blocks cost the same each: a forward stopped at layer l costs about l / deepest of this one.
    def secs(c: Candidate) -> float:
        return per_item * max(c.layers) / deepest

    t0 = time.perf_counter()
    head = fit(
        feats,
        feature_layers,
        y,
        classes,
        cands,
        Search(forced=forced, folds=folds, seed=seed),
        seconds_per_item=secs,
        progress=note,
    )
    head.info.update(
        {
            "feature_seconds": round(st.seconds, 3),
            "feature_items_per_s": round(st.items / st.seconds, 3) if st.seconds else None,
            "seconds_per_item_note": f"measured to layer {deepest}, scaled by the blocks run",
            "train_seconds": round(st.seconds + time.perf_counter() - t0, 3),
        }
    )
    return head


def _check_items(
    texts: Sequence[str], labels: Sequence[str], folds: int, at: str, where: Callable[[int], str]
) -> tuple[list[str], list[str]]:
    """train_head's first checks, before any model work: the folds, then one text and one
    non-empty gold label per item (`where(i)` names item i in messages)."""

    check_folds(folds)
    if isinstance(texts, (str, bytes)) or isinstance(labels, (str, bytes)):
        raise TrainError("texts and labels are sequences (one text and one gold label per item), not one string")
    texts, gold = list(texts), list(labels)
    if len(texts) != len(gold):
        raise TrainError(f"{at}{len(texts)} texts but {len(gold)} gold labels: give one label per text")
    for i, x in enumerate(texts):
        t = x[0] if isinstance(x, tuple) and len(x) == 2 else x  # (text, pair): the pair is the prompt's to take
        if not isinstance(t, str):
            why = "is missing (None/NaN)" if _missing(t) else f"is {type(t).__name__}, not a string"
            raise TrainError(f"{where(i)}: the text {why}: give every item its text, or drop the row")
        if not t.strip():
            raise TrainError(f"{where(i)}: the text is empty: give every item its text, or drop the row")

    for i, g in enumerate(gold):  # the form only (spaces are kept here: a class may hold them)
        if gold_problem(g) in (GOLD_MISSING, GOLD_NOT_STRING):
            raise TrainError(f"{where(i)}: gold label {g!r} is not a non-empty string: fix it, or drop the row")
    return texts, gold


def _prompt_settings(
    engine_or_classifier: Any,
    classes: Sequence[str] | None,
    system: str | None,
    template: str,
    examples: Sequence[tuple[str, str]],
    clf_kwargs: dict[str, Any],
) -> tuple[Any, Sequence[str] | None, str | None, str, Sequence[tuple[str, str]], dict[str, Any]]:
    """The engine, prompt and batching train_head runs with: a `Classifier`'s own (its labels
    the default classes; explicit `clf_kwargs` still win), or an `Engine` with the arguments."""

    if not isinstance(engine_or_classifier, Classifier):
        return engine_or_classifier, classes, system, template, examples, clf_kwargs
    base = engine_or_classifier
    kwargs = {
        "batch_size": base.batching.batch_size,
        "max_batch_tokens": base.batching.max_batch_tokens,
        "sort": base.batching.sort,
        "use_prefix_cache": bool(base.prefix_tokens),  # none kept: off, or no shared head
        "truncate": base.truncate,
        "max_length": base.max_length,
        **clf_kwargs,
    }
    classes = base.labels if classes is None else classes
    return base.engine, classes, base.format.system, base.format.template, base.format.examples, kwargs


def _gold_indices(
    gold: list[str], classes: Sequence[str] | None, folds: int, at: str, where: Callable[[int], str]
) -> tuple[tuple[str, ...], np.ndarray]:
    """The head's classes (default: the gold labels, sorted; at least two) and each item's
    class index; every gold label must be a class with `min_per_label(folds)` examples."""

    if classes is None:
        classes = sorted(set(gold))
        if len(classes) < MIN_LABELS:
            raise TrainError(
                f"{at}every item has the label {classes[0] if classes else None!r}: a head needs examples of at "
                "least two labels (classes)"
            )
    classes = tuple(validate(classes))
    index = {lab: i for i, lab in enumerate(classes)}
    for i, g in enumerate(gold):
        if gold_problem(g, classes) is not None:
            raise TrainError(
                f"{where(i)}: gold label {g!r} is not one of the labels {list(classes)[:8]}"
                f"{' ...' if len(classes) > 8 else ''}: add it to the labels, or drop the row"
            )
    y = np.array([index[g] for g in gold], dtype=np.int64)
    counts = np.bincount(y, minlength=len(classes))
    need = min_per_label(folds)
    if counts.min() < need:
        short = [f"{classes[i]!r} has {counts[i]}" for i in np.flatnonzero(counts < need)]
        raise TrainError(
            f"{at}too few examples: {'; '.join(short[:8])}{' ...' if len(short) > 8 else ''}. A head needs at "
            f"least {need} examples per label (one per cross-validation fold, folds={folds}): add examples of "
            "those labels, or leave them out"
        )
    return classes, y


def _candidate_parts(
    n: int, layers: str | Sequence[int] | None, layer: int | None, poolings: Sequence[str]
) -> tuple[list[Candidate], list[int]]:
    """The candidate parts (layers x poolings) of an `n`-layer model, and the layers whose
    hidden states they need; `layer` forces one into the candidates."""
    cand_layers = parse_layers(layers, n) if layers is None or isinstance(layers, str) else list(layers)
    bad = [x for x in cand_layers if not 1 <= x <= n]
    if bad or not cand_layers:
        raise TrainError(
            f"layers {list(cand_layers)}: the model has layers 1 to {n}; {bad or 'none given'} is out of range"
        )
    if layer is not None:
        if not 1 <= layer <= n:
            raise TrainError(f"--layer {layer}: the model has layers 1 to {n}")
        cand_layers = sorted(set(cand_layers) | {layer})
    cands = candidates(cand_layers, n, poolings=poolings)
    return cands, sorted({x for c in cands for x in c.layers})


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
    """`train_head` on a labelled file's rows (`read_training_data`), with the classifier's
    model, prompt and batching (`clf`, e.g. `head_classifier`); the head's info names the
    file and its sha256. `layer` forces that layer; `poolings` are the poolings weighed."""
    head = train_head(
        clf,
        data.texts,
        [data.labels[i] for i in data.gold],
        classes=data.labels,
        layers=layers,
        layer=layer,
        folds=folds,
        seed=seed,
        window=window,
        poolings=poolings,
        log=progress,
        source=data.path,
        lines=data.lines or None,
    )
    head.info.update({"data": Path(data.path).name, "data_sha256": data.sha256})
    return head


def head_classifier(engine: Any, labels: Sequence[str], system: str | None, template: str, **kwargs: Any) -> Any:
    """A classifier that gives features only (`Classifier(..., features_only=True)`): its
    prompt, prefix cache and batch plan give `train_head` its features; no label tokens
    are run or checked, and it classifies nothing."""

    return Classifier(engine, labels, system, template, features_only=True, **kwargs)


def trained_task(
    model: str,
    engine: Any,
    labels: Sequence[str],
    system: str | None,
    template: str,
    section: Any,
    examples: Sequence[tuple[str, str]] = (),
) -> Task:
    """The task a training run saves: its model (as named, pinned to these weights), prompt and
    labels, and what was learned (`section`: a head, or fine-tuned adapters)."""
    return Task(
        model=model,
        labels=tuple(labels),
        system=system,
        template=template,
        examples=tuple(examples),
        weights_sha256=engine.weights_sha256,
        versions=versions(),
        section=section,
        system_in_user_turn=folds_system(engine.tokenizer, system),
    )


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
    finish: Callable[[Any, Any], Any] | None = None,
    **clf_kwargs: Any,
) -> tuple[Any, str]:
    """The `train` command: read the data (before the model loads: its problems fail first),
    fit the head, save the task. Returns (the `Task`, the per-layer table as text).
    `read`: read_training_data's field options (fmt, text_field, gold_field, ...)."""

    check_folds(folds)
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
    task = trained_task(model, engine, data.labels, system, template, HeadSettings(head), clf.format.examples)
    if finish is not None:  # e.g. "none of these": its threshold chosen on held-out data, before anything is written
        task = finish(task, engine)
    task.save(save_task)
    return task, format_table(head)


def _check_fields(fields: Sequence[str]) -> None:
    """Before any work: each --label-field given once, each a question's name (it names its head)."""
    if len(set(fields)) != len(fields):
        raise TrainError(f"--label-field {sorted(f for f in fields if fields.count(f) > 1)[0]!r} is given twice")
    for f in fields:
        try:
            check_name(f)
        except QuestionError as e:
            raise TrainError(f"--label-field {f!r}: {e}; rename the field in the data") from None


def run_train_fields(
    data_path: str,
    save_task: str,
    fields: Sequence[str],
    *,
    model: str,
    system: str | None = None,
    template: str | None = None,
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
    """`train --label-field A --label-field B ...`: one head per gold field, from one pass over
    the texts (every head's candidate layers together, the forward stopped at the deepest),
    saved as a task of questions (each head a question named by its field) that `classify
    --task` runs, and that `--questions` can add zero-shot questions to. The prompt is the
    questions' (default system "You answer questions about a text ...", template `Text:
    {text}`): the heads read the text's own prompt, which zero-shot questions continue."""

    check_folds(folds)  # before the one feature pass, as the single head's entry checks it
    _check_fields(fields)
    datas = [read_training_data(data_path, None, folds=folds, **{**(read or {}), "gold_field": f}) for f in fields]
    system = Q_SYSTEM if system is None else check_plain_system(system)
    template = Q_TEMPLATE if template is None else check_template(template, placeholders=("text", "question"))
    progress(f"loading {model}")
    engine = Engine.load(model, dtype, dequantize)
    clf = head_classifier(engine, datas[0].labels, system, template, **clf_kwargs)
    n = len(clf.model.layers)
    spec = parse_layers(layers, n) if layers is None or isinstance(layers, str) else list(layers)
    every = sorted(
        {
            x
            for c in candidates(sorted(set(spec) | ({layer} if layer else set())), n, poolings=poolings)
            for x in c.layers
        }
    )
    progress(
        f"features: {len(datas[0].texts)} texts, layers {', '.join(map(str, every))}, once for {len(fields)} heads"
    )
    feats, errors, st = clf.features(datas[0].texts, every, window=window, poolings=poolings)

    def cached(_clf: Any, texts: Sequence[str], want: Sequence[int], pools: Sequence[str], *_: Any) -> Any:
        cols = [every.index(x) for x in want]  # the one pass's layers, as each head asks for them
        return {p: feats[p][:, cols] for p in pools}, errors, st

    heads = []
    for f, data in zip(fields, datas):
        progress(f"head for {f!r}: {len(data.labels)} labels")
        head = train_head(
            clf,
            data.texts,
            [data.labels[i] for i in data.gold],
            classes=data.labels,
            layers=spec,
            layer=layer,
            folds=folds,
            seed=seed,
            window=window,
            poolings=poolings,
            log=progress,
            source=data.path,
            lines=data.lines,
            extract=cached,
        )
        head.info.update({"data": Path(data.path).name, "data_sha256": data.sha256, "gold_field": f})
        heads.append(head)
    try:
        qs = check_questions([Question(f, "", "head", h.labels, head=h) for f, h in zip(fields, heads)])
    except QuestionError as e:
        raise TrainError(f"--label-field: {e} (the field names the head's question: rename the field)") from None
    task = Task(
        model=model,
        labels=(),
        system=system,
        template=template,
        weights_sha256=engine.weights_sha256,
        versions=versions(),
        section=QuestionsSettings(tuple(qs)),
        system_in_user_turn=folds_system(engine.tokenizer, system),
    )
    task.save(save_task)
    return task, "\n\n".join(f"== {f}\n{format_table(h)}" for f, h in zip(fields, heads))


__all__ = [
    "TrainError",
    "TrainingData",
    "check_folds",
    "candidate_name",
    "candidates",
    "default_layers",
    "head_classifier",
    "parse_layers",
    "read_training_data",
    "run_train",
    "run_train_fields",
    "train",
    "train_head",
]
