"""The command line's plan: options and a task file resolved once into a `classifier.Plan`.

`TaskOptions` are the options classify, eval, serve and rerank share, as typed (a task file
fills in those not given). `resolve` turns them into one frozen `Plan` (the model reference,
the prompt with its labels filled, the kind's settings, calibration, run and batch settings,
how inputs are read); every step after reads it: `load` (the classifier, checked), `fit`
(--calibration-data: a new plan), `describe`, `settings` (the manifest's) and `save_task`.
Nothing here knows about click or about output files. User errors are `UserError`s
(`UsageError` for options that do not go together); notes go to the `say` the front end
gives (the CLI's `cli.base.notice`), so nothing here prints.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..classifier.classifier import Classifier
from ..classifier.decider import DeciderSettings
from ..classifier.decision_plan import DecisionPlan, task_methods
from ..classifier.pipeline import DEFAULT_BATCH_SIZE
from ..classifier.plan import Plan
from ..classifier.task import Task, TaskError
from ..engine.state_cache import STATE_CACHE
from ..files.formats import KNOWN_EXTENSIONS, guess_format
from ..files.readers import ReadSpec, gold_problem, read_label_descriptions, read_rows
from ..ground.errors import ModelError, UsageError
from ..ground.ranges import check_all
from ..kinds import FineTunedSettings, KindArgs, arguments
from ..models import BACKBONE_NO_LM_HEAD, embeds_only
from ..text.calibration import DEFAULT_WARMUP, CalibrationError, CalibrationSpec, Calibrator
from ..text.decisions.errors import DecisionError
from ..text.decisions.files import load_questions_file, questions_of
from ..text.decisions.fitting import priors_apply
from ..text.decisions.methods import Method, Methods
from ..text.decisions.prompt import names
from ..text.decisions.questions import DecisionQuestion
from ..text.decisions.settings import DecisionConfig
from ..text.labels import NotItsLabels, parse_labels
from ..text.prompts import (
    DEFAULT_LABELS,
    DEFAULT_SYSTEM,
    DEFAULT_TEMPLATE,
    DESCRIPTIONS_PLACEHOLDER,
    check_plain_system,
    check_template,
    folds_system,
    read_examples,
)
from ..text.questions import DEFAULT_SYSTEM as QUESTIONS_SYSTEM
from ..text.questions import DEFAULT_TEMPLATE as QUESTIONS_TEMPLATE
from ..text.questions import QuestionError, check_questions, read_questions
from ..weights.convert import versions
from ..weights.registry import DEFAULT_MODEL, ModelRef

Say = Callable[[str], None]  # where a front end's notes go: one line each (the CLI: stderr)


@dataclass
class TaskOptions:
    """What defines the task and how to run it; the names are the CLI's parameter names.
    `given`: the names set on the command line (a --task file fills in the others)."""

    task_file: str | None = None
    model: str = DEFAULT_MODEL
    labels_csv: str | None = ",".join(DEFAULT_LABELS)
    labels_file: str | None = None
    system: str = DEFAULT_SYSTEM
    template: str = DEFAULT_TEMPLATE
    examples_file: str | None = None
    questions_file: str | None = None
    calibrate: str = "none"
    calibration_data: str | None = None
    warmup: int = DEFAULT_WARMUP
    min_confidence: float | None = None
    threshold: float | None = None  # a multi-label sequence classifier's answer threshold
    reranker: str | None = None  # score (text, pair) as (query, document) relevance (`kinds.rerank`)
    instruction: str | None = None  # the qwen3 reranker's instruction
    save_task: str | None = None
    fmt: str | None = None
    text_field: str = "text"
    id_field: str = "id"
    text_column: str = "text"
    id_column: str = "id"
    pair_field: str = "text_pair"  # JSONL/Parquet: a second text, read where a row has it
    pair_column: str | None = None  # CSV/TSV: the column of a second text (none unless named)
    gold_field: str = "label"
    batch_size: int | None = None
    max_batch_tokens: int | None = None
    window: int = 1024
    no_sort: bool = False
    no_prefix_cache: bool = False
    scoring: str = "auto"
    truncate: str | None = None
    dtype: str | None = None
    keep_quantized: bool | None = None
    quiet: bool = False
    given: frozenset[str] = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        check_all(vars(self))

    def read_spec(self) -> ReadSpec:
        """How these options read an input (`files.readers.ReadSpec`): an id column named on the
        command line must exist (no silent fall-back to line numbers); the second text's rule
        is `ReadSpec.for_input`'s, once the input is known."""
        return ReadSpec(
            self.fmt,
            self.text_field,
            self.id_field,
            self.text_column,
            self.id_column,
            id_required="id_column" in self.given,
            pair_field=self.pair_field,
            pair_column=self.pair_column,
            pair_typed=frozenset({"pair_field", "pair_column"} & self.given),
            gold_field=self.gold_field,
        )

    def model_ref(self) -> ModelRef:
        """The model these options name, and how to load it (--dtype, --keep-quantized)."""
        return ModelRef(self.model, self.dtype, self.keep_quantized)

    def read_pair(self, path: str | None) -> dict[str, Any]:
        """`read_rows`' old `pair` and `pair_required` keywords for `path` (`ReadSpec.for_input`)."""
        spec = self.read_spec().for_input(path)
        return {"pair": spec.pair, "pair_required": spec.pair_required}


