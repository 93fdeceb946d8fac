"""A sequence-classification head as its checkpoint's config describes it (pure: no model).

Transformers' `Qwen2/Qwen3/Llama/Gemma3...ForSequenceClassification` is the causal backbone
and `score = Linear(hidden, num_labels, bias=False)` read at the last token that is not
`pad_token_id` (`GenericForSequenceClassification`); it has no LM head. `SeqClsHead` holds
what its config says about that head, checked once (where a checkpoint is converted or
loaded): the labels (`id2label`, `LABEL_0`... when absent), `problem_type`, and
`pad_token_id`. It turns the head's logits into probabilities exactly as Transformers'
text-classification pipeline does by default (`postprocess`, `function_to_apply` unset):

* `problem_type == "regression"`: none (the raw values);
* `"multi_label_classification"`, or one label: a sigmoid per label;
* `"single_label_classification"`, or unset with several labels: a softmax.

`models` builds the `score` Linear from it (`ModelArgs.seqcls`); the kinds above read it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..ground.errors import ModelError
from ..ground.textfiles import has_lone_surrogate

SUFFIX = "ForSequenceClassification"
PROBLEM_TYPES = ("single_label_classification", "multi_label_classification", "regression")
SCORE = "score"  # the head's module name in every Transformers sequence classifier (`score.weight`)
SCORE_WEIGHT = f"{SCORE}.weight"
FUNCTIONS = ("softmax", "sigmoid", "none")  # the pipeline's `function_to_apply` values


def seqcls_architecture(config: Mapping[str, Any]) -> str | None:
    """The config's first architecture if it is a `*ForSequenceClassification`, else None
    (a causal LM: its LM head scores label tokens). `architectures` that are not a list of
    strings, or that name a sequence classifier after another class (both a causal LM and a
    sequence classifier), are a ModelError saying so: the checkpoint is one or the other."""
    archs = config.get("architectures")
    if archs is None:
        return None
    if not isinstance(archs, (list, tuple)) or not all(isinstance(a, str) for a in archs):
        raise ModelError(
            f"architectures {archs!r} is not a list of class names: set it to the checkpoint's class, e.g. "
            '["Qwen2ForCausalLM"] or ["Qwen2ForSequenceClassification"]'
        )
    if archs and archs[0].endswith(SUFFIX):
        return archs[0]
    later = [a for a in archs[1:] if a.endswith(SUFFIX)]
    if later:
        raise ModelError(
            f"architectures names both {archs[0]!r} and {later[0]!r}: a checkpoint is one class; keep "
            f"{later[0]!r} alone if it holds a {SCORE_WEIGHT} head (a sequence classifier), else {archs[0]!r} alone"
        )
    return None


def _text_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The text model's part (a multimodal Gemma 3's `text_config`), as `get_text_config()` reads it."""
    text = config.get("text_config")
    return text if isinstance(text, Mapping) else config


