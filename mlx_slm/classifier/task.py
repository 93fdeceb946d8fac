"""The saved task: everything that defines a classifier, in one JSON file.

`--save-task task.json` writes it; `--task task.json` (and `Classifier.from_task`) reads
it back. It names the model and pins its weights by hash (a prior fitted for one set of
weights means nothing for another), and holds the labels, prompt, scoring, few-shot
examples, calibration (a fitted prior, or the method to fit on each input) and the
confidence threshold, with the library versions that made it. The service and the
scale-out runner take the same file. A task from `mlx-slm train` also holds a learned
head (`heads.Head`: weights with their sha256, layers, standardisation, labels, the
cross-validation table, the training data's sha256).
"""

from __future__ import annotations

import difflib
import json
import os
from dataclasses import InitVar, asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from .. import kinds
from ..ground.jsonfiles import utc_now, write_json_atomic
from ..ground.ranges import RANGES
from ..ground.textfiles import InputError, check_json_text, has_lone_surrogate, json_error, read_text_file
from ..kinds import KindArgs, KindSettings, KindSpec, ModelFacts, arguments, read_task, spec_of
from ..kinds.base import TaskError, bad_field
from ..kinds.finetune import FineTunedSettings
from ..kinds.head import HeadSettings
from ..kinds.questions import QuestionsSettings
from ..text.calibration import DEFAULT_WARMUP, CalibrationError, CalibrationSpec, Calibrator
from ..text.decisions.errors import DecisionError
from ..text.decisions.files import questions_of
from ..text.decisions.settings import DecisionConfig, temperature_problem
from ..text.heads import Head
from ..text.labels import MODES, label_problem
from ..text.prompts import DEFAULT_LABELS, DEFAULT_SYSTEM, DEFAULT_TEMPLATE
from ..text.questions import Question
from ..weights.registry import ModelRef
from .plan import Plan

FORMAT = "mlx-slm.task"
VERSION = 1


