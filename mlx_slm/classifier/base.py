"""`ClassifierBase`: what a classifier is, built and checked once at construction.

The engine, the scoring kind (chosen once by the kinds table from the arguments, `kinds.spec_of`,
and bound to the engine and the prompt), the calibration and the batch settings.
`classifier.Classifier` adds running texts through them; the two are apart so each stays
small enough to read whole. Everything that varies by kind is the kind's (`kinds/`); the
names below that read it (`labels`, `labelset`, `questions`, `head`, `plan`, `mode`, ...)
are views of it, kept for callers of the Python API.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import mlx.core as mx

from ..engine.engine import Engine
from ..engine.prefix_cache import PrefixCache
from ..kinds import Kind, KindArgs, KindSpec, RunSettings, spec_of
from ..models import Model, embeds_only
from ..text.calibration import DEFAULT_WARMUP, Calibration, CalibrationSpec, Calibrator
from ..text.labels import LabelError, LabelSet
from ..text.prompts import DEFAULT_LABELS, DEFAULT_SYSTEM, DEFAULT_TEMPLATE, TRUNCATE_MODES, PromptFormat
from .pipeline import BatchSettings

if TYPE_CHECKING:
    from ..text.branches import QuestionPlan
    from ..text.heads import Head
    from ..text.questions import Question


# A threshold given where the kind chosen on the model has no multi-label answer to set.
NO_THRESHOLD = (
    "threshold (--threshold) sets which labels a multi-label sequence classifier answers (a sigmoid per "
    "label); this model scores one label per text, or one score: drop it"
)

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
    """A classification task's settings on a shared `Engine`: its kind, prompt, calibration, batching.

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
        threshold: float | None = None,
        reranker: str | None = None,
        instruction: str | None = None,
        finetuned: Any = None,
        kind: KindSpec | KindArgs | None = None,
    ):
        if not isinstance(engine, Engine):
            raise TypeError(
                f"Classifier takes an Engine (Engine.load(name), or Engine(model, tokenizer)), not "
                f"{type(engine).__name__}; Classifier.load(name, ...) loads one"
            )
        if truncate is not None and truncate not in TRUNCATE_MODES:
            raise ValueError(f"truncate must be one of {', '.join(TRUNCATE_MODES)} or None, not {truncate!r}")
        if kind is None:
            if not isinstance(labels, (str, bytes)):  # read once: a generator would be empty the second time
                try:
                    labels = tuple(labels)
                except TypeError:
                    pass  # the labels kind names what it got
            given = isinstance(labels, (str, bytes)) or labels not in ((), DEFAULT_LABELS)
            kind = KindArgs(
                labels=labels if (questions is None or given) else (),  # type: ignore[arg-type]
                scoring=scoring, examples=tuple(examples), label_descriptions=label_descriptions,
                keep_logits=keep_logits, label_pass=label_pass, head=head,
                questions=None if questions is None else tuple(questions), features_only=features_only,
                # A system message or template of one's own opts a sequence classifier in to a chat prompt.
                extra={"truncate": truncate, "threshold": threshold,
                       **({} if system is DEFAULT_SYSTEM and template is DEFAULT_TEMPLATE else {"chat": True}),
                       # a reranker's settings: its kind takes the prompt given, or refuses it by name
                       "reranker": reranker, "instruction": instruction, "finetune": finetuned,
                       **({"system": None if system is DEFAULT_SYSTEM else system,
                           "template": None if template is DEFAULT_TEMPLATE else template}
                          if reranker is not None else {})},
            )  # fmt: skip
        if isinstance(kind, KindArgs):  # chosen here, where the model (and any score head of its own) is known
            extra = {"model_name": str(engine.path or ""), **kind.extra}
            if embeds_only(engine.model):  # no head of its own to score with: its features (a learned head's)
                kind = replace(kind, features_only=True)
            kind = spec_of(replace(kind, model_head=getattr(engine.model, "seqcls", None), extra=extra))
            if extra.get("threshold") is not None and kind.record_shape().form != "multi":
                raise LabelError(NO_THRESHOLD)
        self.engine = engine
        self.calibration = CalibrationSpec.of(calibration, warmup=warmup)
        self.min_confidence, self.warmup = min_confidence, warmup
        kind.check_calibration(self.calibration, min_confidence)  # a head's, a question's: refused if it does not apply
        if max_batch_tokens == "auto":
            max_batch_tokens = default_max_batch_tokens()
        from ..ground.ranges import check_all  # the one range rule for every number

        check_all({"batch_size": batch_size, "max_batch_tokens": max_batch_tokens}, "{name}")
        self.batching = BatchSettings(batch_size, max_batch_tokens, sort)  # type: ignore[arg-type]
        run = RunSettings(truncate, max_length or engine.max_length, use_prefix_cache)
        self.kind: Kind = kind.bind(engine, kind.prompt(system, template), run)

    # ------------------------------------------------------------------ views of the settings
    @property
    def spec(self) -> KindSpec:
        """The kind's settings (what a task file saves)."""
        return self.kind.spec

    @property
    def format(self) -> PromptFormat:
        return self.kind.format

    @property
    def batch_size(self) -> int:
        return self.batching.batch_size

    @property
    def max_batch_tokens(self) -> int | None:
        return self.batching.max_batch_tokens

    @property
    def sort(self) -> bool:
        return self.batching.sort

    @property
    def truncate(self) -> str | None:
        return self.kind.run.truncate

    @property
    def max_length(self) -> int:
        return self.kind.max_length

    @property
    def prefix_tokens(self) -> tuple[int, ...]:
        return self.kind.prefix_tokens

    @property
    def pool_from(self) -> int:
        return self.kind.pool_from

    @property
    def format_error(self) -> str | None:
        return self.kind.format_error

    @property
    def scorer(self) -> Kind:
        """The bound kind (what scores each batch); `kind` is its name here."""
        return self.kind

    @property
    def questions(self) -> tuple[Question, ...] | None:
        return self.spec.questions

    @property
    def plan(self) -> QuestionPlan | None:
        return getattr(self.kind, "plan", None)

    @property
    def head(self) -> Head | None:
        """The learned head the kind scores with (None for any other, a model's own score head included)."""
        return getattr(self.spec, "head", None) if self.spec.heads else None

    @property
    def keep_logits(self) -> bool:
        return bool(getattr(self.spec, "keep_logits", False))

    @property
    def label_pass(self) -> str:
        return str(getattr(self.spec, "label_pass", "trie"))

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
        """The labels' token ids and scoring mode (the labels kind's; a name-only set for others)."""
        ls = getattr(self.kind, "labelset", None)
        if ls is not None:
            return ls
        labels = self.spec.labels
        return LabelSet(tuple(labels), tuple(() for _ in labels), self.mode)

    @labelset.setter
    def labelset(self, ls: LabelSet) -> None:
        """A new label set (tests and benchmarks set one directly) for the labels kind to score."""
        if not hasattr(self.kind, "labelset"):
            raise AttributeError(f"a {self.spec.name} classifier has no label set to replace")
        self.kind.labelset = ls  # type: ignore[attr-defined]

    @property
    def labels(self) -> tuple[str, ...]:
        return tuple(self.labelset.labels)

    @property
    def mode(self) -> str:
        return str(getattr(self.kind, "mode", self.spec.mode))

    @property
    def row_extra(self) -> int:
        """Tokens each row runs besides its prompt in one pass, counted in the batch's token
        budget (the kind's: the label trie's nodes, the question branches, or none)."""
        return self.kind.row_extra

    @property
    def label_extra(self) -> int:
        return self.kind.label_extra

    @property
    def prefix(self) -> PrefixCache | None:
        """The shared head's KV (computed on first use, then kept by the engine)."""
        return self.engine.prefix(self.prefix_tokens)[0] if self.prefix_tokens else None

    def calibration_run(
        self, spec: CalibrationSpec, min_confidence: float | None = None, on_fit: Any = None
    ) -> Calibration | Any:
        """The per-run calibration (and abstain) of this task's predictions (the kind's)."""
        return self.spec.calibration_run(spec, min_confidence, on_fit)