def flag_names(names: set[str]) -> str:
    """Parameter names as the options a person typed: labels_csv -> --labels."""
    return ", ".join("--" + k.replace("_csv", "").replace("_file", "").replace("_", "-") for k in sorted(names))


def descriptions_note(system: str | None, descriptions: dict[str, str]) -> str | None:
    """Descriptions from --labels-file reach the model only through {label_descriptions} in
    --system: the note that says so when they would be dropped without a word (or None)."""

    if any(descriptions.values()) and DESCRIPTIONS_PLACEHOLDER not in (system or ""):
        return (
            "mlx-slm: note: --labels-file gives label descriptions, but --system has no {label_descriptions}: "
            "the model does not see them (add it, e.g. --system 'What the labels mean:\\n{label_descriptions}')"
        )
    return None


@dataclass(frozen=True)
class CommandLabels:
    """The labels a command was given, read once: `labels` (None when neither --labels nor
    --labels-file was given: train then takes the data's own) and their descriptions."""

    labels: list[str] | None
    descriptions: dict[str, str]

    def fill(self, system: str | None, typed: bool = True) -> str | None:
        """`system` with {labels} and {label_descriptions} filled in, as `Plan.with_labels` fills
        them (the one place): as typed (--system, or a command's default), or a task's (`typed=False`)."""
        return Plan(system=system).with_labels(self.labels or [], self.descriptions, typed).system


def read_labels(
    labels_csv: str | None,
    labels_file: str | None,
    system: str | None = None,
    say: Say | None = None,
) -> CommandLabels:
    """A command's labels: --labels-file (a label a line, with its description; it wins over
    --labels) or --labels (comma-separated). With `say`, a note when the descriptions would
    not reach the model through `system`."""

    descriptions: dict[str, str] = {}
    if labels_file:
        descriptions = read_label_descriptions(labels_file)  # a BOM dropped; bad UTF-8 names its line
        labels: list[str] | None = list(descriptions)
    else:
        labels = parse_labels(labels_csv) if labels_csv is not None else None
    note = descriptions_note(system, descriptions)
    if say is not None and note:
        say(note)
    return CommandLabels(labels, descriptions)


def _as_the_task(o: TaskOptions, t: Any) -> set[str]:
    """The defining options typed with the task's own value (the same model, labels, prompt or
    scoring): they change nothing the task's prior or head was fitted for, so they are not "changed"."""

    def same_model(a: str, b: str) -> bool:
        return a == b or (os.path.exists(a) and os.path.exists(b) and os.path.samefile(a, b))

    same = {
        "model": same_model(o.model, t.model),
        "system": (o.system or None) == (t.system or None),
        "template": o.template == t.template,
        "scoring": o.scoring == t.scoring,
        "labels_csv": o.labels_csv is not None and not o.labels_file and parse_labels(o.labels_csv) == list(t.labels),
    }
    return {k for k, v in same.items() if v}


def _check_head_options(given: frozenset[str], tuned: bool = False) -> None:
    """A task with a learned head (or fine-tuned adapters, `tuned`): its model, labels and prompt
    are what it was trained on."""
    what, again = ("fine-tuned adapters", "fine-tune again (mlx-slm train DATA --finetune lora --save-task TASK)")
    if not tuned:
        what, again = "learned head", "train a new head (mlx-slm train DATA ... --save-task TASK)"
    changed = {"model", "labels_csv", "labels_file", "system", "template", "examples_file"} & given
    if changed:
        raise UsageError(
            f"the task's {what} {'were' if tuned else 'was'} trained on its own model, labels and prompt; with "
            f"{flag_names(changed)} changed {'they' if tuned else 'it'} no longer apply: {again}"
            if tuned
            else f"the task's learned head was trained on its own model, labels and prompt; with "
            f"{flag_names(changed)} changed it no longer applies: {again}"
        )
    if {"calibrate", "calibration_data"} & given:
        raise UsageError(
            f"calibration does not apply to a task with {'fine-tuned adapters' if tuned else 'a learned head'} (its "
            "probabilities are fitted on labelled data already): drop --calibrate/--calibration-data; "
            f"--min-confidence works on {'its' if tuned else 'the head' + chr(39) + 's'} probabilities"
        )