@dataclass(frozen=True)
class Task:
    model: str
    labels: tuple[str, ...]
    system: str | None
    template: str
    scoring: str = "auto"
    examples: tuple[tuple[str, str], ...] = ()
    # A `CalibrationSpec` (given as anything `CalibrationSpec.of` takes); its warm-up is `warmup`.
    calibration: CalibrationSpec | Calibrator | str = "none"
    warmup: int = DEFAULT_WARMUP
    min_confidence: float | None = None
    weights_sha256: str | None = None
    versions: dict[str, str] = field(default_factory=dict, compare=False)
    # The kind's own section (`kinds.KindSettings`, typed): a learned head, several questions, a
    # sequence classifier's recorded head, a reranker's scorer, fine-tuned adapters; None for
    # zero-shot labels (whose fields are the task's own: labels, scoring, examples).
    section: KindSettings | None = field(default=None, compare=False)
    # "None of these" (`train --none-label`): {"label": the label that means it (answered as no
    # label, abstained), "min_confidence": how the task's `min_confidence` was chosen (target and the
    # held-out figures), or null when given}; None for a task that answers every text with a label.
    none: dict[str, Any] | None = field(default=None, compare=False)
    # Typed decisions (`eval --decisions Q --fit --save-task`, `train --decisions`): {"questions": the
    # questions as given (a System One object or an OpenAI list), "methods": each fitted or trained
    # question's method bound to its digest (`text.decisions.methods.Method.to_dict`), and, in tasks of
    # before, "temperatures": {question key: T}}; `decide --task` and `serve --task` answer with them
    # (`classifier.decision_plan.task_methods`). None for a task without them.
    decisions: dict[str, Any] | None = field(default=None, compare=False)
    # The model's chat template refuses a system turn, so the system text was put at the start of the
    # first user turn (`prompts.refuses_system`): a record, written when true (rendering finds it again).
    system_in_user_turn: bool = field(default=False, compare=False)
    # The Python API's names for two sections (`Task(..., head=head)`, `questions=(...)`, as
    # `Classifier` takes them): given at construction, kept as the section (read back: `head`, `questions`).
    head: InitVar[Head | None] = None
    questions: InitVar[tuple[Question, ...] | None] = None
    # The folder of the task file it was read from (its adapters file is named relative to it); not saved.
    home: str | None = field(default=None, compare=False, repr=False)

    def __post_init__(self, head: Head | None, questions: tuple[Question, ...] | None) -> None:
        object.__setattr__(self, "calibration", CalibrationSpec.of(self.calibration, warmup=self.warmup))
        # Read by the one translator (`kinds.arguments`), as `Classifier(head=..., questions=...)` is;
        # given both, the head is the section, as it always was (the table lists its settings last).
        given = arguments(head=head, questions=questions or None).own
        if not given:
            return
        own = given[-1]
        if self.section is None:
            object.__setattr__(self, "section", own)
        elif self.section != own:  # (`dataclasses.replace` passes them back as they are read: the same)
            raise TypeError("give the task's head or questions, or its section, not both")

    def plan(self, model: ModelRef | None = None, **run: Any) -> Plan:
        """The run this task defines, resolved (`Plan.of`): its prompt, kind, calibration and
        threshold, on `model` (default: the task's own, as named) with the run settings `run`
        (`batch_size`, `truncate`, ...) as `Classifier` takes them."""
        cal = {"calibration": self.calibration, "min_confidence": self.min_confidence, "warmup": self.warmup}
        plan = Plan.of(system=self.system, template=self.template, kind=self.kind_args(), **{**cal, **run})
        return replace(plan, model=model or ModelRef(self.model), task=self)

    def kind_args(self) -> KindArgs:
        """What the task says about how it scores, as the kinds table reads it (`kinds.arguments`,
        the one translator: its own fields and its section's, by name)."""
        own = self.section.named(self.home) if self.section is not None else {}
        if self.none is not None:
            own["none_label"] = self.none["label"]
        return arguments(
            ModelFacts(loaded=False), labels=self.labels, scoring=self.scoring, examples=self.examples, **own
        )

    @property
    def finetune(self) -> dict[str, Any] | None:
        """The task's fine-tuned adapters' section (`kinds.finetune`: file, sha256, objective), or None."""
        own = self.section
        return dict(own.source) if isinstance(own, FineTunedSettings) and isinstance(own.source, dict) else None

    @property
    def trained(self) -> str | None:
        """What of the task was trained on its own model, labels and prompt ("fine-tuned adapters",
        "learned head": its own or a head question's), or None for a zero-shot task."""
        own = self.section.trained if self.section is not None else None
        if self.decisions_only:  # no labels, no kind: its decision temperatures pin its weights (`pins_weights`)
            return own
        return own or ("learned head" if self.heads else None)

    @property
    def decisions_fitted(self) -> bool:
        """The task holds decision questions fitted or trained on its weights."""
        sec = self.decisions or {}
        return bool(sec.get("temperatures") or sec.get("methods"))

    @property
    def decisions_only(self) -> bool:
        """A task of typed decisions alone (`eval --decisions --save-task`): no labels and no kind section."""
        return self.decisions is not None and not self.labels and self.section is None

    @property
    def for_decisions(self) -> bool:
        """A task `eval --decisions` or `train --decisions` saved: its questions and methods, with the
        default labels and prompt only so a server can load it as a classifier too."""
        if self.decisions_only:
            return True
        default = (tuple(DEFAULT_LABELS), DEFAULT_SYSTEM, DEFAULT_TEMPLATE)
        return bool(self.decisions) and self.section is None and (self.labels, self.system, self.template) == default

    @property
    def kind(self) -> KindSpec:
        """The kind the task file holds, read from its fields by the kinds table (`kinds.spec_of`;
        a classifier made of it chooses on its model: `Classifier.from_task`)."""
        return spec_of(self.kind_args())

    @property
    def heads(self) -> list[Head]:
        """Every learned head the task holds (its own, or its head questions')."""
        return self.kind.heads

    @property
    def pins_weights(self) -> bool:
        """A fitted prior or a learned head means something for the weights it was fitted on only."""
        fitted = self.calibration.fitted or self.trained is not None  # type: ignore[union-attr]
        return fitted or self.decisions_fitted

    def to_dict(self, path: str | os.PathLike | None = None) -> dict[str, Any]:
        """The task file's JSON object (`path`: where it is saved; a kind names its files beside it)."""
        d = asdict(replace(self, section=None))
        del d["section"], d["home"]
        if self.none is None:
            del d["none"]
        if self.decisions is None:
            del d["decisions"]
        if not self.system_in_user_turn:
            del d["system_in_user_turn"]
        d["labels"] = list(self.labels)
        d["examples"] = [{"text": t, "label": lab} for t, lab in self.examples]
        if not self.decisions_only:
            d.update(self.kind.to_task(path))  # the kind's own section (a head, questions) goes last
        d["calibration"] = self.calibration.to_dict()  # type: ignore[union-attr]
        return {"format": FORMAT, "version": VERSION, "created": utc_now(), **d}

    @classmethod
    def from_dict(cls, d: Any, where: str = "task") -> Task:
        """A task from its JSON object, every field's type and value checked: a `TaskError`
        names the file (`where`), the field and the fix; nothing else is raised."""
        _check_format(d, where)
        labels = _prompt_fields(d, where)
        scoring, warmup, mc, sha, versions = _run_fields(d, where)
        spec = _calibration(d, where, labels, warmup)
        section = read_task(d, where, labels, spec)  # the kind's own fields, each checked by the kind
        section["none"] = _none_field(d, where, labels)
        section["decisions"] = _decisions_field(d, where)
        return cls(
            model=d["model"],
            labels=tuple(labels),
            system=d.get("system"),
            template=d["template"],
            scoring=scoring,
            calibration=spec,
            warmup=warmup,
            min_confidence=mc,
            weights_sha256=sha,
            versions=versions,
            system_in_user_turn=_folded(d, where),
            **section,
        )

    def save(self, path: str | os.PathLike) -> None:
        d = self.to_dict(path)
        try:
            write_json_atomic(path, d)
        except OSError as e:
            raise TaskError(f"cannot write the task file {path} ({e.strerror})") from None

    @classmethod
    def load(cls, path: str | os.PathLike) -> Task:
        """Read a task file; any problem (unreadable, not UTF-8, not JSON, a field of the wrong
        type or value) is a `TaskError` naming the file, the line or field, and the fix."""

        try:
            text = read_text_file(str(path), "task file")
        except InputError as e:
            raise TaskError(str(e)) from None
        try:
            d = json.loads(text)
        except (ValueError, RecursionError) as e:  # JSONDecodeError, an over-long integer, nesting too deep
            raise TaskError(
                f"task file {path} is not valid JSON ({json_error(e, line=True)}): fix it, "
                "or save the task again (--save-task)"
            ) from None
        try:  # every string of it UTF-8 text (questions' wordings, descriptions, ...): named by its line
            check_json_text(d, f"task file {path}", text)
        except InputError as e:
            raise TaskError(str(e)) from None
        return replace(cls.from_dict(d, f"task file {path}"), home=str(Path(path).resolve().parent))

    def check_weights(self, weights_sha256: str | None, model: str | None = None, *, by_name: bool = False) -> None:
        """The task's prior (or head) was fitted on its weights: refuse to apply it to others.
        `model`: the name of the model loaded (the one whose `weights_sha256` it is); without it,
        "the model loaded" (never the task's own `model`, whose weights are the other sha256).
        `by_name`: `model` is the name as the run was given it, so a task that records no sha256
        (edited by hand, or saved from an engine without a path) must at least name that model."""
        if self.weights_sha256 and weights_sha256 and weights_sha256 != self.weights_sha256:
            what, fix = self._fitted_what()
            raise TaskError(
                f"the task's {what} on weights sha256 {self.weights_sha256[:12]}... ({self.model}), but "
                f"{'the model loaded' + (f' ({model})' if model else '')} has {weights_sha256[:12]}...: "
                f"it does not carry over; {fix}"
            )
        if by_name and not self.weights_sha256 and weights_sha256 and model and not _same_model(model, self.model):
            what, fix = self._fitted_what()
            raise TaskError(
                f"the task's {what} on the model {self.model!r}, and it records no weights sha256 "
                f"(weights_sha256) to show that the model loaded ({model}) has the same weights: it does not "
                f"carry over to other weights; load {self.model!r}, or {fix}"
            )

    def _fitted_what(self) -> tuple[str, str]:
        """What of the task was fitted on its weights, and how to make it again (a refusal's words)."""
        own = self.section.weights_note() if self.section is not None else None
        if own is not None:
            return own
        if self.decisions_fitted and not self.calibration.fitted and _decisions_trained(self):  # type: ignore[union-attr]
            fix = "train them again (mlx-slm train DATA --decisions Q.json --gold-field ... --save-task ...)"
            return "decision questions were trained", fix
        if self.decisions_fitted and not self.calibration.fitted:  # type: ignore[union-attr]
            return (
                "decision questions were fitted",
                "fit them again (mlx-slm eval GOLD --decisions Q.json --fit --save-task ...)",
            )
        if not self.calibration.fitted:  # type: ignore[union-attr]
            return "head was trained", "train it again (mlx-slm train ... --save-task)"
        return "prior was fitted", "recalibrate (--calibrate ... --save-task)"


