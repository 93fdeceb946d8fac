"""A learned linear head on hidden states (`heads.Head`, trained by `mlx-slm train`).

The forward stops at the head's deepest layer and the head's numpy predict replaces label
scoring: no label token runs, so the label count costs nothing. Also the features-only
kind: a classifier made for its hidden states (the estimator's and `train_head`'s), which
scores nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..engine.engine import Engine
from ..engine.prefix_cache import PrefixCache
from ..models import BACKBONE_NO_LM_HEAD, embeds_only
from ..text.batching import Batch
from ..text.calibration import CalibrationSpec
from ..text.heads import Head, HeadError, head_input
from ..text.labels import LabelError, check_none_label
from ..text.labels import validate as validate_labels
from ..text.predictions import Item, Prediction, Stats
from ..text.prompts import PromptFormat, check_examples
from .base import KindArgs, KindSettings, KindSpec, OnePrompt, RunSettings, TaskError, count, prediction, task_examples
from .labels import LabelsSpec

NO_CALIBRATION = (
    "calibration does not apply to a learned head (its probabilities are fitted on labelled data already): "
    "use calibration='none'"
)


def pooled_features(
    engine: Engine,
    batch: Batch,
    prefix: PrefixCache | None,
    layers: list[int],
    poolings: Sequence[str],
    pool_from: int,
) -> dict[str, np.ndarray]:
    """Hidden states after `layers`, pooled; a mean covers the prompt after its shared head
    (`pool_from` tokens): rows after the prefix KV start past it, the others skip it."""
    skip = np.full(len(batch.ids), 0 if prefix is not None else pool_from)
    return engine.features(batch, prefix, layers, poolings, skip)


def check_head(head: Head, engine: Engine) -> None:
    """A head reads this model's hidden states: its layers and width must be this model's."""
    n, dim = len(engine.model.layers), int(engine.model.args.hidden_size)
    if head.dim != dim or max(head.layers) > n:
        raise LabelError(
            f"the head reads layer(s) {list(head.layers)} of width {head.dim}; this model has {n} layers of "
            f"width {dim}: use the model the head was trained on (its task file names it)"
        )


@dataclass(frozen=True)
class HeadSettings(KindSettings):
    """A learned head to score with (`head=`; a task file's field 'head')."""

    head: Any

    NAMES = ("head",)
    trained = "learned head"

    @classmethod
    def take(cls, named: Mapping[str, Any]) -> HeadSettings | None:
        return None if named.get("head") is None else cls(named["head"])

    def named(self, home: str | None = None) -> dict[str, Any]:
        return {"head": self.head}

    def weights_note(self) -> tuple[str, str] | None:
        return "head was trained", "train it again (mlx-slm train ... --save-task)"


@dataclass(frozen=True)
class FeaturesSettings(KindSettings):
    """A classifier made for its hidden states only (`features_only=True`)."""

    NAMES = ("features_only",)

    @classmethod
    def take(cls, named: Mapping[str, Any]) -> FeaturesSettings | None:
        return cls() if named.get("features_only") else None

    def named(self, home: str | None = None) -> dict[str, Any]:
        return {"features_only": True}


@dataclass(frozen=True)
class HeadSpec(KindSpec):
    """A learned head: its labels are the head's, its prompt the one it was trained on."""

    head: Head
    examples: tuple[tuple[str, str], ...] = ()
    descriptions: Mapping[str, str] | None = field(default=None, compare=False)
    none_label: str | None = None  # type: ignore[assignment]  # the head's label meaning "none of these"

    name = "head"  # type: ignore[misc]
    Settings = HeadSettings
    task_fields = ("head",)
    calibrates = False  # type: ignore[misc]
    no_calibration = NO_CALIBRATION  # type: ignore[misc]

    @classmethod
    def wants(cls, args: KindArgs) -> bool:
        return args.get(HeadSettings) is not None

    @classmethod
    def from_args(cls, args: KindArgs) -> HeadSpec:
        own = args.get(HeadSettings)
        assert own is not None
        head = own.head
        if not isinstance(head, Head):
            raise TypeError(f"head must be a heads.Head (trained by mlx_slm.train_head), not {type(head).__name__}")
        labels = tuple(validate_labels(args.labels))
        if labels != tuple(head.labels):
            raise LabelError(
                f"the head was trained for the labels {list(head.labels)[:8]}"
                f"{' ...' if len(head.labels) > 8 else ''}; got {list(labels)[:8]}: pass the head's labels"
            )
        for name, value, default in (
            ("scoring", args.scoring, "auto"),
            ("keep_logits", args.keep_logits, False),
            ("label_pass", args.label_pass, "trie"),
        ):
            if value != default:
                raise LabelError(
                    f"{name}={value!r} is a label-scoring setting; a learned head scores no label tokens and has "
                    f"no vocabulary logits: leave {name} at {default!r}"
                )
        none = check_none_label(args.none_label, labels)
        return cls(head, check_examples(args.examples, labels), args.label_descriptions, none)

    @property
    def labels(self) -> tuple[str, ...]:
        return tuple(self.head.labels)

    @property
    def learned_head(self) -> Any:
        return self.head

    @property
    def heads(self) -> list[Any]:
        return [self.head]

    def feature_parts(self) -> tuple[list[int], tuple[str, ...]] | None:
        return sorted(set(self.head.layers)), tuple(sorted(set(self.head.poolings)))

    def prompt(self, system: str | None, template: str) -> PromptFormat:
        return PromptFormat(system, template, self.examples)  # its labels filled by the plan

    def prompt_labels(self) -> tuple[Sequence[str], Mapping[str, str] | None]:
        return self.labels, self.descriptions

    def to_task(self, path: Any = None) -> dict[str, Any]:
        return {
            "labels": list(self.labels),
            "examples": [{"text": t, "label": lab} for t, lab in self.examples],
            "head": self.head.to_dict(),
        }

    def for_request(self, labels: tuple[str, ...], same_prompt: bool) -> KindSpec | None:
        """The head holds for its own labels and prompt only; its labels with another prompt are
        scored zero-shot, with its examples."""
        if labels != self.labels:
            return None
        if same_prompt:
            return self
        return LabelsSpec.from_args(
            KindArgs(labels, examples=self.examples, label_descriptions=self.descriptions, none_label=self.none_label)
        )

    def task_kwargs(self, mode: str) -> dict[str, Any]:
        return {"labels": self.labels, "examples": self.examples, "section": HeadSettings(self.head)}

    def manifest(self, mode: str) -> dict[str, Any]:
        return {
            "labels": list(self.labels),
            "scoring": mode,
            "examples": [list(e) for e in self.examples],
            "head": {"layers": list(self.head.layers), "sha256": self.head.sha256},
        }

    @classmethod
    def read_task(
        cls, d: dict[str, Any], where: str, labels: list[str], calibration: CalibrationSpec
    ) -> dict[str, Any] | None:
        """The learned head: trained for these labels, and with no calibration beside it."""
        examples = task_examples(d, where, labels)
        if d.get("head") is None:
            return None

        try:
            head = Head.from_dict(d["head"], f"{where}: field 'head'")
        except HeadError as e:
            raise TaskError(str(e)) from None
        if list(head.labels) != labels:
            raise TaskError(
                f"{where}: field 'head' was trained for the labels {list(head.labels)[:8]}, but the task's "
                f"labels are {labels[:8]}: train the head again (mlx-slm train ... --save-task)"
            )
        if calibration.to_dict() != "none":
            raise TaskError(
                f"{where}: a task with a learned head takes no calibration (field 'calibration' is not "
                "'none'): set it to \"none\", or train the head again"
            )
        return {"examples": examples, "section": HeadSettings(head)}

    def bind(self, engine: Engine, fmt: PromptFormat, run: RunSettings) -> HeadKind:
        return HeadKind(self, engine, fmt, run)


class HeadKind(OnePrompt):
    """A learned head on the hidden states at its layer(s); no label token runs."""

    spec: HeadSpec

    def __init__(self, spec: HeadSpec, engine: Engine, fmt: PromptFormat, run: RunSettings):
        check_head(spec.head, engine)
        super().__init__(spec, engine, fmt, run)
        self._settle()

    @property
    def mode(self) -> str:
        return "head"

    def score(self, batch: Batch, items: list[Item], prefix: PrefixCache | None, st: Stats) -> list[Prediction]:
        head = self.spec.head
        layers = sorted(set(head.layers))
        got = pooled_features(self.engine, batch, prefix, layers, sorted(set(head.poolings)), self.pool_from)
        lp = head.log_probs(head_input(got, layers, head))
        count(st, batch, 0)
        return [prediction(item, head.labels, lp[r], np.exp(lp[r])) for r, item in enumerate(items)]


@dataclass(frozen=True)
class FeaturesSpec(KindSpec):
    """A classifier made for its features (`features_only=True`): the labels are only names."""

    names: tuple[str, ...]
    examples: tuple[tuple[str, str], ...] = ()
    descriptions: Mapping[str, str] | None = field(default=None, compare=False)

    name = "features"  # type: ignore[misc]
    Settings = FeaturesSettings
    classifies = False  # type: ignore[misc]
    calibrates = False  # type: ignore[misc]
    no_calibration = "a features-only classifier gives no labels to calibrate"  # type: ignore[misc]

    @classmethod
    def wants(cls, args: KindArgs) -> bool:
        return args.get(FeaturesSettings) is not None

    @classmethod
    def from_args(cls, args: KindArgs) -> FeaturesSpec:
        labels = tuple(validate_labels(args.labels))
        return cls(labels, check_examples(args.examples, labels), args.label_descriptions)

    @property
    def labels(self) -> tuple[str, ...]:
        return self.names

    @property
    def mode(self) -> str:
        return "head"

    def check_calibration(self, spec: CalibrationSpec, min_confidence: float | None = None) -> None:
        """Nothing to refuse yet: asking for labels at all is what a features-only classifier refuses."""

    def prompt(self, system: str | None, template: str) -> PromptFormat:
        return PromptFormat(system, template, self.examples)  # its labels filled by the plan

    def prompt_labels(self) -> tuple[Sequence[str], Mapping[str, str] | None]:
        return self.names, self.descriptions

    def bind(self, engine: Engine, fmt: PromptFormat, run: RunSettings) -> FeaturesKind:
        return FeaturesKind(self, engine, fmt, run)


class FeaturesKind(OnePrompt):
    """Prepares items like a head's (the features' prompts) and refuses to score them."""

    def __init__(self, spec: FeaturesSpec, engine: Engine, fmt: PromptFormat, run: RunSettings):
        super().__init__(spec, engine, fmt, run)
        self._settle()

    @property
    def mode(self) -> str:
        return "head"

    def score(self, batch: Batch, items: list[Item], prefix: PrefixCache | None, st: Stats) -> list[Prediction]:
        if embeds_only(self.engine.model):
            raise LabelError(BACKBONE_NO_LM_HEAD)
        raise LabelError(
            "this classifier was made with features_only=True: it gives hidden states (features), not "
            "labels; train a head on them (mlx_slm.train_head) and classify with Classifier(..., head=head)"
        )