def _load_error(e: Exception, plan: Plan) -> Exception:
    """A load's error said of where its cause came from: a task whose model (its `model` field,
    not --model) is not where the task says names the field and the fix (--model at the weights'
    new place); labels a classifier does not have name their source (--labels, or the task's
    edited `labels` field)."""
    task, given, model = plan.task, plan.given, plan.model.name if plan.model is not None else ""
    if isinstance(e, NotItsLabels):
        if {"labels_csv", "labels_file"} & given or task is None:
            return UsageError(e.where("the labels of --labels", "drop --labels"))
        return UsageError(
            e.where(f"the labels of --task {plan.task_file} (its labels field)", "restore the field as it was saved")
        )
    if task is None or "model" in given or not str(e).startswith(f"{model}:"):
        return e
    pin = f" (the same weights: sha256 {task.weights_sha256[:12]}...)" if task.weights_sha256 else ""
    return ModelError(
        f"--task {plan.task_file}: its model field names {task.model!r}, which cannot be loaded ({e}): give the "
        f"model's new place with --model PATH{pin}, or edit the task's model field"
    )


def resolve(options: TaskOptions, say: Say, decisions_ok: bool = False) -> Plan:
    """The plan these options (and their --task file) say, resolved once: labels or questions
    read, the prompt checked and its labels filled, the options a task cannot take refused,
    every scoring option said by name to `kinds.arguments`. Notes go to `say` unless quiet.
    A decision task (`Task.for_decisions`) is refused unless `decisions_ok` (a server, which
    answers its questions on the decision routes): its labels are placeholders, not a classifier."""
    o = options
    task = Task.load(o.task_file) if o.task_file else None
    if task is not None and task.for_decisions and not decisions_ok:
        raise UsageError(
            f"--task {o.task_file} is a decision task (saved by eval --decisions or train --decisions): its "
            f"questions are answered by mlx-slm decide INPUT --task {o.task_file} (or serve --task); this command "
            "needs a labels task (mlx-slm train DATA --save-task T)"
        )
    taken = _take_task(o, task) if task is not None else _Taken(CalibrationSpec.of(o.calibrate))
    o = taken.options or o
    if o.questions_file or taken.questions is not None:
        system, template, questions = _read_questions(o, task, taken.questions)
        prompt = _Prompt(system, template, taken.labels, taken.examples, questions)
        calibration = CalibrationSpec.of(taken.calibration, warmup=o.warmup)  # batch: a prior per question
    else:
        prompt = _labels_prompt(o, taken, say)
        calibration = CalibrationSpec.of(taken.calibration, warmup=o.warmup)
        _check_calibration_data(o, calibration)
    _check_warmup(o, calibration)
    return Plan(
        model=o.model_ref(),
        system=prompt.system or None,
        template=prompt.template,
        kind=_kind_args(o, task, prompt),
        labels_filled=prompt.filled,
        calibration=calibration,
        min_confidence=o.min_confidence,
        warmup=o.warmup,
        batch_size=o.batch_size or DEFAULT_BATCH_SIZE,
        max_batch_tokens=o.max_batch_tokens or "auto",
        sort=not o.no_sort,
        use_prefix_cache=not o.no_prefix_cache,
        truncate=o.truncate,
        window=o.window,
        read=o.read_spec(),
        task_file=o.task_file,
        task=task,
        origin=taken.origin,
        save_task=o.save_task,
        quiet=o.quiet,
        calibration_data=o.calibration_data,
        given=options.given,
    )


@dataclass(frozen=True)
class _Taken:
    """What a task file gives the options (`_take_task`): the options with its values filled in
    where none was typed, its labels (None: typed here), questions, examples and calibration,
    and where that calibration's prior comes from."""

    calibration: CalibrationSpec
    options: TaskOptions | None = None
    labels: list[str] | None = None
    questions: tuple[Any, ...] | None = None
    examples: Any = ()
    origin: str = "here"


@dataclass(frozen=True)
class _Prompt:
    """The prompt resolved: the system message (labels filled in when `filled`), the template,
    the labels, examples and questions."""

    system: str | None
    template: str
    labels: list[str] | None
    examples: Any = ()
    questions: Any = None
    filled: bool = False