def _same_model(a: str, b: str) -> bool:
    """Two model names that name one model: equal, or paths to one folder."""
    a, b = os.path.expanduser(a), os.path.expanduser(b)
    return a == b or (os.path.exists(a) and os.path.exists(b) and os.path.samefile(a, b))


def _decisions_trained(task: Task) -> bool:
    """Some of the task's decision questions were trained (a head or a classifier of their own)."""
    methods = (task.decisions or {}).get("methods", [])
    return any(isinstance(m, dict) and (m.get("head") or m.get("tuned")) for m in methods)


def check_decision_settings(task: Task, config: DecisionConfig, model: str | None = None) -> None:
    """The task's fitted or head-trained questions were made under the model's decision settings
    (decision.json's labels and temperatures for their types, the template): under others their raw
    answers differ, so the methods do not carry over (refused, as other weights are). A question
    answered by its own classifier reads none of them; tasks of before record none: not checked."""
    sec = task.decisions or {}
    was = sec.get("settings")
    if not task.decisions_fitted or not isinstance(was, dict):
        return
    methods = [m for m in sec.get("methods", []) if isinstance(m, dict)]
    keys = {m.get("key") for m in methods if not m.get("tuned")} | set(sec.get("temperatures") or {})
    try:
        types = sorted({q.type for q in questions_of(sec["questions"], config) if q.key in keys})
    except DecisionError:
        return  # the questions themselves are refused where they are read (`task_methods`)
    old, now = DecisionConfig.asked(was, types), DecisionConfig.asked(config.to_record(template=False), types)
    if not types or old == now:
        return
    diff = {k: (old[k], now[k]) for k in old if old[k] != now[k]}
    said = "; ".join(f"{k}: {a!r} then, {b!r} now" for k, (a, b) in diff.items())
    what, fix = ("trained", "train them again") if _decisions_trained(task) else ("fitted", "fit them again")
    raise TaskError(
        f"the task's decision questions were {what} under other decision settings than "
        f"{'the model loaded' + (f' ({model})' if model else '')} reads (a model folder's decision.json and "
        f"decision_template.jinja; {said}): the raw answers differ, so they do not carry over; {fix} with this "
        "model, or use the model folder they were made with"
    )


