"""`mlx-slm train`: labelled texts in, a task with a learned head out.

    labelled file -> rows (`labelled.read_training_data`: `files.readers.read_rows`, gold
    labels checked) -> the plan's prompt with the data's labels (`Plan.with_labels`) ->
    prompts (the Classifier's own render, prefix cache and batch plan) -> hidden states of
    every candidate layer in one forward pass per batch (`Engine.features`) ->
    cross-validation and fit (`text.heads.fit`) -> task file (`classifier.Task` with its head)

Every way of training (a head, several heads, `finetune.py`, `choose.py`) reads one `TrainRun`:
DATA, the `Plan` the front end resolved (the model, the prompt as typed, the batching, how DATA
is read, where the task goes), the labels given, `HeadOptions` and "none of these" (a
`NoneRule` the job applies itself). The forward runs once per text, to the deepest candidate
layer; the per-layer table then sets each layer's cross-validated accuracy against the
seconds per item a forward stopped there costs (measured for the deepest, scaled by the
blocks run for the rest).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import numpy as np

from ..classifier.classifier import Classifier
from ..classifier.plan import Plan
from ..classifier.task import Task
from ..engine.engine import Engine
from ..kinds import KindArgs, arguments
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
from ..text.labels import GOLD_MISSING, GOLD_NOT_STRING, MIN_LABELS, gold_problem, validate
from ..text.prompts import (
    DEFAULT_SYSTEM,
    DEFAULT_TEMPLATE,
    check_plain_system,
    check_template,
    folds_system,
    read_examples,
)
from ..text.questions import Question, QuestionError, check_name, check_questions
from ..weights.convert import versions
from .labelled import TrainError, TrainingData, check_folds, read_training_data
from .out_of_scope import NoneRule


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


Extract = Callable[..., tuple[dict[str, np.ndarray], list[str | None], Any]]


def _silent(_message: str) -> None:
    """No messages."""


@dataclass(frozen=True)
class HeadOptions:
    """How a head is chosen, read once from the front end (`train`'s --layers, --layer, --folds,
    --seed, --pooling and --window; `train_head`'s arguments of these names): `layers` "auto",
    "all" or layer numbers, `layer` forces one, `folds`-fold cross-validation shuffled with
    `seed`, the `poolings` weighed, the feature pass's `window`."""

    layers: str | Sequence[int] | None = "auto"
    layer: int | None = None
    folds: int = DEFAULT_FOLDS
    seed: int = 0
    window: int = 1024
    poolings: tuple[str, ...] = POOLINGS

    @classmethod
    def take(cls, options: dict[str, Any]) -> HeadOptions:
        """The options of these names taken out of `options` (the rest stay)."""
        got = {f.name: options.pop(f.name) for f in fields(cls) if f.name in options}
        if "poolings" in got:
            got["poolings"] = tuple(got["poolings"])
        return cls(**got)


@dataclass(frozen=True)
class Trace:
    """Where a head's items came from and where its steps are told: `source` and `lines` name a
    bad item's file and line (else its index), `log` takes each step's message, `progress` shows
    a tqdm bar over the feature pass, and `extract(clf, texts, layers, poolings, window, progress)`
    gives the features instead of the classifier's forward (the estimator's cache, or one pass
    shared by several heads)."""

    source: str | None = None
    lines: Sequence[int] | None = None
    log: Callable[[str], None] | None = None
    progress: bool = False
    extract: Extract | None = None

    @classmethod
    def take(cls, options: dict[str, Any]) -> Trace:
        """The options of these names taken out of `options` (the rest stay)."""
        return cls(**{f.name: options.pop(f.name) for f in fields(cls) if f.name in options})

    @property
    def at(self) -> str:
        return f"{self.source}: " if self.source else ""

    def where(self, i: int) -> str:
        return f"{self.at}line {self.lines[i]}" if self.lines is not None else f"{self.at}item {i}"

    def note(self, message: str) -> None:
        (self.log or _silent)(message)


def train_head(
    engine_or_classifier: Any,
    texts: Sequence[str],
    labels: Sequence[str],
    *,
    classes: Sequence[str] | None = None,
    **options: Any,
) -> Head:
    """A learned head trained from memory: `texts` and each one's gold label (`labels`).

    `engine_or_classifier`: an `Engine` (then `system` (default `DEFAULT_SYSTEM`), `template`,
    `examples` and the batching options such as batch_size or truncate make the prompt and
    batching), or a `Classifier` (its prompt, examples and batching are used, and its labels are
    the default `classes`). `classes`: the head's labels, in order (default: the sorted labels
    of `labels`); every one needs `min_per_label(folds)` examples. `{labels}` in `system` is
    filled with them, as a `Classifier` does: save the head in a `Task` with that prompt.

    One forward per text to the deepest candidate layer (`layers`: "auto", "all" or layer
    numbers; `layer` forces one), then `heads.fit` chooses the parts (layers x `poolings`),
    the estimator and a temperature by stratified `folds`-fold cross-validation (`seed`
    shuffles the folds; `window`: the feature pass's). `progress=True`: a tqdm bar over the
    feature extraction; `log`: each step's message. A text or label that cannot be used is a
    `TrainError` naming its item (`source` and `lines` name the file and line instead).
    `extract(clf, texts, layers, poolings, window, progress)`: where the features come from
    (default: `clf.features`, one forward per text); the scikit-learn estimator passes its
    cache of texts already run. `label_descriptions` is accepted and not used (a head reads
    its prompt's system message as given). The options are read once into `HeadOptions`,
    a `Trace` and the prompt; the rest are the classifier's batching options."""
    head, trace = HeadOptions.take(options), Trace.take(options)
    prompt = (options.pop("system", DEFAULT_SYSTEM), options.pop("template", DEFAULT_TEMPLATE))
    prompt += (tuple(options.pop("examples", ())),)
    options.pop("label_descriptions", None)
    return learn_head(engine_or_classifier, texts, labels, classes, head, trace, prompt, options)


def learn_head(
    engine_or_classifier: Any,
    texts: Sequence[str],
    labels: Sequence[str],
    classes: Sequence[str] | None,
    head: HeadOptions,
    trace: Trace,
    prompt: tuple[str | None, str, tuple[tuple[str, str], ...]] = (DEFAULT_SYSTEM, DEFAULT_TEMPLATE, ()),
    batching: Mapping[str, Any] | None = None,
) -> Head:
    """`train_head` with its options read: the items checked (before any model work), the
    features-only classifier made with the prompt (system, template, examples) and `batching`
    (or a `Classifier`'s own), then `fit_head`. `mlx-slm train` runs this on its file's rows."""
    check_folds(head.folds)
    texts, gold = _check_items(texts, labels, trace)
    engine, classes, system, template, examples, batching = _prompt_settings(
        engine_or_classifier, classes, prompt, dict(batching or {})
    )
    classes, y = _gold_indices(gold, classes, head.folds, trace)
    clf = head_classifier(engine, classes, system, template, examples=examples, **batching)
    return fit_head(clf, texts, y, classes, head, trace)


def fit_head(
    clf: Any, texts: list[Any], y: np.ndarray, classes: tuple[str, ...], head: HeadOptions, trace: Trace
) -> Head:
    """The features of `texts` on `clf` (a features-only classifier), then `heads.fit` on them
    with each item's class index `y`: the head, its choice and its timings in its info."""
    cands, feature_layers = _candidate_parts(len(clf.model.layers), head.layers, head.layer, head.poolings)
    feats, st = _features(clf, texts, feature_layers, head, trace)
    return _fit_timed(feats, (feature_layers, y, classes), cands, st, head, trace.note)


def _features(
    clf: Any, texts: list[Any], feature_layers: list[int], head: HeadOptions, trace: Trace
) -> tuple[dict[str, np.ndarray], Any]:
    """The pooled hidden states of every text (one forward to the deepest layer, or the
    trace's `extract`) and the run's stats; a text that could not run is a `TrainError`."""
    trace.note(
        f"features: {len(texts)} texts, layers {', '.join(map(str, feature_layers))} "
        f"(one forward to layer {max(feature_layers)} per batch), pooled: {', '.join(head.poolings)}"
    )
    if trace.extract is None:
        feats, errors, st = clf.features(
            texts, feature_layers, window=head.window, poolings=head.poolings, progress=trace.progress
        )
    else:
        feats, errors, st = trace.extract(clf, texts, feature_layers, tuple(head.poolings), head.window, trace.progress)
    for i, e in enumerate(errors):
        if e is not None:
            raise TrainError(f"{trace.where(i)}: {e}")
    return feats, st


def _fit_timed(
    feats: dict[str, np.ndarray],
    data: tuple[list[int], np.ndarray, tuple[str, ...]],
    cands: list[Candidate],
    st: Any,
    head: HeadOptions,
    note: Callable[[str], None],
) -> Head:
    """`heads.fit` on the extracted features (`data`: their layers, each item's class index, the
    classes), with each candidate's cost per item and the feature and training times (`st`: the
    extraction's stats) in the head's info."""
    feature_layers, y, classes = data
    per_item = st.seconds / max(1, st.items)  # the texts run now (a cache may have held the others)
    deepest = max(feature_layers)

    # Blocks cost the same each: a forward stopped at layer l costs about l / deepest of this one.
    def secs(c: Candidate) -> float:
        return per_item * max(c.layers) / deepest

    t0 = time.perf_counter()
    fitted = fit(
        feats,
        feature_layers,
        y,
        classes,
        cands,
        Search(forced=(head.layer,) if head.layer is not None else None, folds=head.folds, seed=head.seed),
        seconds_per_item=secs,
        progress=note,
    )
    fitted.info.update(
        {
            "feature_seconds": round(st.seconds, 3),
            "feature_items_per_s": round(st.items / st.seconds, 3) if st.seconds else None,
            "seconds_per_item_note": f"measured to layer {deepest}, scaled by the blocks run",
            "train_seconds": round(st.seconds + time.perf_counter() - t0, 3),
        }
    )
    return fitted


def _check_items(texts: Sequence[str], labels: Sequence[str], trace: Trace) -> tuple[list[str], list[str]]:
    """learn_head's first checks, before any model work: one text and one non-empty gold label
    per item (`Trace.where(i)` names item i in messages)."""

    if isinstance(texts, (str, bytes)) or isinstance(labels, (str, bytes)):
        raise TrainError("texts and labels are sequences (one text and one gold label per item), not one string")
    texts, gold = list(texts), list(labels)
    if len(texts) != len(gold):
        raise TrainError(f"{trace.at}{len(texts)} texts but {len(gold)} gold labels: give one label per text")
    for i, x in enumerate(texts):
        t = x[0] if isinstance(x, tuple) and len(x) == 2 else x  # (text, pair): the pair is the prompt's to take
        if not isinstance(t, str):
            why = "is missing (None/NaN)" if _missing(t) else f"is {type(t).__name__}, not a string"
            raise TrainError(f"{trace.where(i)}: the text {why}: give every item its text, or drop the row")
        if not t.strip():
            raise TrainError(f"{trace.where(i)}: the text is empty: give every item its text, or drop the row")

    for i, g in enumerate(gold):  # the form only (spaces are kept here: a class may hold them)
        if gold_problem(g) in (GOLD_MISSING, GOLD_NOT_STRING):
            raise TrainError(f"{trace.where(i)}: gold label {g!r} is not a non-empty string: fix it, or drop the row")
    return texts, gold


def _prompt_settings(
    engine_or_classifier: Any,
    classes: Sequence[str] | None,
    prompt: tuple[str | None, str, tuple[tuple[str, str], ...]],
    batching: dict[str, Any],
) -> tuple[Any, Sequence[str] | None, str | None, str, Sequence[tuple[str, str]], dict[str, Any]]:
    """The engine, classes, prompt and batching learn_head runs with: a `Classifier`'s own (its
    labels the default classes; explicit `batching` options still win), or an `Engine` with the
    arguments."""

    if not isinstance(engine_or_classifier, Classifier):
        return engine_or_classifier, classes, *prompt, batching
    base = engine_or_classifier
    kwargs = {
        "batch_size": base.batching.batch_size,
        "max_batch_tokens": base.batching.max_batch_tokens,
        "sort": base.batching.sort,
        "use_prefix_cache": bool(base.prefix_tokens),  # none kept: off, or no shared head
        "truncate": base.truncate,
        "max_length": base.max_length,
        **({"controls_as_text": True} if base.plan.controls_as_text else {}),  # a decision client's texts
        **batching,
    }
    classes = base.labels if classes is None else classes
    return base.engine, classes, base.format.system, base.format.template, base.format.examples, kwargs


def _gold_indices(
    gold: list[str], classes: Sequence[str] | None, folds: int, trace: Trace, fix: str = "or leave them out"
) -> tuple[tuple[str, ...], np.ndarray]:
    """The head's classes (default: the gold labels, sorted; at least two) and each item's
    class index; every gold label must be a class with `min_per_label(folds)` examples (`fix`:
    the way out besides more examples, as the caller's labels can be changed)."""

    at = trace.at
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
                f"{trace.where(i)}: gold label {g!r} is not one of the labels {list(classes)[:8]}"
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
            f"those labels, {fix}"
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
    clf: Any, data: TrainingData, head: HeadOptions = HeadOptions(), progress: Callable[[str], None] = _silent
) -> Head:
    """`learn_head` on a labelled file's rows (`read_training_data`), with the classifier's
    model, prompt and batching (`clf`, e.g. `head_classifier`); the head's info names the
    file and its sha256."""
    trace = Trace(source=data.path, lines=data.lines or None, log=progress)
    gold = [data.labels[i] for i in data.gold]
    learned = learn_head(clf, data.texts, gold, data.labels, head, trace)
    learned.info.update({"data": Path(data.path).name, "data_sha256": data.sha256})
    return learned