@dataclass(frozen=True)
class SeqClsHead:
    """What a sequence classifier's config says about its head.

    architecture: e.g. "Qwen2ForSequenceClassification".
    labels: id2label in id order (the score's rows), `LABEL_i` when the config has none.
    problem_type: as the config says (None when unset).
    pad_token_id: the text config's; Transformers reads the score at the last token that
        is not this id (`prompt_ids`), at the last token when it is None.
    prompt: the chat prompt it was fine-tuned with, when the config records one (`mlx-slm
        export` writes `mlx_slm.prompt`: its system message and template), else None.
    none_label: the label that means "none of these", when the config records one (`mlx-slm
        export` of a task with a none label writes `mlx_slm.none`), else None.
    """

    architecture: str
    labels: tuple[str, ...]
    problem_type: str | None = None
    pad_token_id: int | None = None
    prompt: dict[str, Any] | None = field(default=None, compare=False)
    none_label: str | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if not self.labels:
            raise ModelError(f"{self.architecture}: a sequence classifier needs at least one label")
        if self.problem_type is not None and self.problem_type not in PROBLEM_TYPES:
            raise ModelError(
                f"problem_type {self.problem_type!r} is not one Transformers knows "
                f"({', '.join(PROBLEM_TYPES)}): set it to one of those, or remove it"
            )
        if self.problem_type == "single_label_classification" and self.num_labels == 1:
            raise ModelError(
                "problem_type 'single_label_classification' needs more than one label (Transformers "
                "refuses it too): a one-output head is 'regression' (raw score) or unset (a sigmoid)"
            )

    @property
    def num_labels(self) -> int:
        return len(self.labels)

    @property
    def function(self) -> str:
        """ "softmax", "sigmoid" or "none": the text-classification pipeline's default `function_to_apply`."""
        if self.problem_type == "regression":
            return "none"
        if self.problem_type == "multi_label_classification" or self.num_labels == 1:
            return "sigmoid"
        return "softmax"

    @property
    def multi_label(self) -> bool:
        """Whether each label is scored on its own (a sigmoid per label, several labels)."""
        return self.function == "sigmoid" and self.num_labels > 1

    def probabilities(self, logits: Any) -> np.ndarray:
        """The pipeline's scores of logits (..., num_labels), in float64: softmax over the
        labels, a sigmoid of each, or the logits as they are (regression)."""
        x = np.asarray(logits, dtype=np.float64)
        if x.shape[-1:] != (self.num_labels,):
            raise ValueError(f"logits of shape {x.shape} for a head of {self.num_labels} labels")
        if self.function == "softmax":
            e = np.exp(x - x.max(axis=-1, keepdims=True))
            return e / e.sum(axis=-1, keepdims=True)
        if self.function == "sigmoid":
            return np.exp(-np.logaddexp(0.0, -x))  # = 1 / (1 + exp(-x)), without overflow or cancellation
        return x

    def prompt_ids(self, ids: Sequence[int]) -> list[int]:
        """The tokens up to the one Transformers reads the score at: trailing `pad_token_id`
        tokens dropped (its rightmost token that is not the pad id; the first token if all
        are). A causal model's state there does not see the dropped tokens, so running
        these ids and reading the last position gives Transformers' logits exactly."""
        ids = list(ids)
        if self.pad_token_id is None:
            return ids
        end = len(ids)
        while end > 1 and ids[end - 1] == self.pad_token_id:
            end -= 1
        return ids[:end]

    def no_lm_head(self) -> str:
        """Why label tokens, questions or a yes/no prompt cannot be scored on this model."""
        return (
            f"this model is a {self.architecture} (a {self.num_labels}-label score head: "
            f"{', '.join(self.labels[:8])}{', ...' if self.num_labels > 8 else ''}) and has no LM head, so it "
            "cannot score label tokens, questions or a yes/no prompt: classify with its own labels (drop "
            "--labels/--questions), or use a causal LM (*ForCausalLM) for those"
        )

    def to_dict(self) -> dict[str, Any]:
        """What `doctor`, `/v1/model` and a task file say about the head."""
        return {
            "architecture": self.architecture,
            "labels": list(self.labels),
            "problem_type": self.problem_type,
            "function": self.function,
            "pad_token_id": self.pad_token_id,
        }

    @classmethod
    def from_config(cls, config: Mapping[str, Any], where: str = "config.json") -> SeqClsHead | None:
        """The head of a `*ForSequenceClassification` config (None for any other), read as
        Transformers reads it; a config it cannot read right is a ModelError naming `where`,
        the field and the fix."""
        try:
            arch = seqcls_architecture(config)
            if arch is None:
                return None
            labels = _labels(config)
            return cls(arch, labels, _problem_type(config), _pad_id(config), _prompt(config), _none(config, labels))
        except ModelError as e:
            raise ModelError(f"{where}: {e}") from None

    def check_weight(self, shape: Sequence[int] | None, hidden_size: int | None, where: str) -> None:
        """Refuse a `score.weight` that is missing or not (num_labels, hidden_size), naming
        `where` (the weights file) and the fix (hidden_size None: the rows only)."""
        want = (self.num_labels, int(hidden_size) if hidden_size else (tuple(shape or ()) + (0, 0))[1])
        if shape is None:
            raise ModelError(
                f"{where}: no {SCORE_WEIGHT}, though config.json names {self.architecture}: the checkpoint's "
                "sequence-classification head is missing; use the complete checkpoint (or, for a causal LM, "
                "an architectures entry *ForCausalLM in config.json)"
            )
        if tuple(int(x) for x in shape) != want:
            raise ModelError(
                f"{where}: {SCORE_WEIGHT} has shape {tuple(shape)}, but config.json says {self.num_labels} "
                f"labels (id2label/num_labels) of hidden size {hidden_size}, so {want}: fix id2label (and "
                "label2id, num_labels) to the head's rows, or use the checkpoint this config belongs to"
            )


def _prompt(config: Mapping[str, Any]) -> dict[str, Any] | None:
    """The chat prompt an exported fine-tune records (`mlx_slm.prompt`: system and template), or None."""
    own = config.get("mlx_slm")
    p = own.get("prompt") if isinstance(own, Mapping) else None
    if isinstance(p, Mapping) and isinstance(p.get("template"), str) and "{text}" in p["template"]:
        system = p.get("system")
        return {"system": system if isinstance(system, str) else None, "template": p["template"]}
    return None


def _none(config: Mapping[str, Any], labels: Sequence[str]) -> str | None:
    """The label an exported fine-tune records as meaning "none of these" (`mlx_slm.none.label`), or None."""
    own = config.get("mlx_slm")
    none = own.get("none") if isinstance(own, Mapping) else None
    label = none.get("label") if isinstance(none, Mapping) else None
    return label if isinstance(label, str) and label in labels else None


def _problem_type(config: Mapping[str, Any]) -> str | None:
    pt = config.get("problem_type")
    if pt is not None and not isinstance(pt, str):
        raise ModelError(
            f"problem_type {pt!r} is not a string: set it to one of {', '.join(PROBLEM_TYPES)}, or remove it"
        )
    return pt