def _head(self: Task) -> Head | None:
    """The task's learned head, when its kind is one (`kinds.head`)."""
    return self.section.head if isinstance(self.section, HeadSettings) else None


def _questions(self: Task) -> tuple[Question, ...]:
    """The task's questions, when it asks several (`kinds.questions`); () otherwise."""
    return tuple(self.section.questions) if isinstance(self.section, QuestionsSettings) else ()


# Read back as properties; set after the dataclass is made, whose __init__ takes the two names as InitVars.
Task.head = property(_head)  # type: ignore[assignment,method-assign]
Task.questions = property(_questions)  # type: ignore[assignment,method-assign]


# --------------------------------------------------------------------------- reading a task file, field by field

# Every field a task file may hold (what `Task.to_dict` writes): any other is refused, so a
# misspelt one (`min_confidance`) is not ignored without a word.
FIELDS = (
    "format",
    "version",
    "created",
    "model",
    "labels",
    "system",
    "template",
    "scoring",
    "examples",
    "calibration",
    "warmup",
    "min_confidence",
    "weights_sha256",
    "versions",
    "none",
    "decisions",
    "system_in_user_turn",
)


def fields() -> tuple[str, ...]:
    """Every field a task file may hold: the task's own (`FIELDS`) and each kind's section's."""
    return FIELDS + tuple(dict.fromkeys(f for k in kinds.KINDS for f in k.task_fields))  # the table as it is now