def head_classifier(engine: Any, labels: Sequence[str], system: str | None, template: str, **kwargs: Any) -> Any:
    """A classifier that gives features only (`Classifier(..., features_only=True)`): its
    prompt, prefix cache and batch plan give `train_head` its features; no label tokens
    are run or checked, and it classifies nothing."""

    return Classifier(engine, labels, system, template, features_only=True, **kwargs)


def classify_options(plan: Plan) -> dict[str, Any]:
    """How a trained task's classifier batches, as the plan says: what scores held-out texts
    (`--finetune auto`'s comparison, `--none-threshold auto`'s choice) on the loaded engine."""
    return {
        "batch_size": plan.batch_size,
        "max_batch_tokens": plan.max_batch_tokens,
        "use_prefix_cache": plan.use_prefix_cache,
        "truncate": plan.truncate,
        # a question's own classifier (`train --decisions`): DATA's control tokens read as text, as served
        **({"controls_as_text": True} if plan.controls_as_text else {}),
    }


@dataclass(frozen=True)
class TrainRun:
    """One `train` run as its front end resolved it, read by every way of training (a head,
    several heads, a fine-tune, `--finetune auto`): DATA's path; the plan (the model, the prompt
    as typed with its labels still to fill, the batching, how DATA is read, where the task is
    saved); the labels given (None: the data's own) and their descriptions; the few-shot
    examples' file; how a head is chosen; "none of these"; the files the run reads (none of
    which an output may be)."""

    data: str
    plan: Plan
    labels: tuple[str, ...] | None = None
    descriptions: Mapping[str, str] | None = None
    examples_file: str | None = None
    head: HeadOptions = HeadOptions()
    none: NoneRule = NoneRule()
    reads: tuple[tuple[str, str], ...] = ()

    def read(self, need: tuple[int, str] | None = None, what: str = "a head") -> TrainingData:
        """DATA read and checked (`read_training_data`), before the model loads."""
        return read_training_data(
            self.data, self.labels, spec=self.plan.read, folds=self.head.folds, need=need, what=what
        )

    def prompt(self, data: TrainingData) -> Plan:
        """The plan with DATA's labels filled into its system message as typed (`Plan.with_labels`,
        the one place a system message gets its labels) and its template checked as typed (every
        {word}, {{ }} literal braces)."""
        plan = self.plan.with_labels(data.labels, self.descriptions, typed=True)
        return replace(plan, template=check_template(plan.template))