def _take_task(o: TaskOptions, t: Task) -> _Taken:
    """Fill in what the command line did not give from the task file."""
    same = _as_the_task(o, t)  # `--model M` naming the task's own model changes nothing
    if "model" in o.given and "model" not in same and t.weights_sha256:
        # The task's weights elsewhere (a copy, a moved folder): the same weights carry everything the
        # task learned, so they are compared by sha256 once loaded (`load`: `Task.check_weights`).
        same.add("model")
    given = o.given - same
    defining = {"model", "labels_csv", "labels_file", "system", "template", "examples_file", "scoring"} & given
    if t.trained is not None:  # a head or adapters, trained on the task's own model, labels and prompt
        _check_head_options(given, tuned=isinstance(t.section, FineTunedSettings))
    if t.calibration.fitted and defining and "calibrate" not in given:
        raise UsageError(
            f"the task's calibration prior was fitted for its own model and prompt; with {flag_names(defining)} "
            "changed it no longer applies: add --calibrate none|batch|fit to recalibrate"
        )
    take = {
        "model": t.model,
        "labels_csv": None,
        "system": t.system or "",
        "template": t.template,
        "scoring": t.scoring,
        "min_confidence": t.min_confidence,
        "warmup": t.warmup,
    }
    # --model kept as typed: its own path
    filled = {k: v for k, v in take.items() if k not in given and not (k == "model" and k in o.given)}
    return _Taken(
        calibration=t.calibration if "calibrate" not in given else CalibrationSpec.of(o.calibrate),
        options=replace(o, **filled),
        labels=list(t.labels) if not ({"labels_csv", "labels_file"} & given) else None,
        questions=tuple(t.questions or ()) or None,
        examples=t.examples if "examples_file" not in given else (),
        origin="task" if t.calibration.fitted and "calibrate" not in given else "here",
    )


def _labels_prompt(o: TaskOptions, taken: _Taken, say: Say) -> _Prompt:
    """One question, its labels: the template checked as typed, the labels read (or the task's),
    the system message filled (`Plan.with_labels`, the one place), the examples read."""
    template = o.template
    if "template" in o.given:  # as typed: every {word} checked, {{ }} literal braces
        words = ("text", "pair", "query") if o.reranker == "question" else ("text", "pair")
        template = check_template(o.template, placeholders=words)
    labels, system, filled = taken.labels, o.system, False
    if labels is None:
        got = read_labels(o.labels_csv, o.labels_file, o.system, None if o.quiet else say)
        labels = got.labels
        # Filled here, so the saved task, the manifest and Ray's workers all hold the message the model saw.
        system, filled = got.fill(o.system, typed="system" in o.given), True
    elif "system" in o.given:  # the task's labels, a message typed here
        system, filled = Plan(system=o.system).with_labels(labels, typed=True).system, True
    examples = read_examples(o.examples_file, labels) if o.examples_file else taken.examples
    return _Prompt(system, template, labels, examples, None, filled)


def _check_calibration_data(o: TaskOptions, calibration: CalibrationSpec) -> None:
    """--calibrate fit|em needs --calibration-data, and --calibration-data needs one of them."""
    if calibration.needs_data and not o.calibration_data:
        raise UsageError(f"--calibrate {calibration.method} needs --calibration-data FILE (labelled texts)")
    if o.calibration_data and not calibration.needs_data:  # it would be read by nothing
        raise UsageError(
            f"--calibration-data is fitted by --calibrate fit or em only (here: {calibration.method}): add --calibrate "
            "fit|em, or drop --calibration-data"
        )


def _check_warmup(o: TaskOptions, calibration: CalibrationSpec) -> None:
    """--warmup is how many items --calibrate batch|em fits each input's prior on: with any other
    calibration (none, fit, a task's fitted prior) nothing reads it, so it is refused as
    --calibration-data is, not ignored."""
    if "warmup" in o.given and not calibration.per_input:
        what = "the task's fitted prior" if calibration.fitted and "calibrate" not in o.given else calibration.method
        raise UsageError(
            f"--warmup sets how many items --calibrate batch or em fits its prior on; this run's calibration "
            f"({what}) has no warm-up: add --calibrate batch|em, or drop --warmup"
        )