def _check_format(d: Any, where: str) -> None:
    """An mlx-slm task object of a version this reads, with no field it does not know."""
    if not isinstance(d, dict) or d.get("format") != FORMAT:
        raise TaskError(f'{where} is not an mlx-slm task file (no "format": "{FORMAT}")')
    version = d.get("version", VERSION)
    if isinstance(version, bool) or not isinstance(version, int):
        raise TaskError(
            f"{where}: field 'version' must be an integer, got {version!r}: fix it (this mlx-slm writes {VERSION})"
        )
    if version > VERSION:
        raise TaskError(f"{where} is task format version {version}; this mlx-slm reads up to {VERSION}: upgrade it")
    known = fields()
    for key in d:
        if key not in known:
            close = difflib.get_close_matches(str(key), known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise TaskError(
                f"{where}: unknown field {str(key)[:60]!r}{hint}: fix its name or remove it "
                f"(a task file holds {', '.join(known)})"
            )


def _prompt_fields(d: dict[str, Any], where: str) -> list[str]:
    """Model, labels, system and template checked; the labels."""
    for key in ("model", "template"):
        if not isinstance(d.get(key), str) or not d[key].strip():
            raise bad_field(d, where, key, "a non-empty string")
    labels = d.get("labels")

    # the labels' form only: a task with questions has none (validate runs when a classifier is made)
    if not isinstance(labels, list) or any(label_problem(x) is not None for x in labels):
        raise bad_field(d, where, "labels", 'a list of non-empty strings, e.g. ["billing", "technical"]')
    if d.get("system") is not None and not isinstance(d["system"], str):
        raise bad_field(d, where, "system", "a string or null")
    if "{text}" not in d["template"]:
        raise bad_field(d, where, "template", "a string with a {text} placeholder")
    for key in ("model", "template", "system"):
        if isinstance(d.get(key), str) and has_lone_surrogate(d[key]):
            raise TaskError(f"{where}: field {key!r} holds an unpaired surrogate escape (not valid Unicode): fix it")
    if any(has_lone_surrogate(x) for x in labels):
        raise TaskError(f"{where}: field 'labels' holds an unpaired surrogate escape (not valid Unicode): fix it")
    return labels


def _run_fields(d: dict[str, Any], where: str) -> tuple[str, int, float | None, str | None, dict[str, str]]:
    """Scoring, warm-up, confidence threshold, weights' sha256 and versions, checked."""

    scoring = d.get("scoring", "auto")
    if scoring not in MODES:
        raise bad_field(d, where, "scoring", f"one of {', '.join(MODES)}")

    warmup = d.get("warmup", DEFAULT_WARMUP)
    if RANGES["warmup"].problem(warmup):
        raise bad_field(d, where, "warmup", f"{RANGES['warmup'].describe()} (the default is {DEFAULT_WARMUP})")
    mc = d.get("min_confidence")
    if RANGES["min_confidence"].problem(mc):
        raise bad_field(d, where, "min_confidence", f"{RANGES['min_confidence'].describe()}, or null")
    sha = d.get("weights_sha256")
    if sha is not None and not isinstance(sha, str):
        raise bad_field(d, where, "weights_sha256", "a string (the weights' sha256) or null")
    versions = d.get("versions", {})
    if not isinstance(versions, dict):
        raise bad_field(d, where, "versions", "an object")
    return scoring, warmup, None if mc is None else float(mc), sha, versions


def _folded(d: dict[str, Any], where: str) -> bool:
    """The record that the system text went into the user turn (`Task.system_in_user_turn`)."""
    got = d.get("system_in_user_turn", False)
    if not isinstance(got, bool):
        raise bad_field(d, where, "system_in_user_turn", "true or false")
    return got


def _none_field(d: dict[str, Any], where: str, labels: list[str]) -> dict[str, Any] | None:
    """The task's "none of these" section: its label one of the task's labels, or null (its
    `min_confidence` alone answers "none", as chosen on held-out data: `min_confidence` says how)."""
    none = d.get("none")
    if none is None:
        return None
    if not isinstance(none, dict) or not isinstance(none.get("label", 0), (str, type(None))):
        raise bad_field(d, where, "none", 'an object {"label": the label that means none of these, ...} or null')
    if none["label"] is not None and none["label"] not in labels:
        raise TaskError(f"{where}: field 'none' names the label {none['label']!r}, not one of the task's labels")
    return dict(none)


# The model's decision settings a task's questions were fitted or trained under (`DecisionConfig.
# to_record(template=False)`: compared where they change the raw answers): tasks of before have none.
SETTINGS = ("settings",)


def decisions_section(raw_questions: Any, methods: list[dict[str, Any]], config: DecisionConfig) -> dict[str, Any]:
    """A task's `decisions` field: the questions as given, each method, and the decision settings
    (a model folder's decision.json: labels, temperatures, template) they were made under."""
    return {"questions": raw_questions, "methods": methods, "settings": config.to_record(template=False)}


def _decisions_field(d: dict[str, Any], where: str) -> dict[str, Any] | None:
    """The task's typed decisions: their questions (as given; read by `text.decisions` where they are
    used), each fitted question's method (read with the model's decision settings by
    `decision_plan.task_methods`), and a task of before's temperatures per question key."""
    sec = d.get("decisions")
    if sec is None:
        return None
    shape = '{"questions": {...} or [...], "methods": [...]}'
    if not isinstance(sec, dict) or set(sec) - {"questions", "methods", "temperatures", "fit", *SETTINGS}:
        raise bad_field(d, where, "decisions", f"an object {shape}")
    qs = sec.get("questions")
    if not isinstance(qs, (dict, list)) or not qs:
        raise bad_field(d, where, "decisions", f"an object {shape} whose questions are not empty")
    temps, methods = sec.get("temperatures", {}), sec.get("methods", [])
    if not isinstance(temps, dict) or not isinstance(methods, list):
        raise bad_field(d, where, "decisions", f"an object {shape}")
    for key, t in temps.items():
        why = temperature_problem(t)
        if why is not None:
            raise TaskError(
                f"{where}: field 'decisions': the temperature of question {str(key)[:60]!r} {why}: fit it again "
                "(mlx-slm eval ... --decisions Q.json --fit --save-task)"
            )
    fit = sec.get("fit", {})
    if not isinstance(fit, dict):
        raise bad_field(d, where, "decisions", f"an object {shape}")
    out = {"questions": qs, "methods": methods, "temperatures": {str(k): float(t) for k, t in temps.items()}}
    if "settings" in sec:
        got = sec["settings"]
        temps = got.get("temperature", {}) if isinstance(got, dict) else None
        if not (
            isinstance(got, dict)
            and isinstance(got.get("labels", {}), dict)
            and isinstance(temps, dict)
            and all(temperature_problem(t) is None for t in temps.values())
        ):
            raise bad_field(
                d, where, "decisions", 'an object whose "settings" is the decision settings it was made under, as saved'
            )
        out["settings"] = got
    return {**out, "fit": fit} if fit else out


def _calibration(d: dict[str, Any], where: str, labels: list[str], warmup: int) -> CalibrationSpec:
    """The calibration (a method, or a prior fitted for these labels)."""
    cal = d.get("calibration", "none")
    if not isinstance(cal, dict) and cal not in ("none", "batch"):
        raise bad_field(d, where, "calibration", "'none', 'batch' or a fitted calibrator")
    try:
        spec = CalibrationSpec.from_dict(cal, warmup)
    except CalibrationError as e:
        raise TaskError(f"{where}: field 'calibration': {e}: save the task again") from None
    fitted = spec.calibrator
    if fitted is not None and list(fitted.labels) != labels:
        raise TaskError(
            f"{where}: field 'calibration' was fitted for the labels {list(fitted.labels)}, but the task's "
            f"labels are {labels}: recalibrate (--calibrate ... --save-task)"
        )
    return spec
