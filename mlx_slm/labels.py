"""Label token sequences and the choice between first-token and full-sequence scoring.

Labels are tokenized as the model would emit them right after the generation prompt:
we tokenize `prompt + label` and keep the ids past the prompt's own ids, so a merge at
the boundary is seen. When every label is one token (and so all first tokens differ),
the logits of those tokens at the last prompt position decide. Otherwise (a label of
several tokens, or labels that share a first token) each label is scored as the sum of
the log-probabilities of its tokens.

In sequence mode the first token's log-probability is taken from the label rows only:
its normalizer (the log-sum-exp over the whole vocabulary at the last prompt position)
is the same for every label of an item, so it cancels in the softmax over labels and
never changes which label wins. Later tokens are normalized over the full vocabulary,
since each label's context differs there. Reported `scores` are therefore
log-probabilities up to one per-item constant; `probs` are exact.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import UserError

MODES = ("auto", "first-token", "sequence")


class LabelError(UserError, ValueError):
    pass


@dataclass(frozen=True)
class LabelSet:
    labels: tuple[str, ...]
    token_ids: tuple[tuple[int, ...], ...]
    mode: str  # "first-token" or "sequence"

    @property
    def first_ids(self) -> list[int]:
        return [t[0] for t in self.token_ids]

    @property
    def max_len(self) -> int:
        return max(len(t) for t in self.token_ids)


def parse_labels(text: str) -> list[str]:
    """Comma-separated labels from the command line; whitespace around each is dropped."""
    return [part.strip() for part in text.split(",")]


def validate(labels: Sequence[str]) -> list[str]:
    labels = list(labels)
    if len(labels) < 2:
        raise LabelError(f"need at least two labels to choose from, got {labels!r}")
    for i, lab in enumerate(labels):
        if not isinstance(lab, str) or not lab.strip():
            raise LabelError(f"label {i + 1} is empty: remove it or give it a name (labels: {labels!r})")
    seen: dict[str, int] = {}
    for i, lab in enumerate(labels):
        if lab in seen:
            raise LabelError(f"label {lab!r} is given twice (positions {seen[lab] + 1} and {i + 1})")
        seen[lab] = i
    return labels


def tokenize_labels(tokenizer: Any, labels: Sequence[str], probe_prompt: str, sep: str = "") -> list[tuple[int, ...]]:
    """Ids of each label as emitted right after `probe_prompt` (a rendered prompt).

    `sep` goes between prompt and label: "" after a chat template's generation prompt, " "
    after a plain-text prompt such as "Category:" (a base model writes "Category: billing").
    """
    head = tokenizer(probe_prompt, add_special_tokens=False)["input_ids"]
    out = []
    for lab in labels:
        both = tokenizer(probe_prompt + sep + lab, add_special_tokens=False)["input_ids"]
        if both[: len(head)] == head and len(both) > len(head):
            ids = both[len(head) :]
        else:  # the label merged into the prompt's last token: fall back to the label alone
            ids = tokenizer(sep + lab, add_special_tokens=False)["input_ids"]
        out.append(tuple(int(i) for i in ids))
    return out


def build_labelset(tokenizer: Any, labels: Sequence[str], probe_prompt: str, mode: str = "auto") -> LabelSet:
    labels = validate(labels)
    if mode not in MODES:
        raise LabelError(f"scoring mode {mode!r} is not one of {', '.join(MODES)}")
    plain = not getattr(tokenizer, "chat_template", None) and not probe_prompt.endswith((" ", "\n"))
    ids = tokenize_labels(tokenizer, labels, probe_prompt, sep=" " if plain else "")
    for lab, t in zip(labels, ids):
        if not t:
            raise LabelError(f"label {lab!r} tokenizes to nothing")
    by_ids: dict[tuple[int, ...], str] = {}
    for lab, t in zip(labels, ids):
        if t in by_ids:
            raise LabelError(f"labels {by_ids[t]!r} and {lab!r} tokenize identically ({list(t)}): make them differ")
        by_ids[t] = lab
    firsts = [t[0] for t in ids]
    can_first = all(len(t) == 1 for t in ids) and len(set(firsts)) == len(firsts)
    if mode == "first-token" and not can_first:
        raise LabelError(
            "first-token scoring needs every label to be one distinct token; "
            f"token ids here: {dict(zip(labels, map(list, ids)))}. Use --scoring sequence (or auto)"
        )
    chosen = "first-token" if (mode == "first-token" or (mode == "auto" and can_first)) else "sequence"
    return LabelSet(tuple(labels), tuple(ids), chosen)


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def log_softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    m = x.max(axis=axis, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=axis, keepdims=True))