def check_data_fields(o: TaskOptions, fields: Collection[str]) -> None:
    """The field options that, on the command run, only say where --calibration-data holds its
    texts and gold labels (`fields`: classify's --gold-field; serve's text, pair and gold fields):
    without --calibration-data nothing reads them, so they are refused, not ignored."""
    typed = set(fields) & o.given
    if typed and not o.calibration_data:
        names = flag_names(typed)
        raise UsageError(
            f"{names} {'names' if len(typed) == 1 else 'name'} where --calibration-data holds its texts and gold "
            f"labels, and this run has no --calibration-data: drop {names}, or add --calibration-data FILE "
            "(with --calibrate fit|em)"
        )


# The field options each format reads: JSONL and Parquet name fields, CSV/TSV columns, text neither.
_FORMAT_FIELDS = {
    "text_field": ("jsonl", "parquet"),
    "id_field": ("jsonl", "parquet"),
    "text_column": ("csv",),
    "id_column": ("csv",),
}
_FORMAT_NAMES = {"jsonl": "JSONL", "csv": "CSV/TSV", "parquet": "Parquet", "text": "plain text"}


def check_format_fields(o: TaskOptions, paths: Sequence[str | None]) -> None:
    """A field option typed for a format that no file of the run has (`paths`: the files read
    with these options, INPUT and --calibration-data): --text-column on JSONL reads nothing, as
    --text-field on a CSV does, so it is refused naming the option that does, not ignored. A file
    whose format shows only in its bytes (stdin, an unknown extension) is not judged."""
    typed = sorted(set(_FORMAT_FIELDS) & o.given)
    if not typed:
        return
    fmts = set()
    for p in filter(None, paths):
        ext = "" if p == "-" else Path(p).suffix.lower()
        if not o.fmt and ext not in KNOWN_EXTENSIONS:
            return
        fmts.add(o.fmt or guess_format(p))
    for name in typed:
        if fmts & set(_FORMAT_FIELDS[name]):
            continue
        flag, what = flag_names({name}), "a CSV/TSV column" if name.endswith("column") else "a JSONL/Parquet field"
        other = name.replace("_column", "_field") if name.endswith("column") else name.replace("_field", "_column")
        fix = "drop it" if fmts == {"text"} else f"use {flag_names({other})}, or drop {flag}"
        said = " and ".join(_FORMAT_NAMES[f] for f in sorted(fmts))
        raise UsageError(f"{flag} names {what}, and this run reads {said} only: {fix}")


def _read_questions(o: TaskOptions, task: Task | None, asked: Any) -> tuple[str | None, str, Any]:
    """--questions (added to a task's own, if any): each question carries its labels; the
    label-scoring options do not apply. The system message, template and questions."""
    clash = {"labels_csv", "labels_file", "examples_file", "scoring", "truncate", "calibration_data"} & o.given
    if o.calibrate not in ("none", "batch"):
        raise UsageError(
            f"--calibrate {o.calibrate} with several questions is not supported yet: use --calibrate batch "
            "(a prior per question, from the input itself) or none"
        )
    if clash:
        raise UsageError(
            f"--questions does not go with {flag_names(clash)}: each question carries its own labels"
            + ("" if clash & {"labels_csv", "labels_file"} else " (not supported with --questions yet)")
        )
    if task is not None and not task.questions:
        raise UsageError(
            f"--task {o.task_file} asks one question (its labels): --questions goes with a task of questions "
            "(saved by classify --questions --save-task, or train --label-field A --label-field B)"
        )
    questions = asked
    if o.questions_file:
        more = read_questions(o.questions_file)  # its own problems name the file and line
        try:  # with the task's own, if any (`more` alone was checked as it was read)
            questions = check_questions([*(asked or ()), *more])
        except QuestionError as e:
            raise QuestionError(f"--questions {o.questions_file} with the task's questions: {e}") from None
    # As typed: every {word} checked ({text} and {question} in the template), {{ }} literal braces;
    # otherwise the task's, or the defaults for questions.
    system, template = o.system, o.template
    if "system" in o.given:
        system = check_plain_system(o.system)
    elif task is None:
        system = QUESTIONS_SYSTEM
    if "template" in o.given:
        template = check_template(o.template, placeholders=("text", "question"))
    elif task is None:
        template = QUESTIONS_TEMPLATE
    return system, template, questions


def _kind_args(o: TaskOptions, task: Task | None, p: _Prompt) -> KindArgs:
    """What the options and the task file say about scoring, through the one translator
    (`kinds.arguments`): the task's section (its kind's own settings, by name), the options
    typed over it. The kind is chosen once, on the model (`Classifier.from_plan`)."""
    named: dict[str, Any] = {}
    if task is not None and task.section is not None:
        named.update(task.section.named(task.home))
    if task is not None and task.none is not None and p.labels is not None:
        named["none_label"] = task.none["label"]  # the task's "none of these", its labels kept
    named.update(
        labels=tuple(p.labels or ()),
        scoring=o.scoring,
        examples=tuple(p.examples),
        truncate=o.truncate,
        threshold=o.threshold,
        questions=p.questions,
        **_reranker(o, task, p),
    )
    # A system message or template typed here: a sequence classifier takes it as a chat prompt.
    typed = {"system": p.system, "template": p.template}
    named.update({k: v for k, v in typed.items() if k in o.given and k not in named})
    return arguments(**named)


