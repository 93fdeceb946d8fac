"""`Plan`: everything a classification run is, resolved once and never changed.

Every front end resolves its options into one `Plan` (the CLI and a task file through
`jobs.plan.resolve`, the Python API through `Plan.of`, the scikit-learn estimator at fit, a
service request, a Ray worker from the driver's plan) and everything after reads it: loading
(`Classifier.from_plan`), running, the manifest, saving a task. It is frozen; a step that
learns something (calibration fitted on labelled data, a resumed run's prior, the labels filled
into the system message) returns a new plan (`with_calibration`, `with_labels`).

What it holds: the model (`ModelRef`: its name and how it loads), the prompt (system message,
template; the examples and labels in the kind's settings), the kind's settings (`KindArgs`, or
a `KindSpec` made already), the calibration (`CalibrationSpec`) with `min_confidence` and
`warmup`, the run and batch settings, how inputs are read (`files.readers.ReadSpec`), where it
came from (the task file, the calibration's origin) and what to save (`save_task`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..files.readers import ReadSpec
from ..kinds import KindArgs, KindSpec, QuestionsSettings, RunSettings, arguments, scoring_names
from ..text.calibration import DEFAULT_WARMUP, CalibrationSpec, Calibrator
from ..text.prompts import DEFAULT_LABELS, DEFAULT_SYSTEM, DEFAULT_TEMPLATE, TRUNCATE_MODES, fill_labels, fill_system
from ..weights.registry import ModelRef
from .pipeline import DEFAULT_BATCH_SIZE, BatchSettings

# The Python API's run settings (`Classifier(..., batch_size=...)`); every other keyword is a
# scoring argument (`kinds.scoring_names`).
RUN_OPTIONS = (
    "batch_size",
    "max_batch_tokens",
    "sort",
    "use_prefix_cache",
    "truncate",
    "max_length",
    "calibration",
    "min_confidence",
    "warmup",
    "kind",
    "controls_as_text",  # a client's texts (a decision question's own classifier): control tokens read as text
)

_SWITCHES = ("sort", "use_prefix_cache", "controls_as_text")  # the run settings that are True or False

ORIGINS = ("here", "task", "resume")  # where a calibration's prior came from (what `describe` says)


@dataclass(frozen=True)
class Plan:
    """One classification run, resolved (see the module docstring). `model` None: the caller
    gives the engine (`Classifier(engine, ...)`); `labels_filled`: the system message has its
    labels filled in already (`with_labels`, the one place that fills them)."""

    model: ModelRef | None = field(default_factory=ModelRef)
    system: str | None = DEFAULT_SYSTEM
    template: str = DEFAULT_TEMPLATE
    kind: KindArgs | KindSpec = field(default_factory=KindArgs)
    labels_filled: bool = False
    calibration: CalibrationSpec = field(default_factory=CalibrationSpec)
    min_confidence: float | None = None
    warmup: int = DEFAULT_WARMUP
    batch_size: int = DEFAULT_BATCH_SIZE
    max_batch_tokens: int | str | None = "auto"
    sort: bool = True
    use_prefix_cache: bool = True
    empty_ok: bool = False  # an empty text is classified, not an error row (a decision's state: `Decider`)
    controls_as_text: bool = False  # control tokens in the texts read as text (a decision client's: `Decider`)
    truncate: str | None = None
    max_length: int | None = None
    window: int = 1024
    read: ReadSpec = field(default_factory=ReadSpec)
    task_file: str | None = None  # the --task the plan was resolved with
    task: Any = field(default=None, compare=False, repr=False)  # that task, read (`classifier.Task`)
    origin: str = "here"  # where the calibration's prior comes from: one of ORIGINS
    save_task: str | None = None
    quiet: bool = False  # the run's notes (descriptions unseen, a fit, the task saved) are not said
    calibration_data: str | None = None  # the labelled texts `fit`/`em` are fitted on (--calibration-data)
    given: frozenset[str] = frozenset()  # the options a person typed (a load's error names where it came from)

    # ------------------------------------------------------------------ the Python API's resolution
    @classmethod
    def of(
        cls,
        labels: Sequence[str] = DEFAULT_LABELS,
        system: str | None = DEFAULT_SYSTEM,
        template: str = DEFAULT_TEMPLATE,
        **options: Any,
    ) -> Plan:
        """The plan `Classifier(engine, labels, system, template, **options)` runs: the run
        settings (`RUN_OPTIONS`) as given, every other keyword a scoring argument (through
        `kinds.arguments`); a name neither takes is a `TypeError` naming it and the valid ones."""
        unknown = sorted(set(options) - set(RUN_OPTIONS) - scoring_names())
        if unknown:
            valid = ", ".join(sorted({*RUN_OPTIONS, *scoring_names()}))
            raise TypeError(f"unknown argument(s) {', '.join(unknown)}: Classifier takes {valid}")
        run = {k: options.pop(k) for k in RUN_OPTIONS if k in options}
        for k in _SWITCHES:  # "no" or 0 would read as a switch on or off: never guessed
            if k in run and not isinstance(run[k], bool):
                raise TypeError(f"{k} is True or False, not {run[k]!r}")
        truncate = run.get("truncate")
        if truncate is not None and truncate not in TRUNCATE_MODES:
            raise ValueError(f"truncate must be one of {', '.join(TRUNCATE_MODES)} or None, not {truncate!r}")
        kind = run.pop("kind", None)
        if kind is None:
            kind = _arguments(labels, system, template, truncate, options)
        elif options:
            raise TypeError(f"give the scoring arguments in `kind`, not beside it: {', '.join(sorted(options))}")
        warmup = run.pop("warmup", DEFAULT_WARMUP)
        calibration = CalibrationSpec.of(run.pop("calibration", "none"), warmup=warmup)
        return cls(None, system, template, kind, calibration=calibration, warmup=warmup, **run)

    @classmethod
    def loading(cls, **options: Any) -> Plan:
        """The plan `Classifier.load(**options)` runs: the model to load (`ModelRef.take`: its
        name, dtype and the rest of how it loads), and `of`'s for every other keyword."""
        ref, rest = ModelRef.take(options)
        return replace(cls.of(**rest), model=ref)

    # ------------------------------------------------------------------ new plans
    def with_labels(
        self, labels: Sequence[str], descriptions: Mapping[str, str] | None = None, typed: bool = False
    ) -> Plan:
        """This plan with `{labels}` and `{label_descriptions}` filled into its system message: the
        one place that fills them. `typed`: a message a person typed (every `{word}` checked, `{{ }}`
        literal braces: `fill_system`); else a task's or the Python API's, filled as it is."""
        fill = fill_system if typed else fill_labels
        return replace(self, system=fill(self.system, list(labels), descriptions), labels_filled=True)

    def with_calibration(self, spec: CalibrationSpec | Calibrator | str, origin: str = "here") -> Plan:
        """This plan calibrating as `spec` says (fitted on --calibration-data, or a resumed run's
        prior: `origin` says which, for `describe`); a prior or a method runs at the plan's warm-up."""
        if origin not in ORIGINS:
            raise ValueError(f"origin must be one of {', '.join(ORIGINS)}, not {origin!r}")
        if not isinstance(spec, CalibrationSpec):
            spec = CalibrationSpec.of(spec, warmup=self.warmup)
        return replace(self, calibration=spec, origin=origin)

    def with_kind(self, kind: KindArgs | KindSpec) -> Plan:
        """This plan scoring as `kind` says (a `KindSpec` once chosen on the model)."""
        return replace(self, kind=kind)

    def portable(self) -> Plan:
        """This plan without the task file's object (Ray's workers get the plan pickled; what the
        task says is in the plan already)."""
        return replace(self, task=None)

    # ------------------------------------------------------------------ views
    @property
    def labels(self) -> tuple[str, ...]:
        """The labels asked for (none when only questions are asked)."""
        return tuple(self.kind.labels)

    @property
    def questions(self) -> tuple[Any, ...] | None:
        """The questions asked (None: one question, the labels)."""
        if isinstance(self.kind, KindSpec):
            return self.kind.questions
        got = self.kind.get(QuestionsSettings)
        return None if got is None else tuple(got.questions)

    @property
    def examples(self) -> tuple[tuple[str, str], ...]:
        return tuple(getattr(self.kind, "examples", ()))

    @property
    def none_label(self) -> str | None:
        """The label that means "none of these" (answered as no label), if the plan has one."""
        return self.kind.none_label

    def batching(self) -> BatchSettings:
        """How a window's items are cut into batches (the range rule checked)."""
        return BatchSettings.of(self.batch_size, self.max_batch_tokens, self.sort)

    def run_settings(self, max_length: int) -> RunSettings:
        """How a bound kind prepares items; `max_length`: the engine's context, unless the plan caps it."""
        return RunSettings(
            self.truncate, self.max_length or max_length, self.use_prefix_cache, self.empty_ok, self.controls_as_text
        )


