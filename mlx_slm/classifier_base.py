"""`ClassifierBase`: what a classifier is, built and checked once at construction.

The engine, the label set (or the questions' plan), the prompt format, the scorer and the
batch settings, with the constructor's checks (a head's labels and layers, questions'
refusals, a prompt too long for the context). `classifier.Classifier` adds running texts
through them; the two are apart so each stays small enough to read whole.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import mlx.core as mx

from .answers import QuestionCalibration
from .branches import QuestionPlan
from .calibration import DEFAULT_WARMUP, Calibration, CalibrationSpec, Calibrator
from .engine import Engine
from .labels import LabelError, LabelSet, build_labelset
from .labels import validate as validate_labels
from .models import Model
from .prefix_cache import PrefixCache
from .prepare import format_error
from .prompts import (
    DEFAULT_LABELS,
    DEFAULT_SYSTEM,
    DEFAULT_TEMPLATE,
    TRUNCATE_MODES,
    PromptFormat,
    check_examples,
    fill_labels,
    render,
    shared_prefix,
)
from .questions import DEFAULT_SYSTEM as QUESTIONS_SYSTEM
from .questions import DEFAULT_TEMPLATE as QUESTIONS_TEMPLATE
from .questions import Question, QuestionError
from .scorers import FeaturesOnly, HeadScorer, LabelScorer, QuestionScorer
from .scoring import LABEL_PASSES

if TYPE_CHECKING:
    from .heads import Head


# Batch planner defaults. On a 2-core x86 CPU throughput per processed token was flat from
# 256 to 4,096 padded tokens per batch (about 140 tokens/s, Qwen 0.5B, float32), so the CPU
# budget is small, to cut padding (benchmarks/results/budget-curve.md). GPUs want bigger
# batches; 4,096 there is a starting point that has not been measured yet.
DEFAULT_BATCH_SIZE = 32
DEFAULT_MAX_BATCH_TOKENS = 512
GPU_MAX_BATCH_TOKENS = 4096


def default_max_batch_tokens() -> int:
    return GPU_MAX_BATCH_TOKENS if mx.default_device() == mx.gpu else DEFAULT_MAX_BATCH_TOKENS


class ClassifierBase:
    """A classification task's settings on a shared `Engine`: labels, prompt, scorer, batching.

    Settings only: what a run counts comes back with that run, so one classifier (and one
    engine under many classifiers) can serve concurrent callers.
    """

    def __init__(
        self,
        engine: Engine,
        labels: Sequence[str] = DEFAULT_LABELS,
        system: str | None = DEFAULT_SYSTEM,
        template: str = DEFAULT_TEMPLATE,
        *,
        batch_size: int = DEFAULT_BATCH_SIZE,
        max_batch_tokens: int | None | str = "auto",
        sort: bool = True,
        use_prefix_cache: bool = True,
        scoring: str = "auto",
        truncate: str | None = None,
        max_length: int | None = None,
        keep_logits: bool = False,
        examples: Sequence[tuple[str, str]] = (),
        calibration: str | Calibrator | CalibrationSpec = "none",
        min_confidence: float | None = None,
        warmup: int = DEFAULT_WARMUP,
        label_pass: str = "trie",
        label_descriptions: Mapping[str, str] | None = None,
        head: Head | None = None,
        questions: Sequence[Question | Mapping[str, Any]] | None = None,
        features_only: bool = False,
    ):
        self.plan: QuestionPlan | None = None
        if questions is not None:
            _refuse_with_questions(
                labels=isinstance(labels, (str, bytes)) or tuple(labels) not in ((), DEFAULT_LABELS),
                head=head is not None, examples=bool(examples), label_descriptions=bool(label_descriptions),
                keep_logits=keep_logits, scoring=scoring != "auto", truncate=truncate is not None,
            )  # fmt: skip
            labels = ()
            system = QUESTIONS_SYSTEM if system is DEFAULT_SYSTEM else system
            template = QUESTIONS_TEMPLATE if template is DEFAULT_TEMPLATE else template
        else:
            labels = validate_labels(labels)  # once: a generator is read here, and one str is refused
        _check_settings(engine, labels, head, calibration, label_pass, truncate)
        self.head, self.label_pass, self.engine = head, label_pass, engine
        if questions is not None:
            self._init_questions(questions, system, template)
            self._init_batching(batch_size, max_batch_tokens, sort, max_length)
            self.plan.check_fits(self.max_length)  # type: ignore[union-attr]  # a question no text fits: refused once
            self._init_calibration(calibration, min_confidence, warmup)
            self.calibration_run(self.calibration, min_confidence)  # refused here if it does not apply
            self.prefix_tokens = self.plan.head if use_prefix_cache else ()  # type: ignore[union-attr]
            return
        if head is not None:
            _check_head(head, engine, scoring, keep_logits, label_pass)
        self._init_calibration(calibration, min_confidence, warmup)
        self._init_prompt(labels, system, template, examples, label_descriptions)
        self._init_batching(batch_size, max_batch_tokens, sort, max_length)
        self.truncate, self.keep_logits = truncate, keep_logits
        shared = self._init_scorer(labels, scoring, features_only)
        # The fixed part of every prompt (system, examples, template, chat head) must leave room
        # for at least one text token and the label. With truncation asked for, the run goes on
        # and every row says why it failed.
        problem = format_error(engine.tokenizer, self.format, self.labelset, self.label_extra, self.max_length)
        self.format_error: str | None = None if problem is None else str(problem)
        if problem is not None and truncate is None:
            raise problem
        # A mean-pooled head averages the prompt after this many tokens (the shared head), with
        # or without the prefix cache: the part of the prompt that differs between texts.
        self.pool_from = len(shared)
        # The shared head's ids; its KV is computed by the engine on first use (and kept there).
        self.prefix_tokens: tuple[int, ...] = (
            tuple(shared) if (use_prefix_cache and shared and self.format_error is None) else ()
        )

    def _init_calibration(
        self, calibration: str | Calibrator | CalibrationSpec, min_confidence: float | None, warmup: int
    ) -> None:
        # How `classify` calibrates by default (settings, not run state: a batch prior
        # fitted on one input lives on that run's `Calibration`, never here).
        self.calibration = CalibrationSpec.of(calibration, warmup=warmup)
        self.min_confidence, self.warmup = min_confidence, warmup

    def _init_prompt(
        self,
        labels: Sequence[str],
        system: str | None,
        template: str,
        examples: Sequence[tuple[str, str]],
        label_descriptions: Mapping[str, str] | None,
    ) -> None:
        # `{labels}` / `{label_descriptions}` in the system message: filled once, here.
        system = fill_labels(system, labels, label_descriptions)
        examples = check_examples(examples, labels)  # as --examples and task files check them
        self.format = PromptFormat(system, template, examples)

    def _init_batching(
        self, batch_size: int, max_batch_tokens: int | None | str, sort: bool, max_length: int | None
    ) -> None:
        if max_batch_tokens == "auto":
            max_batch_tokens = default_max_batch_tokens()
        from .ranges import check_all  # the one range rule for every number

        check_all({"batch_size": batch_size, "max_batch_tokens": max_batch_tokens}, "{name}")
        self.batch_size, self.max_batch_tokens, self.sort = batch_size, max_batch_tokens, sort
        self.max_length = max_length or self.engine.max_length

    def _init_scorer(self, labels: Sequence[str], scoring: str, features_only: bool) -> list[int]:
        """The label set and the scorer; returns the shared head's token ids."""
        tokenizer = self.engine.tokenizer
        probe = render(tokenizer, self.format, "example")
        shared = shared_prefix(tokenizer, self.format)
        self.scorer: LabelScorer | HeadScorer | QuestionScorer | FeaturesOnly
        if self.head is None and not features_only:
            self.labelset = build_labelset(tokenizer, labels, probe, scoring)
            self.scorer = LabelScorer(self.engine, self.labelset, self.keep_logits, self.label_pass)
        else:  # the head reads hidden states: no label tokens run, none are scored
            self.labelset = LabelSet(tuple(labels), tuple(() for _ in labels), "head")
            self.scorer = HeadScorer(self.engine, self.head, len(shared)) if self.head is not None else FeaturesOnly()
        # Tokens that run after the prompt (label continuations in sequence mode; none with a head).
        self.label_extra = self.scorer.label_extra
        return shared

    def _init_questions(self, questions: Sequence[Any], system: str | None, template: str) -> None:
        """Settings of a classifier that asks several questions (`branches.QuestionPlan`)."""
        if not getattr(self.engine.model, "supports_tree", False):
            raise QuestionError(
                f"several questions per text need one of our architectures (tree masks); {self.engine.path} runs "
                "through mlx-lm's class: ask one question (--labels) per run"
            )
        self.plan = QuestionPlan(self.engine.tokenizer, questions, system, template)
        for q in self.plan.questions:
            if q.head is not None:
                _check_head(q.head, self.engine, "auto", False, "trie")
        self.head, self.label_pass, self.keep_logits, self.truncate = None, "trie", False, None
        self.format = PromptFormat(system, template)  # as given: a request's task is told apart by it
        self.labelset = LabelSet((), (), "questions")
        self.scorer = QuestionScorer(self.engine, self.plan)
        self.label_extra = self.scorer.label_extra
        self.format_error = None
        self.pool_from = len(self.plan.head)

    @property
    def questions(self) -> tuple[Question, ...] | None:
        return self.plan.questions if self.plan is not None else None

    @property
    def model(self) -> Model:
        return self.engine.model

    @property
    def tokenizer(self) -> Any:
        return self.engine.tokenizer

    @property
    def path(self) -> Path | None:
        return self.engine.path

    @property
    def labelset(self) -> LabelSet:
        return self._labelset

    @labelset.setter
    def labelset(self, ls: LabelSet) -> None:
        """A new label set (tests and benchmarks set one directly) reaches the label scorer too."""
        self._labelset = ls
        if isinstance(getattr(self, "scorer", None), LabelScorer):
            self.scorer = LabelScorer(self.engine, ls, self.keep_logits, self.label_pass)

    @property
    def labels(self) -> tuple[str, ...]:
        return self.labelset.labels

    @property
    def mode(self) -> str:
        return self.labelset.mode

    @property
    def row_extra(self) -> int:
        """Tokens each row runs besides its prompt in one pass, counted in the batch's token
        budget (the scorer's: the label trie's nodes, the question branches, or none)."""
        return self.scorer.row_extra

    @property
    def prefix(self) -> PrefixCache | None:
        """The shared head's KV (computed on first use, then kept by the engine)."""
        return self.engine.prefix(self.prefix_tokens)[0] if self.prefix_tokens else None

    def calibration_run(
        self, spec: CalibrationSpec, min_confidence: float | None = None, on_fit: Any = None
    ) -> Calibration | QuestionCalibration:
        """The per-run calibration (and abstain) of this task's predictions: the labels', or one
        per question (`answers.QuestionCalibration`)."""
        if self.plan is not None:
            return QuestionCalibration(spec, self.plan.questions, min_confidence=min_confidence)
        return spec.run(self.labels, min_confidence, on_fit)