def _reranker(o: TaskOptions, task: Task | None, p: _Prompt) -> dict[str, Any]:
    """A reranker's settings, from the options or the task (the question scorer takes the prompt typed)."""
    section = task.section if task is not None else None
    r = section.named() if section is not None else {}
    if "reranker" not in r:
        r = {}  # not a reranker's task
    # --reranker typed wins; else the task's scorer; else the command's default (rerank's auto)
    scorer = o.reranker if "reranker" in o.given or not r else r.get("reranker")
    if scorer is None:
        if o.instruction is not None:
            raise UsageError("--instruction is the qwen3 reranker's: add --reranker qwen3, or drop it")
        return {}
    # the kind takes the prompt typed here (or the task's), or refuses it by name (`kinds.rerank.TAKES`)
    own = r if r.get("reranker") == scorer else {}  # the task's settings go with its own scorer
    out: dict[str, Any] = {"reranker": scorer, "instruction": o.instruction or own.get("instruction")}
    out["system"] = p.system if "system" in o.given else own.get("system")
    out["template"] = p.template if "template" in o.given else own.get("template")
    return out


# ---------------------------------------------------------------------- what reads the plan
def load(plan: Plan, embeds_only_ok: bool = False) -> Classifier:
    """The plan's classifier, loaded (`Classifier.from_plan`). `embeds_only_ok`: a model that
    embeds only (a bare backbone, no LM head: a features-only classifier) is served (`serve`: its
    embedding routes) rather than refused as a classifier. The run's calibration and
    --min-confidence are refused where the kind chosen on the model cannot apply them."""
    try:
        clf = Classifier.from_plan(plan)
    except (ModelError, NotItsLabels) as e:
        raise _load_error(e, plan) from None
    if embeds_only(clf.engine.model) and not clf.spec.classifies and not embeds_only_ok:  # no head given
        raise ModelError(BACKBONE_NO_LM_HEAD)
    task = plan.task
    if task is not None and (plan.origin == "task" or task.trained is not None):  # same weights only
        assert plan.model is not None
        task.check_weights(clf.engine.weights_sha256, plan.model.name, by_name=True)
    return clf


def load_fitted(plan: Plan, say: Say, embeds_only_ok: bool = False) -> tuple[Plan, Classifier]:
    """`load`, then --calibration-data fitted (`fit`): the plan to run with, and its classifier."""
    clf = load(plan, embeds_only_ok)
    return fit(plan, clf, say), clf


def fit(plan: Plan, clf: Classifier, say: Say) -> Plan:
    """The plan with per-label offsets fitted on --calibration-data (`fit`, and `em`'s base), or
    the plan as it is when its calibration needs no labelled data."""
    spec, path, gold = plan.calibration, plan.calibration_data, plan.read.gold_field
    if not spec.needs_data:
        return plan
    assert path is not None  # `resolve` refused fit|em without it
    # Read as --calibration-data always was: its own format, its ids not required, the gold field.
    read = replace(plan.read.for_input(path), fmt=None, id_required=False).with_gold()
    rows = list(read_rows(path, read))
    for r in rows:
        why = r.error or gold_problem(r, clf.labels, gold)
        if why:
            raise CalibrationError(f"--calibration-data {path}: {why}")
    if not rows:
        raise CalibrationError(f"--calibration-data {path} is empty: give it labelled texts (text and {gold})")
    fitted = clf.fit_calibration(
        [r.item for r in rows],
        [str(r.gold) for r in rows],
        spec,
        window=plan.window,
        source=f"--calibration-data {path}",
        lines=[r.line for r in rows],
    )
    i = fitted.calibrator.info if fitted.calibrator is not None else {}
    if not plan.quiet:
        if i.get("cv_accuracy_raw") is not None:
            say(
                f"mlx-slm: fitted on {len(rows)} labelled items; {i['folds']}-fold cross-validated accuracy "
                f"{100 * i['cv_accuracy_raw']:.1f} % raw -> {100 * i['cv_accuracy_calibrated']:.1f} % calibrated"
            )
        else:
            say(f"mlx-slm: fitted on {len(rows)} labelled items ({i.get('cv_note', 'no cross-validation')})")
    return plan.with_calibration(fitted, "here")