def _labels(config: Mapping[str, Any]) -> tuple[str, ...]:
    """id2label in id order; `LABEL_i` for `num_labels` (default 2) when absent, as Transformers.
    Every field Transformers reads about the labels is checked (its config class would fail on
    a `num_labels` of "3", or a `label2id` that is not a mapping, at the tokenizer's load)."""

    id2label = config.get("id2label")
    n = config.get("num_labels", 2)
    if "num_labels" in config and (not isinstance(n, int) or isinstance(n, bool) or n < 1):
        raise ModelError(
            f"num_labels {n!r} is not a positive integer: set it to the head's rows (a number, not a string)"
        )
    label2id = config.get("label2id")
    if label2id is not None and (
        not isinstance(label2id, Mapping)
        or not all(isinstance(v, int) and not isinstance(v, bool) for v in label2id.values())
    ):
        raise ModelError(
            f"label2id {label2id!r} is not a mapping of labels to ids, e.g. "
            '{"negative": 0, "positive": 1}: fix it (the inverse of id2label), or remove it'
        )
    if id2label is None:
        return tuple(f"LABEL_{i}" for i in range(n))
    if not isinstance(id2label, Mapping) or not id2label:
        raise ModelError(
            f"id2label {id2label!r} is not a mapping of ids to labels, e.g. "
            '{"0": "negative", "1": "positive"}: fix it, or remove it (labels LABEL_0...)'
        )
    got: dict[int, Any] = {}
    for k, v in id2label.items():
        try:
            got[int(k)] = v
        except (TypeError, ValueError):
            raise ModelError(f"id2label key {k!r} is not an id (0, 1, ...): number the labels from 0") from None
    n = len(got)
    if sorted(got) != list(range(n)):
        raise ModelError(
            f"id2label keys {sorted(got)} are not 0..{n - 1}: number the labels 0..{n - 1} in the "
            "order of the score head's rows"
        )
    labels = tuple(got[i] for i in range(n))
    for i, lab in enumerate(labels):
        if not isinstance(lab, str) or not lab.strip():
            raise ModelError(f"id2label[{i}] is {lab!r}: each label must be a non-empty string")
        if has_lone_surrogate(lab):
            raise ModelError(
                f"id2label[{i}] holds an unpaired surrogate escape ({ascii(lab)[:40]}), not valid Unicode text: "
                "fix the label (a lone \\ud800 is half of a pair)"
            )
    if any(has_lone_surrogate(str(k)) for k in (label2id or {})):
        raise ModelError("label2id holds an unpaired surrogate escape, not valid Unicode text: fix the label")
    twins = sorted({lab for lab in labels if labels.count(lab) > 1})
    if twins:
        raise ModelError(f"id2label names {twins[0]!r} for several ids: give each id its own label in id2label")
    return labels


def _pad_id(config: Mapping[str, Any]) -> int | None:
    pad = _text_config(config).get("pad_token_id")
    if pad is not None and (not isinstance(pad, int) or isinstance(pad, bool)):
        raise ModelError(f"pad_token_id {pad!r} is not a token id: fix it, or remove it")
    return pad


def check_head_tensor(
    head: SeqClsHead | None,
    shape: Sequence[int] | None,
    hidden_size: int | None,
    where: str,
    packed: bool = False,
    names: Sequence[str] = (),
) -> None:
    """Refuse a checkpoint whose `score.weight` (`shape`, None when absent) does not match
    its config: missing or of the wrong shape in a sequence classifier (`head`), or present
    in one whose config names no *ForSequenceClassification (it would load as a causal LM
    and drop its head). `packed`: a quantized score, whose stored shape says nothing.
    `names`: every tensor name of the checkpoint; a `score.*` tensor other than the weight
    (`score.bias`: Transformers' score Linear has no bias, and would drop it) is refused."""
    allowed = {SCORE_WEIGHT} | ({f"{SCORE}.scales", f"{SCORE}.biases"} if packed else set())
    extra = sorted(n for n in names if n.startswith(f"{SCORE}.") and n not in allowed)
    if extra:
        raise ModelError(
            f"{where} holds {', '.join(extra[:3])}, but a sequence classifier's {SCORE} is a Linear without a bias "
            f"(Transformers' *ForSequenceClassification has only {SCORE_WEIGHT}, and would drop {extra[0]}, changing "
            f"every score): remove {extra[0]} from the checkpoint (fold it into a model that has one), or use another model"
        )
    if head is None:
        if shape is not None:
            raise ModelError(
                f"{where} holds {SCORE_WEIGHT} (a sequence-classification head), but config.json's architectures "
                "names no *ForSequenceClassification: set architectures to the checkpoint's class (e.g. "
                '["Qwen2ForSequenceClassification"]) and convert it again'
            )
        return
    if not packed:
        head.check_weight(shape, hidden_size, where)