def labelled_plan(plan: Plan, labels: Sequence[str], examples: Sequence[Any] = (), features_only: bool = False) -> Plan:
    """`plan` scoring `labels` (with few-shot `examples`): a features-only classifier's for a
    head (its hidden states, no label tokens run), and the labels a trained task saves."""
    kind = arguments(labels=tuple(labels), examples=examples, features_only=features_only, truncate=plan.truncate)
    return plan.with_kind(kind)


def trained_task(plan: Plan, engine: Any, section: Any) -> Task:
    """The task a training run saves: the plan's model (as named, pinned to these weights),
    prompt, labels and examples, and what was learned (`section`: a head, fine-tuned adapters,
    or heads as questions)."""
    assert plan.model is not None  # a training run names its model
    return Task(
        model=plan.model.name,
        labels=plan.labels,
        system=plan.system,
        template=plan.template,
        examples=plan.examples,
        weights_sha256=engine.weights_sha256,
        versions=versions(),
        section=section,
        system_in_user_turn=folds_system(engine.tokenizer, plan.system),
    )


def _prefixed(say: Callable[[str], None]) -> Callable[[str], None]:
    """A step's message as the CLI says it (`mlx-slm: ...`)."""
    return lambda m: say(f"mlx-slm: {m}")


def run_train(run: TrainRun, say: Callable[[str], None] = _silent, engine: Engine | None = None) -> tuple[Any, str]:
    """The `train` command: read the data (before the model loads: its problems fail first),
    fit the head, apply "none of these", save the task. Returns (the `Task`, the per-layer
    table as text); `say` takes each step's message. `engine`: one already loaded for the plan's
    model (`train --decisions --head-prompt question`: the one that will answer with the head)."""

    check_folds(run.head.folds)
    data = run.read()
    plan = run.prompt(data)
    examples = read_examples(run.examples_file, data.labels) if run.examples_file else ()
    plan = labelled_plan(plan, data.labels, examples, features_only=True)
    progress = _prefixed(say)
    if engine is None:
        progress(f"loading {plan.model}")
        engine = Engine.load(plan.model)
    head = train(Classifier(engine, plan=plan), data, run.head, progress)
    task = trained_task(plan, engine, HeadSettings(head))
    # "None of these": its threshold chosen on held-out data, before anything is written.
    task = run.none.apply(task, engine, say, **classify_options(plan))
    task.save(plan.save_task)
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