def _check_settings(
    engine: Any, labels: Sequence[str], head: Head | None, calibration: Any, label_pass: str, truncate: str | None
) -> None:
    """The constructor's arguments that need no tokenizer, checked before any work."""
    if head is not None:
        if tuple(labels) != tuple(head.labels):
            raise LabelError(
                f"the head was trained for the labels {list(head.labels)[:8]}"
                f"{' ...' if len(head.labels) > 8 else ''}; got {list(labels)[:8]}: pass the head's labels"
            )
        if CalibrationSpec.of(calibration).applies:
            raise LabelError(
                "calibration does not apply to a learned head (its probabilities are fitted on labelled "
                "data already): use calibration='none'"
            )
    if label_pass not in LABEL_PASSES:
        raise ValueError(f"label_pass must be one of {', '.join(LABEL_PASSES)}, not {label_pass!r}")
    if truncate is not None and truncate not in TRUNCATE_MODES:
        raise ValueError(f"truncate must be one of {', '.join(TRUNCATE_MODES)} or None, not {truncate!r}")
    if not isinstance(engine, Engine):
        raise TypeError(
            f"Classifier takes an Engine (Engine.load(name), or Engine(model, tokenizer)), not "
            f"{type(engine).__name__}; Classifier.load(name, ...) loads one"
        )


