"""One task set-up for every command: options and a task file to a classifier's settings.

`TaskOptions` are the settings classify, eval, serve and train share (a task file fills in
those not given); `Setup` resolves them into labels, prompt, examples and a
`CalibrationSpec`, loads the classifier and fits --calibration-data. It sits above the
classifier, the task file and the file readers, and below the front ends (`cli/`, `job.py`):
nothing here knows about click or about output files. User errors are `UserError`s
(`UsageError` for options that do not go together); notes go to the `say` the front end
gives (the CLI's `cli.base.notice`), so nothing here prints.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from ..classifier.classifier import Classifier
from ..classifier.pipeline import DEFAULT_BATCH_SIZE
from ..classifier.task import Task
from ..files.readers import gold_problem, guess_format, read_label_descriptions, read_rows
from ..ground.errors import ModelError, UsageError
from ..ground.ranges import check_all
from ..kinds import FineTunedSettings, KindArgs, arguments
from ..models import BACKBONE_NO_LM_HEAD, embeds_only
from ..text.calibration import DEFAULT_WARMUP, CalibrationError, CalibrationSpec, Calibrator
from ..text.labels import NotItsLabels, parse_labels
from ..text.prompts import (
    DEFAULT_LABELS,
    DEFAULT_SYSTEM,
    DEFAULT_TEMPLATE,
    DESCRIPTIONS_PLACEHOLDER,
    check_plain_system,
    check_template,
    fill_labels,
    fill_system,
    folds_system,
    read_examples,
)
from ..text.questions import DEFAULT_SYSTEM as QUESTIONS_SYSTEM
from ..text.questions import DEFAULT_TEMPLATE as QUESTIONS_TEMPLATE
from ..text.questions import QuestionError, check_questions, read_questions
from ..weights.convert import versions
from ..weights.registry import DEFAULT_MODEL

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

    def read_args(self) -> tuple[str | None, str, str, str, str]:
        """`io.read_rows`' format and field arguments."""
        return self.fmt, self.text_field, self.id_field, self.text_column, self.id_column

    def read_pair(self, path: str | None) -> dict[str, Any]:
        """`io.read_rows`' `pair` and `pair_required`, the one rule of every command that reads a
        second text: the CSV/TSV column named by --pair-column, else the JSONL/Parquet field
        (--pair-field, default text_pair, read where a row has it). A field or column typed must be
        there (a CSV header's or Parquet schema's column, each JSONL row's field, as `io` checks);
        an option the input's format cannot use is refused by name."""

        fmt = self.fmt or (guess_format(path, b"", self.text_column) if path not in (None, "-") else None)
        typed = sorted({"pair_field", "pair_column"} & self.given)
        if fmt == "text" and typed:
            raise UsageError(f"{flag_names(set(typed))}: a text file holds one text a line, no second text: drop it")
        if fmt in ("csv", "tsv"):
            if "pair_field" in typed:
                raise UsageError(
                    "--pair-field names a JSONL/Parquet field; a CSV/TSV's second text is its --pair-column"
                )
            return {"pair": self.pair_column, "pair_required": True}
        return {"pair": self.pair_column or self.pair_field, "pair_required": bool(typed)}


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


def run_settings(o: TaskOptions) -> dict[str, Any]:
    """How the model runs, the same for every command that loads one (classify, eval, serve,
    train): the options as `Classifier.load` and `train.run_train` take them."""

    return {
        "dtype": o.dtype,
        "dequantize": None if o.keep_quantized is None else not o.keep_quantized,
        "batch_size": o.batch_size or DEFAULT_BATCH_SIZE,
        "max_batch_tokens": o.max_batch_tokens or "auto",
        "use_prefix_cache": not o.no_prefix_cache,
        "truncate": o.truncate,
    }


@dataclass(frozen=True)
class CommandLabels:
    """The labels a command was given, read once: `labels` (None when neither --labels nor
    --labels-file was given: train then takes the data's own) and their descriptions."""

    labels: list[str] | None
    descriptions: dict[str, str]

    def fill(self, system: str | None, typed: bool = True) -> str | None:
        """`system` with {labels} and {label_descriptions} filled in. As typed (--system, or a
        command's default): every {word} checked, {{ }} literal braces; a task's message
        (`typed=False`) is filled as it is."""
        fill = fill_system if typed else fill_labels
        return fill(system, self.labels or [], self.descriptions)


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
    import os

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