def resolved(
    given: Plan | None, labels: Sequence[str], system: str | None, template: str, options: dict[str, Any]
) -> Plan:
    """The plan a `Classifier` runs: the one `given`, or the one its arguments say (`Plan.of`);
    keywords beside a plan given are refused (its settings are all in it)."""
    if given is None:
        return Plan.of(labels, system, template, **options)
    if options:
        raise TypeError(f"give {', '.join(sorted(options))} in the plan, not beside it")
    return given


def _arguments(
    labels: Sequence[str], system: str | None, template: str, truncate: str | None, scoring: dict[str, Any]
) -> KindArgs:
    """`Classifier`'s arguments to the kinds' (`kinds.arguments`): the labels read once (a
    generator would be empty the second time), none when only questions are asked, and the
    prompt passed on only where it is one's own (a sequence classifier takes it as a chat prompt;
    a reranker takes it or refuses it)."""
    if not isinstance(labels, (str, bytes)):
        try:
            labels = tuple(labels)
        except TypeError:
            pass  # the labels kind names what it got
    given = isinstance(labels, (str, bytes)) or labels not in ((), DEFAULT_LABELS)
    own = {"system": system, "template": template}
    typed = {k: v for k, v in own.items() if v is not (DEFAULT_SYSTEM if k == "system" else DEFAULT_TEMPLATE)}
    questions = scoring.get("questions")
    return arguments(labels=labels if (questions is None or given) else (), truncate=truncate, **typed, **scoring)


__all__ = ["ORIGINS", "RUN_OPTIONS", "Plan", "resolved"]
