"""A sequence-classification checkpoint's own head: the score matrix at the last token.

A `*ForSequenceClassification` model (a fine-tuned classifier, an NLI or reward model, a
reranker converted to one label) has no LM head: it scores its own labels (`id2label`) with
`score(norm(hidden[last]))` (`Engine.sequence_logits`), and its probabilities are what Transformers'
text-classification pipeline gives (`seqcls.SeqClsHead.probabilities`): a softmax over the
labels, a sigmoid per label (multi-label: the labels at or above `threshold` are the answer),
or one output (a sigmoid score; a regression head's raw value), the raw logit kept.

Its prompt is by default the text exactly as the model's tokenizer encodes it, a pair as it
encodes a pair (its special tokens, no chat template), as Transformers and vLLM feed such a
model; a system message or a template given (`chat=True`) opts in to the chat template,
`{pair}` placing the second text. This kind is chosen whenever the model has such a head.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..engine.engine import Engine
from ..engine.prefix_cache import PrefixCache
from ..ground.errors import ModelError
from ..text.batching import Batch
from ..text.calibration import CalibrationSpec
from ..text.labels import LabelError, NotItsLabels
from ..text.predictions import Item, Prediction, Stats
from ..text.prompts import DEFAULT_LABELS, DEFAULT_SYSTEM, DEFAULT_TEMPLATE, PromptFormat, encode_texts
from ..text.records import RecordShape
from ..text.seqcls import SeqClsHead
from .base import KindArgs, KindSettings, KindSpec, OnePrompt, RunSettings, TaskError, count, prediction
from .head import FeaturesSettings, HeadSettings
from .questions import QuestionsSettings

DEFAULT_THRESHOLD = 0.5  # a multi-label head's labels at or above this probability are its answer
FORMS = {"softmax": "label", "sigmoid": "multi", "none": "score"}


@dataclass(frozen=True)
class SeqClsSettings(KindSettings):
    """A sequence classifier's settings: a multi-label head's `threshold` (`threshold=`), and the
    head a task recorded (`seqcls=`: its field 'seqcls', checked against the model's when bound)."""

    threshold: float | None = None
    saved: dict[str, Any] | None = None

    NAMES = ("threshold", "seqcls")

    @classmethod
    def take(cls, named: Mapping[str, Any]) -> SeqClsSettings | None:
        if named.get("threshold") is None and named.get("seqcls") is None:
            return None
        return cls(named.get("threshold"), named.get("seqcls"))

    def named(self, home: str | None = None) -> dict[str, Any]:
        return {k: v for k, v in (("threshold", self.threshold), ("seqcls", self.saved)) if v is not None}

    def unused(self, spec: KindSpec) -> Exception:
        if self.threshold is not None:
            return LabelError(NO_THRESHOLD)
        return super().unused(spec)


# A threshold given where the kind chosen on the model has no multi-label answer to set.
NO_THRESHOLD = (
    "threshold (--threshold) sets which labels a multi-label sequence classifier answers (a sigmoid per "
    "label); this model scores one label per text, or one score: drop it"
)


@dataclass(frozen=True)
class SeqClsSpec(KindSpec):
    """The model's own score head (`head`), how its prompt is made (`chat`) and, for a
    multi-label head, the `threshold` of its answer."""

    head: SeqClsHead
    threshold: float = DEFAULT_THRESHOLD
    chat: bool = False

    name = "seqcls"  # type: ignore[misc]
    Settings = SeqClsSettings
    task_fields = ("seqcls",)

    @classmethod
    def wants(cls, args: KindArgs) -> bool:
        # A learned head (or features) reads the backbone's hidden states: that kind, not this one.
        own = args.get(SeqClsSettings)
        reads_states = args.get(HeadSettings) is not None or args.get(FeaturesSettings) is not None
        return (args.model.head is not None or (own is not None and own.saved is not None)) and not reads_states

    @classmethod
    def from_args(cls, args: KindArgs) -> SeqClsSpec:
        # A task's recorded head (checked against the model's when bound), else the model's own.
        own = args.get(SeqClsSettings) or SeqClsSettings()
        section = own.saved or {}
        head = seqcls_head(section, "the task's seqcls") if section else args.model.head
        if args.get(QuestionsSettings) is not None:
            raise LabelError(head.no_lm_head())
        given = tuple(args.labels) not in ((), DEFAULT_LABELS, tuple(head.labels))
        if given:
            raise NotItsLabels(
                f"this model, a {head.architecture},", head.labels, args.labels, "a causal LM scores labels you name"
            )
        for name, bad in (
            ("scoring", args.scoring != "auto"),
            ("keep_logits", args.keep_logits),
            ("label_pass", args.label_pass != "trie"),
            ("examples", bool(args.examples)),
            ("label_descriptions", bool(args.label_descriptions)),
        ):
            if bad:
                raise LabelError(
                    f"{name} is a setting of label scoring on a causal LM; this model is a {head.architecture} "
                    "and scores its own labels with its head: drop it"
                )
        if head.function == "none" and head.num_labels > 1:
            raise ModelError(
                f"{head.architecture}: a regression head of {head.num_labels} outputs is not supported yet "
                "(one output, or classification heads, are)"
            )
        threshold = own.threshold
        if threshold is not None and (head.num_labels == 1 or FORMS[head.function] != "multi"):
            raise LabelError(NO_THRESHOLD)
        threshold = section.get("threshold", DEFAULT_THRESHOLD) if threshold is None else threshold
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0.0 <= threshold <= 1.0:
            raise LabelError(f"the multi-label threshold must be a number from 0 to 1, got {threshold!r}")
        # A chat prompt: a system message or template of one's own typed (it opts a sequence classifier in
        # to a chat prompt), the task's, or the one an exported fine-tune records.
        typed = args.system is not None or args.template is not None
        chat = typed or section.get("chat", head.prompt is not None)
        return cls(head, float(threshold), bool(chat))

    @property
    def labels(self) -> tuple[str, ...]:
        return tuple(self.head.labels)

    @property
    def none_label(self) -> str | None:  # type: ignore[override]
        """The label an exported fine-tune says means "none of these" (one label a text only)."""
        return self.head.none_label if self.form == "label" else None

    @property
    def form(self) -> str:
        """The record's form: one label (softmax), the labels over a threshold (sigmoid per
        label), or one score (one output)."""
        return "score" if self.head.num_labels == 1 else FORMS[self.head.function]

    @property
    def calibrates(self) -> bool:  # type: ignore[override]
        return self.form == "label"  # a softmax over labels: its log-probabilities calibrate as label scores

    @property
    def abstains(self) -> bool:  # type: ignore[override]
        return self.calibrates  # a threshold on the top label's probability: a single-label head's only

    @property
    def no_calibration(self) -> str:  # type: ignore[override]
        what = "a multi-label head (a sigmoid per label)" if self.form == "multi" else "a one-output head (a score)"
        return f"calibration and --min-confidence apply to a single-label head; this model's is {what}: drop them" + (
            " (--threshold sets which labels are its answer)" if self.form == "multi" else ""
        )

    @property
    def mode(self) -> str:
        return "seqcls"

    def prompt(self, system: str | None, template: str) -> PromptFormat:
        if not self.chat:  # the text as the tokenizer encodes it: the format only records that
            return PromptFormat(None, "{text}")
        own = self.head.prompt or {}  # what it was fine-tuned with, where nothing else is typed
        system = own.get("system") if system == DEFAULT_SYSTEM else system
        template = own.get("template", template) if template == DEFAULT_TEMPLATE else template
        return PromptFormat(system, template)

    def record_shape(self, *, calibrated: bool = False, abstains: bool = False, scores: bool = False) -> Any:

        return RecordShape.of(self.labels, calibrated=calibrated, abstains=abstains, scores=scores, form=self.form)

    def info(self) -> dict[str, Any]:
        return {"labels": list(self.labels), "head": self._section()}

    def for_request(self, labels: tuple[str, ...], same_prompt: bool) -> KindSpec | None:
        """Its own labels only (other labels: the zero-shot labels kind, which this model refuses);
        a request's own system message or template opts in to a chat prompt, as on the command line."""
        if labels != self.labels:
            return None
        return self if same_prompt else replace(self, chat=True)

    def manifest(self, mode: str) -> dict[str, Any]:
        return {"labels": list(self.labels), "scoring": mode, "examples": [], "form": self.form, **self._section()}

    def _section(self) -> dict[str, Any]:
        return {"seqcls": {**self.head.to_dict(), "threshold": self.threshold, "chat": self.chat}}

    def to_task(self, path: Any = None) -> dict[str, Any]:
        return {"labels": list(self.labels), **self._section()}

    def task_kwargs(self, mode: str) -> dict[str, Any]:
        return {"labels": self.labels, "section": SeqClsSettings(saved=self._section()["seqcls"])}

    @classmethod
    def read_task(
        cls, d: dict[str, Any], where: str, labels: list[str], calibration: CalibrationSpec
    ) -> dict[str, Any] | None:
        if d.get("seqcls") is None:
            return None
        section = d["seqcls"]
        head = seqcls_head(section, f"{where}: field 'seqcls'")
        if list(head.labels) != labels:
            raise TaskError(
                f"{where}: field 'seqcls' holds the labels {list(head.labels)[:8]}, but the task's labels are "
                f"{labels[:8]}: save the task again"
            )
        return {"section": SeqClsSettings(saved=section)}

    def bind(self, engine: Engine, fmt: PromptFormat, run: RunSettings) -> SeqClsKind:
        return SeqClsKind(self, engine, fmt, run)


def seqcls_head(section: Any, where: str) -> SeqClsHead:
    """The head a task file's `seqcls` section describes (`SeqClsHead.to_dict`'s fields)."""
    try:
        if not isinstance(section, dict):
            raise ValueError("it must be an object")
        labels = section.get("labels")
        if not isinstance(labels, list) or not all(isinstance(x, str) for x in labels):
            raise ValueError("'labels' must be a list of strings")
        pad = section.get("pad_token_id")
        if pad is not None and (isinstance(pad, bool) or not isinstance(pad, int)):
            raise ValueError("'pad_token_id' must be an integer or null")
        head = SeqClsHead(str(section.get("architecture")), tuple(labels), section.get("problem_type"), pad)
    except (ValueError, ModelError) as e:
        raise TaskError(f"{where}: {e}: save the task again") from None
    for key in ("threshold",):
        v = section.get(key, DEFAULT_THRESHOLD)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0.0 <= v <= 1.0:
            raise TaskError(f"{where}: {key!r} must be a number from 0 to 1, got {v!r}: fix it")
    return head


class SeqClsKind(OnePrompt):
    """The model's score head read at each row's last token (see the module docstring)."""

    spec: SeqClsSpec

    def __init__(self, spec: SeqClsSpec, engine: Engine, fmt: PromptFormat, run: RunSettings):
        have = getattr(engine.model, "seqcls", None)
        if have is None:
            raise ModelError(
                f"the task scores a {spec.head.architecture}'s own head, but {engine.path or 'this model'} is a "
                "causal LM without one: use the model the task was saved with"
            )
        if have != spec.head:
            raise ModelError(
                f"the task was saved for a head {spec.head.to_dict()}, but {engine.path or 'this model'} has "
                f"{have.to_dict()}: use the model the task was saved with, or save the task again"
            )
        super().__init__(spec, engine, fmt, run)
        self._settle()

    @property
    def takes_pairs(self) -> bool:
        return True if not self.spec.chat else self.format.pairs

    def pair_problem(self, pair: str | None) -> str | None:
        return None if not self.spec.chat else super().pair_problem(pair)

    def encode(self, texts: Sequence[str], pairs: Sequence[str | None] | None = None) -> list[list[int]]:
        """Each prompt's ids up to the token Transformers reads the score at (trailing pad-id tokens dropped)."""
        if self.spec.chat:
            seqs = super().encode(texts, pairs)
        else:
            seqs = encode_texts(self.engine.tokenizer, texts, None if pairs is None else [p or "" for p in pairs])
        return [self.spec.head.prompt_ids(s) for s in seqs]

    def score(self, batch: Batch, items: list[Item], prefix: PrefixCache | None, st: Stats) -> list[Prediction]:
        spec = self.spec
        logits = self.engine.sequence_logits(batch, prefix).astype(np.float64)  # (B, k)
        probs = spec.head.probabilities(logits)
        count(st, batch, 0)
        labels = spec.labels
        out = []
        for r, item in enumerate(items):
            if spec.form == "label":
                out.append(prediction(item, labels, logits[r], probs[r]))
                continue
            p = Prediction(
                item.index,
                probs={lab: float(x) for lab, x in zip(labels, probs[r])},
                scores={lab: float(x) for lab, x in zip(labels, logits[r])},
                n_tokens=len(item.ids),
                truncated=item.truncated,
            )
            if spec.form == "score":
                p.label, p.value = labels[0], float(probs[r, 0])
            else:
                p.labels = [lab for lab, x in zip(labels, probs[r]) if x >= spec.threshold]
            out.append(p)
        return out