def run_train_fields(run: TrainRun, fields: Sequence[str], say: Callable[[str], None] = _silent) -> tuple[Any, str]:
    """`train --label-field A --label-field B ...`: one head per gold field, from one pass over
    the texts (every head's candidate layers together, the forward stopped at the deepest),
    saved as a task of questions (each head a question named by its field) that `classify
    --task` runs, and that `--questions` can add zero-shot questions to. The prompt is the
    plan's, a questions' prompt (the front end gives the default system "You answer questions
    about a text ...", template `Text: {text}`, unless typed): the heads read the text's own
    prompt, which zero-shot questions continue."""

    check_folds(run.head.folds)  # before the one feature pass, as the single head's entry checks it
    _check_fields(fields)
    datas = [read_training_data(run.data, None, spec=run.plan.read.with_gold(f), folds=run.head.folds) for f in fields]
    plan = replace(
        run.plan,
        system=check_plain_system(run.plan.system),
        template=check_template(run.plan.template, placeholders=("text", "question")),
    )
    progress = _prefixed(say)
    progress(f"loading {plan.model}")
    engine = Engine.load(plan.model)
    clf = Classifier(engine, plan=labelled_plan(plan, datas[0].labels, features_only=True))
    heads = _field_heads(clf, fields, datas, run.head, progress)
    try:
        qs = check_questions([Question(f, "", "head", h.labels, head=h) for f, h in zip(fields, heads)])
    except QuestionError as e:
        raise TrainError(f"--label-field: {e} (the field names the head's question: rename the field)") from None
    task = trained_task(plan.with_kind(KindArgs()), engine, QuestionsSettings(tuple(qs)))
    task.save(plan.save_task)
    return task, "\n\n".join(f"== {f}\n{format_table(h)}" for f, h in zip(fields, heads))