def _load_error(e: Exception, o: TaskOptions, task: Any, given: frozenset[str]) -> Exception:
    """A load's error said of where its cause came from: a task whose model (its `model` field,
    not --model) is not where the task says names the field and the fix (--model at the weights'
    new place); labels a classifier does not have name their source (--labels, or the task's
    edited `labels` field)."""
    if isinstance(e, NotItsLabels):
        if {"labels_csv", "labels_file"} & given or task is None:
            return UsageError(e.where("the labels of --labels", "drop --labels"))
        return UsageError(
            e.where(f"the labels of --task {o.task_file} (its labels field)", "restore the field as it was saved")
        )
    if task is None or "model" in given or not str(e).startswith(f"{o.model}:"):
        return e
    pin = f" (the same weights: sha256 {task.weights_sha256[:12]}...)" if task.weights_sha256 else ""
    return ModelError(
        f"--task {o.task_file}: its model field names {task.model!r}, which cannot be loaded ({e}): give the "
        f"model's new place with --model PATH{pin}, or edit the task's model field"
    )


class Setup:
    """What classify, eval and serve share: the options (with a task file's values filled
    in), the loaded classifier, and the calibration to run with (`calibration`). Its notes
    (descriptions the model does not see, the calibration fit, the task saved) go to `say`,
    unless the options are quiet."""

    def __init__(self, options: TaskOptions, say: Say):
        o = self.o = replace(options)
        self.say = say
        self.task: Any = None
        self.origin = "here"  # where the calibrator comes from: "here" (fitted in this run), "task", "resume"
        given = self.given = options.given
        # An id column named on the command line must exist (no silent fall-back to line numbers).
        self.id_required = "id_column" in given
        self.labels: list[str] | None = None
        self.examples: Any = ()
        self.questions: Any = None
        self.calibration = CalibrationSpec.of(o.calibrate)
        if o.task_file:
            self._take_task(o.task_file)
        if o.questions_file or self.questions is not None:
            self._read_questions()
            self.kind_args = self._kind_args()
            return
        self.calibration = CalibrationSpec.of(self.calibration, warmup=o.warmup)
        if "template" in given:  # as typed: every {word} checked, {{ }} literal braces
            words = ("text", "pair", "query") if o.reranker == "question" else ("text", "pair")
            o.template = check_template(o.template, placeholders=words)
        if self.labels is None:
            self._read_labels()
        elif "system" in given:  # the task's labels, a message typed here
            o.system = fill_system(o.system, self.labels)
        if o.examples_file:
            self.examples = read_examples(o.examples_file, self.labels)
        if self.calibration.needs_data and not o.calibration_data:
            raise UsageError(f"--calibrate {self.calibration.method} needs --calibration-data FILE (labelled texts)")
        if o.calibration_data and not self.calibration.needs_data:  # it would be read by nothing
            raise UsageError(
                f"--calibration-data is fitted by --calibrate fit or em only (here: {self.calibration.method}): add --calibrate "
                "fit|em, or drop --calibration-data"
            )
        self.kind_args = self._kind_args()

    def _kind_args(self) -> KindArgs:
        """What the options and the task file say about scoring, through the one translator
        (`kinds.arguments`): the task's section (its kind's own settings, by name), the options
        typed over it. The kind is chosen once, on the model (`load`: `Classifier`)."""
        o = self.o
        named: dict[str, Any] = {}
        if self.task is not None and self.task.section is not None:
            named.update(self.task.section.named(self.task.home))
        if self.task is not None and self.task.none is not None and self.labels is not None:
            named["none_label"] = self.task.none["label"]  # the task's "none of these", its labels kept
        named.update(
            labels=tuple(self.labels or ()),
            scoring=o.scoring,
            examples=tuple(self.examples),
            truncate=o.truncate,
            threshold=o.threshold,
            questions=self.questions,
            **self._reranker(),
        )
        # A system message or template typed here: a sequence classifier takes it as a chat prompt.
        named.update({k: getattr(o, k) for k in ("system", "template") if k in self.given and k not in named})
        return arguments(**named)

    def _reranker(self) -> dict[str, Any]:
        """A reranker's settings, from the options or the task (the question scorer takes the prompt typed)."""
        o = self.o
        section = self.task.section if self.task is not None else None
        r = section.named() if section is not None else {}
        if "reranker" not in r:
            r = {}  # not a reranker's task
        # --reranker typed wins; else the task's scorer; else the command's default (rerank's auto)
        scorer = o.reranker if "reranker" in self.given or not r else r.get("reranker")
        if scorer is None:
            if o.instruction is not None:
                raise UsageError("--instruction is the qwen3 reranker's: add --reranker qwen3, or drop it")
            return {}
        # the kind takes the prompt typed here (or the task's), or refuses it by name (`kinds.rerank.TAKES`)
        own = r if r.get("reranker") == scorer else {}  # the task's settings go with its own scorer
        out: dict[str, Any] = {"reranker": scorer, "instruction": o.instruction or own.get("instruction")}
        out["system"] = o.system if "system" in self.given else own.get("system")
        out["template"] = o.template if "template" in self.given else own.get("template")
        return out

    def _take_task(self, path: str) -> None:
        """Fill in what the command line did not give from the task file."""

        o = self.o
        t = self.task = Task.load(path)
        same = _as_the_task(o, t)  # `--model M` naming the task's own model changes nothing
        if "model" in self.given and "model" not in same and t.weights_sha256:
            # The task's weights elsewhere (a copy, a moved folder): the same weights carry everything the
            # task learned, so they are compared by sha256 once loaded (`load`: `Task.check_weights`).
            same.add("model")
        given = self.given - same
        defining = {"model", "labels_csv", "labels_file", "system", "template", "examples_file", "scoring"} & given
        if t.trained is not None:  # a head or adapters, trained on the task's own model, labels and prompt
            _check_head_options(given, tuned=isinstance(t.section, FineTunedSettings))
        if t.calibration.fitted and defining and "calibrate" not in given:
            raise UsageError(
                f"the task's calibration prior was fitted for its own model and prompt; with {flag_names(defining)} "
                "changed it no longer applies: add --calibrate none|batch|fit to recalibrate"
            )
        if t.calibration.fitted and "calibrate" not in given:
            self.origin = "task"
        take = {
            "model": t.model,
            "labels_csv": None,
            "system": t.system or "",
            "template": t.template,
            "scoring": t.scoring,
            "min_confidence": t.min_confidence,
            "warmup": t.warmup,
        }
        for k, v in take.items():
            if k not in given and not (k == "model" and k in self.given):  # --model kept: its own path
                setattr(o, k, v)
        self.labels = list(t.labels) if not ({"labels_csv", "labels_file"} & given) else None
        if t.questions:
            self.questions = tuple(t.questions)
        self.examples = t.examples if "examples_file" not in given else ()
        if "calibrate" not in given:
            self.calibration = t.calibration

    def _read_questions(self) -> None:
        """--questions (added to a task's own, if any): each question carries its labels; the
        label-scoring options do not apply."""

        o = self.o
        clash = {"labels_csv", "labels_file", "examples_file", "scoring", "truncate", "calibration_data"} & self.given
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
        if self.task is not None and not self.task.questions:
            raise UsageError(
                f"--task {o.task_file} asks one question (its labels): --questions goes with a task of questions "
                "(saved by classify --questions --save-task, or train --label-field A --label-field B)"
            )
        if o.questions_file:
            more = read_questions(o.questions_file)  # its own problems name the file and line
            if self.questions:
                try:
                    more = check_questions([*self.questions, *more])
                except QuestionError as e:
                    raise QuestionError(f"--questions {o.questions_file} with the task's questions: {e}") from None
            self.questions = more
        # As typed: every {word} checked ({text} and {question} in the template), {{ }} literal braces;
        # otherwise the task's, or the defaults for questions.
        if "system" in self.given:
            o.system = check_plain_system(o.system)
        elif self.task is None:
            o.system = QUESTIONS_SYSTEM
        if "template" in self.given:
            o.template = check_template(o.template, placeholders=("text", "question"))
        elif self.task is None:
            o.template = QUESTIONS_TEMPLATE

    def _read_labels(self) -> None:
        o = self.o
        got = read_labels(o.labels_csv, o.labels_file, o.system, None if o.quiet else self.say)
        self.labels = got.labels
        # Filled here, so the saved task, the manifest and Ray's workers all hold the message the model saw.
        o.system = got.fill(o.system, typed="system" in self.given)

    def load(self, embeds_only_ok: bool = False) -> Any:
        """The classifier, loaded. `embeds_only_ok`: a model that embeds only (a bare backbone, no
        LM head: a features-only classifier) is served (`serve`: its embedding routes) rather than
        refused as a classifier."""

        o = self.o
        # Kept: --ray workers load the same classifier from these (on their own nodes).
        self.load_kwargs = dict(
            model=o.model,
            system=o.system or None,
            template=o.template,
            kind=self.kind_args,
            **run_settings(o),
            sort=not o.no_sort,
        )
        try:
            self.clf = Classifier.load(**self.load_kwargs)
        except (ModelError, NotItsLabels) as e:
            raise _load_error(e, o, self.task, self.given) from None
        if embeds_only(self.clf.engine.model) and self.clf.head is None and not embeds_only_ok:
            raise ModelError(BACKBONE_NO_LM_HEAD)
        self.kind = self.clf.spec  # chosen once, on the model
        # The run's calibration and --min-confidence, refused where the kind chosen on the model
        # (a multi-label or one-output head, a reranker) cannot apply them, before any work.
        self.kind.check_calibration(self.calibration, o.min_confidence)
        self.weights = self.clf.engine.weights_sha256
        if self.task is not None and (self.origin == "task" or self.task.trained is not None):  # same weights only
            self.task.check_weights(self.weights, o.model)
        if self.calibration.needs_data:
            self.calibration = self._fit(self.calibration)
        return self.clf

    def _fit(self, spec: CalibrationSpec) -> CalibrationSpec:
        """Fit per-label offsets on the labelled sample (`em` then uses them as its base)."""

        o = self.o
        path = o.calibration_data
        rows = list(read_rows(path, None, *self.o.read_args()[1:], gold=o.gold_field, **o.read_pair(path)))
        for r in rows:
            why = r.error or gold_problem(r, self.clf.labels, o.gold_field)
            if why:
                raise CalibrationError(f"--calibration-data {path}: {why}")
        if not rows:
            raise CalibrationError(
                f"--calibration-data {path} is empty: give it labelled texts (text and {o.gold_field})"
            )
        fitted = self.clf.fit_calibration(
            [r.item for r in rows],
            [str(r.gold) for r in rows],
            spec,
            window=o.window,
            source=f"--calibration-data {path}",
            lines=[r.line for r in rows],
        )
        cal = fitted.calibrator
        assert cal is not None
        i = cal.info
        if not o.quiet:
            if i.get("cv_accuracy_raw") is not None:
                self.say(
                    f"mlx-slm: fitted on {len(rows)} labelled items; {i['folds']}-fold cross-validated accuracy "
                    f"{100 * i['cv_accuracy_raw']:.1f} % raw -> {100 * i['cv_accuracy_calibrated']:.1f} % calibrated"
                )
            else:
                self.say(f"mlx-slm: fitted on {len(rows)} labelled items ({i.get('cv_note', 'no cross-validation')})")
        return fitted

    def calibration_run(self, on_fit: Callable[[Calibrator], None] | None = None) -> Any:
        return self.clf.calibration_run(self.calibration, self.o.min_confidence, on_fit)

    def describe(self, run: Any) -> str:
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
            self.origin, "fitted on --calibration-data"
        )
        # Only `fit` learns from labels; batch (and em's re-estimate) from the input's own items.
        if c.method == "fit":
            return f"{run.method} calibration ({where}, {c.n} labelled items)"
        source = "of this input" if self.origin == "resume" else "of the input it was fitted on"
        return f"{run.method} calibration ({where}, from the first {c.n} items {source}, no labels)"

    def settings(self) -> dict[str, Any]:
        """The run's settings an output's manifest records: the kind's, and the calibration."""
        return {
            **self.clf.spec.manifest(self.clf.mode),
            "calibration": self.calibration.record(),
            "min_confidence": self.o.min_confidence,
            **({"system_in_user_turn": True} if self.folds_system else {}),
        }

    @property
    def folds_system(self) -> bool:
        """Whether the prompts carry the system text in the user turn (the model's chat template
        refuses a system role: `prompts.refuses_system`), for the manifest and the task to record."""
        return folds_system(self.clf.engine.tokenizer, self.clf.format.system)

    def save_task(self, run: Any) -> None:

        path = self.o.save_task
        if not path:
            return
        cal = run.result()  # em keeps its base: later inputs re-estimate their own mix
        t = Task(
            model=self.o.model,
            system=self.o.system or None,
            template=self.o.template,
            calibration=cal,
            warmup=self.o.warmup,
            min_confidence=self.o.min_confidence,
            weights_sha256=self.weights,
            versions=versions(),
            system_in_user_turn=self.folds_system,
            **self.clf.spec.task_kwargs(self.clf.mode),
        )
        t.save(path)
        if not self.o.quiet:
            self.say(f"mlx-slm: task saved to {path} ({run.method + ' prior' if cal.applies else 'no calibration'})")