def _check_head(head: Head, engine: Engine, scoring: str, keep_logits: bool, label_pass: str) -> None:
    """A head reads this model's hidden states, and nothing of label scoring applies to it."""
    n, dim = len(engine.model.layers), int(engine.model.args.hidden_size)
    if head.dim != dim or max(head.layers) > n:
        raise LabelError(
            f"the head reads layer(s) {list(head.layers)} of width {head.dim}; this model has {n} layers of "
            f"width {dim}: use the model the head was trained on (its task file names it)"
        )
    for name, value, default in (
        ("scoring", scoring, "auto"),
        ("keep_logits", keep_logits, False),
        ("label_pass", label_pass, "trie"),
    ):
        if value != default:
            raise LabelError(
                f"{name}={value!r} is a label-scoring setting; a learned head scores no label tokens and has no "
                f"vocabulary logits: leave {name} at {default!r}"
            )


def _refuse_with_questions(**given: bool) -> None:
    """What a classifier that asks several questions does not take (each question carries its own options)."""
    bad = [k for k, v in given.items() if v]
    if bad:
        why = {
            "labels": "each question has its own labels",
            "examples": "few-shot examples answer one question",
            "label_descriptions": "a question carries its own descriptions",
        }
        raise QuestionError(
            f"questions= does not go with {bad[0]}"
            + (f" ({why[bad[0]]})" if bad[0] in why else " (not supported with several questions yet)")
            + ": drop it, or ask one question with labels="
        )