def _field_heads(
    clf: Any, fields: Sequence[str], datas: list[TrainingData], head: HeadOptions, progress: Callable[[str], None]
) -> list[Head]:
    """One head per field (`datas`: each field's gold labels of the same texts), from one
    feature pass over the texts to the deepest layer any head's candidates need."""
    n = len(clf.model.layers)
    spec = parse_layers(head.layers, n) if head.layers is None or isinstance(head.layers, str) else list(head.layers)
    wanted = sorted(set(spec) | ({head.layer} if head.layer else set()))
    every = sorted({x for c in candidates(wanted, n, poolings=head.poolings) for x in c.layers})
    progress(
        f"features: {len(datas[0].texts)} texts, layers {', '.join(map(str, every))}, once for {len(fields)} heads"
    )
    feats, errors, st = clf.features(datas[0].texts, every, window=head.window, poolings=head.poolings)

    def cached(_clf: Any, texts: Sequence[str], want: Sequence[int], pools: Sequence[str], *_: Any) -> Any:
        cols = [every.index(x) for x in want]  # the one pass's layers, as each head asks for them
        return {p: feats[p][:, cols] for p in pools}, errors, st

    heads = []
    for f, data in zip(fields, datas):
        progress(f"head for {f!r}: {len(data.labels)} labels")
        trace = Trace(source=data.path, lines=data.lines, log=progress, extract=cached)
        gold = [data.labels[i] for i in data.gold]
        learned = learn_head(clf, data.texts, gold, data.labels, replace(head, layers=spec), trace)
        learned.info.update({"data": Path(data.path).name, "data_sha256": data.sha256, "gold_field": f})
        heads.append(learned)
    return heads


__all__ = [
    "HeadOptions",
    "TrainError",
    "TrainRun",
    "TrainingData",
    "Trace",
    "candidate_name",
    "candidates",
    "check_folds",
    "default_layers",
    "fit_head",
    "head_classifier",
    "labelled_plan",
    "learn_head",
    "parse_layers",
    "read_training_data",
    "run_train",
    "run_train_fields",
    "train",
    "train_head",
    "trained_task",
]
