"""`DecisionPlan`: a decision run's settings, resolved once (`jobs.plan.resolve_decisions` for
the CLI, `service.tasks` for `serve`), then taken whole by `decide`, `eval --decisions`, `serve`
and Ray's workers: nothing after it reads an option or a task file again.

It holds the model (`ModelRef`), the model's decision settings (`DecisionConfig.of_model`, the
one loader with one precedence: the folder given, else the converted one, else Transformers'
defaults), the questions asked (parsed once, with those settings; none for the service, where
each request brings its own) and their JSON as read, how each question is answered (`Methods`:
a task's saved methods by question digest, and the run's own style, option orders and prior),
the batch prior's warm-up, the state cache and batching (`DeciderSettings`), what is refused
when a question does not fit (`refusal`: None lets each front end choose: a route by its API,
`decide` by what its output shape can say), and the task it came from.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..engine.engine import Engine
from ..kinds.head import check_head
from ..text.calibration import DEFAULT_WARMUP, Calibrator
from ..text.decisions.errors import DecisionError
from ..text.decisions.files import questions_of
from ..text.decisions.methods import Method, Methods
from ..text.decisions.questions import REFUSALS, DecisionQuestion, DecisionRequest
from ..text.decisions.settings import DecisionConfig
from ..text.labels import LabelError
from ..weights.registry import ModelRef
from .decider import Decider, DeciderSettings
from .own_classifiers import answers_options, trained_with
from .task import Task, TaskError, check_decision_settings


@dataclass(frozen=True)
class DecisionPlan:
    """A decision run, resolved once (see the module docstring)."""

    model: ModelRef
    config: DecisionConfig = field(default_factory=DecisionConfig)  # what the questions were read with
    questions: tuple[DecisionQuestion, ...] = ()
    raw_questions: Any = None
    methods: Methods = field(default_factory=Methods)
    warmup: int = DEFAULT_WARMUP
    settings: DeciderSettings = field(default_factory=DeciderSettings)
    refusal: str | None = None
    task: Task | None = None
    model_config: bool = False  # `config` is the model's own (`loaded`), not the defaults it starts with

    def __post_init__(self) -> None:
        if self.refusal is not None and self.refusal not in REFUSALS:
            raise DecisionError(("refuse",), f"--refuse is one of {', '.join(REFUSALS)}, got {self.refusal!r}")

    @property
    def prior(self) -> str:
        """The run's prior for questions without a fitted method: none, batch or contextual."""
        return self.methods.default.prior

    def engine(self) -> Engine:
        return Engine.load(self.model)

    def loaded(self, engine: Engine) -> DecisionPlan:
        """This plan on a loaded model: its decision settings read (`DecisionConfig.of_model`), the
        questions and the task's methods read with them where they differ from the defaults they
        were first read with, and a task's saved methods checked against the model's weights."""
        config = DecisionConfig.of_model(self.model.name, engine.path)
        plan = self if config == self.config else self.with_config(config)
        if config.chat_template and any(
            m.style == "names" for m in (plan.methods.default, *plan.methods.saved.values())
        ):
            raise DecisionError(  # its template renders each question its own way: the names would never be asked
                ("style",),
                "the names style lists the options by name, but this model's decision_template.jinja renders every "
                "question its own way (its letters): drop --style names / --decision-style names (or ask in the "
                "prompt style), or fit the task again on this model",
            )
        if plan.methods.saved and plan.task is not None:
            # fitted on other weights (or, with no sha256 recorded, for another model): refused
            plan.task.check_weights(engine.weights_sha256, self.model.name, by_name=True)
            check_decision_settings(plan.task, config, self.model.name)  # or under another decision.json
            own = {q.digest: q for q in questions_of(plan.task.decisions["questions"], config)}
            for m in plan.methods.saved.values():
                _check_saved(m, own, engine)
        return replace(plan, model_config=True)

    def with_config(self, config: DecisionConfig) -> DecisionPlan:
        """The plan under another model's decision settings (which order a noul's options and
        name its labels): the questions and the task's methods read again under them."""
        questions = questions_of(self.raw_questions, config) if self.raw_questions is not None else ()
        methods = task_methods(self.task, config, self.methods) if self.task is not None else self.methods
        return replace(self, config=config, questions=questions, methods=methods)

    def decider(self, engine: Engine, **options: Any) -> Decider:
        """The `Decider` this plan runs (on a loaded plan's engine); `options` override settings."""
        if not self.model_config:
            raise DecisionError((), "the plan's decision settings are not the model's yet: call loaded(engine) first")
        d = Decider(engine, self.config, replace(self.settings, methods=self.methods, **options))
        if self.questions:  # options that cannot be read as labels: refused now, naming the question, not as
            try:  # every row's error; a question over the context is refused per state as --refuse says
                d.prepare([DecisionRequest("?", self.questions, refusal="question")])
            except DecisionError as e:
                if e.type != "tokens_exceeded":
                    raise
        return d

    def record(self, priors: Mapping[str, Calibrator] | None = None) -> dict[str, Any]:
        """What a run's manifest records of how its answers are made (a resumed run must match)."""
        return {
            "methods": {
                "default": self.methods.default.record(),
                "prior": self.prior,
                "warmup": self.warmup if self.prior == "batch" else None,
                # each saved method by its question's digest, with a digest of the method itself: a
                # resumed run under a task trained or fitted again (another head, threshold) differs
                "saved": [[k, _content(m)] for k, m in sorted(self.methods.saved.items())],
            },
            "priors": {k: c.to_dict() for k, c in sorted((priors or {}).items())},
        }