def calibration_run(plan: Plan, clf: Classifier, on_fit: Callable[[Calibrator], None] | None = None) -> Any:
    """The per-run calibration (and abstain) the plan says, of the classifier's predictions."""
    return clf.calibration_run(plan.calibration, plan.min_confidence, on_fit)


def describe(plan: Plan, run: Any) -> str:
    """The summary's words for a run's calibration (how it was fitted, where its prior came from)."""
    c = run.calibrator
    if run.method == "none":
        return "no calibration (raw scores)"
    if hasattr(run, "priors"):  # several questions: a prior per question
        if not run.fitted_here:
            return f"{run.method} calibration per question (too few items to fit priors: raw scores)"
        return f"{run.method} calibration per question (priors from the first {run.n} items of this input)"
    if run.method in ("batch", "em") and c is None:
        return f"{run.method} calibration (too few items to fit a prior: raw scores)"
    if run.fitted_here:
        return f"{run.method} calibration (prior from the first {c.n} items of this input)"
    where = {"task": "the task's saved prior", "resume": "the prior the interrupted run fitted"}.get(
        plan.origin, "fitted on --calibration-data"
    )
    # Only `fit` learns from labels; batch (and em's re-estimate) from the input's own items.
    if c.method == "fit":
        return f"{run.method} calibration ({where}, {c.n} labelled items)"
    source = "of this input" if plan.origin == "resume" else "of the input it was fitted on"
    return f"{run.method} calibration ({where}, from the first {c.n} items {source}, no labels)"


def settings(plan: Plan, clf: Classifier) -> dict[str, Any]:
    """The run's settings an output's manifest records: the kind's, and the calibration."""
    return {
        **clf.spec.manifest(clf.mode),
        "calibration": plan.calibration.record(),
        "min_confidence": plan.min_confidence,
        **({"system_in_user_turn": True} if folds(clf) else {}),
    }


def folds(clf: Classifier) -> bool:
    """Whether the prompts carry the system text in the user turn (the model's chat template
    refuses a system role: `prompts.refuses_system`), for the manifest and the task to record."""
    return folds_system(clf.engine.tokenizer, clf.format.system)


def save_task(plan: Plan, clf: Classifier, run: Any, say: Say) -> None:
    """The plan's task saved to --save-task (if given), with the calibration this run ended with."""
    path = plan.save_task
    if not path:
        return
    assert plan.model is not None
    cal = run.result()  # em keeps its base: later inputs re-estimate their own mix
    t = Task(
        model=plan.model.name,
        system=plan.system,
        template=plan.template,
        calibration=cal,
        warmup=plan.warmup,
        min_confidence=plan.min_confidence,
        weights_sha256=clf.engine.weights_sha256,
        versions=versions(),
        system_in_user_turn=folds(clf),
        **clf.spec.task_kwargs(clf.mode),
    )
    t.save(path)
    if not plan.quiet:
        say(f"mlx-slm: task saved to {path} ({run.method + ' prior' if cal.applies else 'no calibration'})")


# --------------------------------------------------------------------------- typed decisions


@dataclass(frozen=True)
class DecisionOptions:
    """What `decide`, `eval --decisions` and `serve` take for typed decisions, as typed (the CLI's
    parameter names): the model, a task, the questions (none for `serve`), how each question is
    answered beyond the raw letters (`style`, `permute`, `calibrate` and its `warmup`), the state
    cache and what is refused. `given`: the names set on the command line (a task fills the model)."""

    model: str = DEFAULT_MODEL
    dtype: str | None = None
    keep_quantized: bool | None = None
    task_file: str | None = None
    questions_file: str | None = None
    style: str = "letters"
    permute: int = 1
    calibrate: str = "none"
    warmup: int = DEFAULT_WARMUP
    state_cache: int = STATE_CACHE
    refuse: str | None = None
    given: frozenset[str] = field(default_factory=frozenset)
    prefix: str = ""  # the method options' prefix as the command names them (serve's: --decision-style, ...)

    def __post_init__(self) -> None:
        check_all({k: v for k, v in vars(self).items() if k in ("warmup", "state_cache")})


