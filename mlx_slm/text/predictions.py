"""What a run gives back: one `Prediction` per item, the run's figures (`Stats`), and the
tokenized `Item` a scoring kind works on. Shared by the classifier and the kinds."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class Prediction:
    """One item's result, or its error (then `label` is None and `error` says why)."""

    index: int
    label: str | None = None
    probs: dict[str, float] = field(default_factory=dict)
    scores: dict[str, float] = field(default_factory=dict)
    n_tokens: int = 0
    truncated: bool = False
    error: str | None = None
    logits: np.ndarray | None = field(default=None, repr=False)  # full-vocab last logits, on request
    raw_probs: dict[str, float] | None = None  # the model's own probs, when `probs` are calibrated
    abstained: bool = False  # under the confidence threshold: `label` is None, route to a person
    # With several questions: {question name: its answer} (`label` is None, `probs` empty).
    answers: dict[str, dict[str, Any]] | None = None
    # A multi-label head (a sigmoid per label): the labels at or above its threshold (`label` is None).
    labels: list[str] | None = None
    # A one-output head (a reranker, a reward model): its score (a sigmoid, or the raw value of a
    # regression head); `scores` keeps the raw logit.
    value: float | None = None
    # The next token (a chat completion's `max_tokens: 1`): the most probable tokens, best first, each
    # (token id, text, log-probability, bytes); `label` is the first one's text.
    tokens: list[tuple[int, str, float, bytes]] | None = field(default=None, repr=False)

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass
class Stats:
    items: int = 0
    errors: int = 0
    seconds: float = 0.0
    prompt_tokens: int = 0  # what an unbatched, uncached run would process
    processed_tokens: int = 0  # what the forward actually ran: padded batches + prefix once + label tokens
    padding_tokens: int = 0
    prefix_saved_tokens: int = 0
    label_tokens: int = 0
    batches: int = 0

    @property
    def items_per_s(self) -> float:
        return self.items / self.seconds if self.seconds else 0.0

    @property
    def padding_pct(self) -> float:
        return 100.0 * self.padding_tokens / self.processed_tokens if self.processed_tokens else 0.0

    @property
    def prefix_saved_pct(self) -> float:
        return 100.0 * self.prefix_saved_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "items": self.items,
            "errors": self.errors,
            "seconds": round(self.seconds, 3),
            "items_per_s": round(self.items_per_s, 3),
            "prompt_tokens": self.prompt_tokens,
            "processed_tokens": self.processed_tokens,
            "padding_tokens": self.padding_tokens,
            "padding_pct": round(self.padding_pct, 2),
            "prefix_saved_tokens": self.prefix_saved_tokens,
            "prefix_saved_pct": round(self.prefix_saved_pct, 2),
            "label_tokens": self.label_tokens,
            "batches": self.batches,
        }


@dataclass
class Item:
    index: int
    ids: list[int]
    truncated: bool = False
    error: str | None = None
    chains: list[list[int]] = field(default_factory=list)  # several questions: each block's own tokens
    # The prompt head this item continues, when its kind gives each item its own (a reranker's
    # query: its documents run after the query's cached KV); None: the kind's shared head.
    prefix: tuple[int, ...] | None = None
    # An embedding's tokens its pooling leaves out at the start (a prompt sentence-transformers
    # excludes from a mean or first-token pooling: `include_prompt` false).
    skip: int = 0