def _content(m: Method) -> str:
    """A digest of a saved method as its task holds it (what it answers with, all of it): a tuned
    classifier by its task file's bytes, not its place (a task folder moved between an interrupted
    run and its --resume is the same method; one trained again is not)."""
    d = m.to_dict()
    if m.tuned is not None:
        try:
            d["tuned"] = hashlib.sha256(Path(m.tuned).read_bytes()).hexdigest()
        except OSError:
            d["tuned"] = os.path.basename(m.tuned)
    return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _check_saved(m: Method, own: Mapping[str, DecisionQuestion], engine: Engine) -> None:
    """A task's saved method, checked when the plan loads (the task at fault, before any state or
    request, not as a client's error at each): made for one of the questions the task records
    (`own`, by digest under the model's decision settings); its head one this model can run; its
    own classifier the file it was trained with, answering the question's options."""
    if m.digest not in own:  # a digest, or the question's words, edited by hand
        raise TaskError(
            f"the task's method for question {str(m.key)[:60]!r} was made for a question the task does not "
            f"record (its digest {str(m.digest)[:16]!r} is none of its questions'; the digest or the question's "
            "words were edited by hand): fit or train the questions again"
        )
    if m.head is not None:
        try:
            check_head(m.head, engine)
        except LabelError as e:
            raise TaskError(f"the task's head for question {m.key!r}: {e}") from None
    if m.tuned is not None:
        trained_with(m.tuned, m.key, m)
        answers_options(m.tuned, Task.load(m.tuned).labels, own[m.digest])


def task_methods(task: Task | None, config: DecisionConfig, base: Methods | None = None) -> Methods:
    """A task's saved methods (its `decisions` section: `methods`, or a task of before's
    `temperatures` by key), read with the model's decision settings, over `base`'s default."""
    base = base or Methods()
    if task is None or not task.decisions:
        return base
    sec = task.decisions
    try:
        own = questions_of(sec["questions"], config)
        got = Methods.from_record(sec.get("methods"), sec.get("temperatures") or {}, own, "the task's decisions")
    except DecisionError as e:
        fix = "" if str(e).rstrip().endswith("again") else ": fit or train the questions again"  # a fix said once
        raise TaskError(f"{e}{fix}") from None
    if task.home is not None:  # a tuned question's classifier is a task file beside this one
        got = got.beside(task.home)
    return Methods(got.saved, base.default)


def task_questions(task: Task | None) -> Any:
    """A task's questions as saved (raw JSON), or None."""
    return task.decisions["questions"] if task is not None and task.decisions else None


def asked(questions: Sequence[DecisionQuestion], methods: Methods) -> list[dict[str, Any]]:
    """Each asked question's method as a run's summary says it (with a note where it changed)."""
    out = []
    for q in questions:
        m, note = methods.for_question(q)
        out.append({"key": q.key, **m.record(q=q), **({"note": note} if note else {})})
    return out