def resolve_decisions(o: DecisionOptions, need_questions: bool = True, batch_ok: bool = True) -> DecisionPlan:
    """The options and a task resolved once into a `DecisionPlan` (its questions read with the
    default decision settings: `DecisionPlan.loaded` reads them again only for a model whose own
    decision.json changes how they read). Options that would change nothing are refused, not
    ignored: --warmup without --calibrate batch, --permute 2 with no choice question to reorder, a
    style, order count or prior where the task answers every question with its own method.
    `batch_ok`: whether the front end can find a batch prior (a file run can; a server, whose
    requests come one by one, answers with a task's fitted prior instead)."""
    task = Task.load(o.task_file) if o.task_file else None
    model = task.model if task is not None and "model" not in o.given else o.model
    calibrate = f"--{o.prefix}calibrate"
    if o.calibrate == "batch" and not batch_ok:
        raise UsageError(
            f"{calibrate} batch needs a run of many states to find the prior in; a server answers one request at a "
            "time: fit the prior on a sample of your states (mlx-slm eval STATES.jsonl --decisions Q.json "
            f"--fit-prior --save-task T) and serve --task T, or use {calibrate} contextual"
        )
    if "warmup" in o.given and o.calibrate != "batch":
        raise UsageError("--warmup sets how many states the batch prior is found on: it needs --calibrate batch")
    try:
        default = Method(style=o.style, permute=o.permute, prior=o.calibrate)
    except DecisionError as e:
        raise UsageError(str(e)) from None
    raw, questions = None, ()
    if o.questions_file is not None:
        raw, questions = load_questions_file(o.questions_file, DecisionConfig())
    elif task is not None and task.decisions:
        raw = task.decisions["questions"]
        questions = questions_of(raw, DecisionConfig())
    elif need_questions:
        raise UsageError("give the questions: --questions Q.json (or a --task saved with eval --decisions --save-task)")
    try:
        methods = task_methods(task, DecisionConfig(), Methods(default=default))
    except TaskError as e:  # a hand-edited method: the file named
        raise TaskError(f"task file {o.task_file}: {e}") from None
    # a server's requests bring their own questions (a task's are only some it may be asked)
    _refuse_unused(o, questions if need_questions else (), methods)
    ref = ModelRef(model, o.dtype, o.keep_quantized)
    settings = DeciderSettings(state_cache=o.state_cache)
    return DecisionPlan(ref, DecisionConfig(), questions, raw, methods, o.warmup, settings, o.refuse, task)


def _refuse_unused(o: DecisionOptions, questions: Sequence[DecisionQuestion], methods: Methods) -> None:
    """A style, order count or prior that none of the run's `questions` would be asked with is
    refused, not ignored (the manifest would record it, and a --resume without it be refused for
    nothing): --permute 2 with no choice, or where the task answers each choice; every question
    answered by the task's own method; the names style where no question the task leaves has names
    to read (a noul reads Yes/No either way)."""
    default = methods.default
    calibrate, permute, style = f"--{o.prefix}calibrate", f"--{o.prefix}permute", f"--{o.prefix}style"
    if o.permute != 1 and questions and not any(q.type == "choice" for q in questions):
        raise UsageError(f"{permute} 2 reorders a choice's options: none of these questions is a choice; drop it")
    open_ = [q for q in questions if q.digest not in methods.saved]  # asked with the run's own settings
    if questions and not default.is_raw and not open_:
        used = [
            f
            for f, on in (
                (style, o.style != "letters"),
                (permute, o.permute != 1),
                (calibrate, o.calibrate != "none"),
                ("--warmup", "warmup" in o.given),
            )
            if on
        ]
        raise UsageError(
            f"{', '.join(used)} {'sets' if len(used) == 1 else 'set'} how questions the task does not answer are "
            "asked; the task answers every one of "
            "these with its own fitted or trained method: drop them (or fit the task again)"
        )
    if not questions:
        return
    if default.permute != 1 and not any(q.type == "choice" for q in open_):
        raise UsageError(
            f"{permute} {default.permute} reorders the options of a choice the task does not answer; the task "
            "answers every choice here with its own fitted or trained method: drop it"
        )
    if default.style == "names" and not any(names(q) is not None for q in open_):
        which = "the questions the task does not answer" if len(open_) < len(questions) else "these questions"
        raise UsageError(
            f"{style} names asks for the options' own names: {which} are nouls (read as Yes/No in either "
            "style) or scores without distinct level names; drop it"
        )
    apart = [q for q in open_ if not priors_apply(q.answer_names())]
    if default.prior != "none" and apart:  # refused now, not as every row's error
        raise UsageError(
            f"{calibrate} {default.prior}: question {apart[0].key!r}'s options {list(apart[0].answer_names())[:8]} "
            "differ only in surrounding spaces, and a prior is kept by option name: give each option once, or ask "
            f"without {calibrate}"
        )
