"""Chat completions: a conversation's next turn, its choices scored as labels, or its next token.

An item is a `chat.Conversation` (OpenAI's messages, checked), rendered by the model's chat
template (`prompts.render_messages`, what `classify` renders its prompts with). Each item has its
own head (`Item.prefix`): the tokens every rendering of its conversation shares whatever its
last turn says, found on probe texts as the shared head of a prompt format is
(`prompts.PROBES`). So a system message and a history repeated across requests run once (the
engine's prefix LRU), and a batch holds rows of several heads, each after its own KV.

* `ChatChoiceSpec` / `ChatChoiceKind`: the choices scored exactly as the labels kind scores
  labels (`LabelsKind.score`: first-token, or whole choices through the label trie), so the
  answer and its probabilities are `classify`'s for the same prompt and labels (raw: no
  calibration, no abstaining).
* `NextTokenSpec` / `NextTokenKind`: the next token's log-probabilities over the whole
  vocabulary at the last position (the logits in float32, their log-softmax in float64), the
  `TOP_TOKENS` most probable kept with their text and bytes, best first (ties: the lower id);
  the prediction's `label` is the greedy token's text ("" for a special token).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import mlx.core as mx
import numpy as np

from ..engine.engine import Engine
from ..engine.prefix_cache import PrefixCache
from ..text.batching import Batch
from ..text.calibration import CalibrationSpec
from ..text.chat import MAX_TOP_LOGPROBS, Conversation, token_bytes
from ..text.labels import log_softmax
from ..text.predictions import Item, Prediction, Stats
from ..text.prompts import PROBES, PromptFormat, common_prefix, render_messages, tokenize
from .base import KindArgs, KindSettings, KindSpec, OnePrompt, RunSettings, count, require_lm_head
from .labels import LabelsKind, LabelsSpec

TOP_TOKENS = MAX_TOP_LOGPROBS  # the next token's alternatives kept (OpenAI's most)
CHAT_TEMPLATE = "{text}"  # the chat kinds' prompt format: the conversation is the whole prompt
NO_CALIBRATION = "a chat completion answers the model's own probabilities: calibration and min_confidence do not apply"
NO_TRUNCATION = "a chat completion's messages are not cut: shorten them to fit the model's context"


class ChatPrompts:
    """Conversations to items: rendered, tokenized, each with its own head (the mixin both
    chat kinds share; the class it is mixed into gives `engine`, `run`, `max_length`,
    `label_extra`)."""

    engine: Engine
    run: RunSettings
    max_length: int
    label_extra: int

    def items(self, texts: Sequence[Any], start: int = 0) -> list[Item]:
        items = [Item(start + i, []) for i in range(len(texts))]
        with self.engine.lock:  # the tokenizer is not safe to share mid-call
            tok = self.engine.tokenizer
            for it, conv in zip(items, texts):
                if not isinstance(conv, Conversation):
                    it.error = f"a chat item is a conversation (chat.Conversation), got {type(conv).__name__}"
                    continue
                probes = PROBES if self.run.use_prefix_cache else ()
                try:
                    prompts = [render_messages(tok, conv.messages(p)) for p in (None, *probes)]
                except Exception as e:  # noqa: BLE001 - the template is the model's program: what it raises on these messages is the request's answer
                    it.error = f"the model's chat template refused the messages ({str(e) or 'it gave no reason'})"
                    continue
                ids, *heads = tokenize(tok, prompts)
                it.ids, it.prefix = ids, tuple(common_prefix(heads)) if heads else ()
                if len(ids) + self.label_extra > self.max_length:
                    it.error = (
                        f"the messages are {len(ids)} tokens as the chat template renders them"
                        + (f" (and the longest choice {self.label_extra + 1})" if self.label_extra else "")
                        + f", over the model's context of {self.max_length}: shorten them"
                    )
        return items


@dataclass(frozen=True)
class ChatSettings(KindSettings):
    """A chat completion's conversation (`conversation=True`): its items are conversations."""

    NAMES = ("conversation",)

    @classmethod
    def take(cls, named: Any) -> ChatSettings | None:
        return cls() if named.get("conversation") else None

    def named(self, home: str | None = None) -> dict[str, Any]:
        return {"conversation": True}


@dataclass(frozen=True)
class ChatChoiceSpec(LabelsSpec):
    """A chat completion's choices, scored as labels after the rendered conversation."""

    name = "chat"  # type: ignore[misc]
    Settings = ChatSettings
    calibrates = abstains = False  # type: ignore[misc]
    no_calibration = NO_CALIBRATION  # type: ignore[misc]
    truncates = False  # type: ignore[misc]
    no_truncation = NO_TRUNCATION  # type: ignore[misc]

    @classmethod
    def wants(cls, args: KindArgs) -> bool:
        return args.get(ChatSettings) is not None and bool(args.labels)

    @classmethod
    def from_args(cls, args: KindArgs) -> ChatChoiceSpec:
        s = LabelsSpec.from_args(replace(args, examples=(), label_descriptions=None, keep_logits=False))
        return cls(s.names, s.scoring, label_pass=s.label_pass)

    def prompt(self, system: str | None, template: str) -> PromptFormat:
        return PromptFormat(None, CHAT_TEMPLATE)

    def for_request(self, labels: tuple[str, ...], same_prompt: bool) -> KindSpec | None:
        return None

    @classmethod
    def read_task(cls, d: dict[str, Any], where: str, labels: list[str], calibration: CalibrationSpec) -> None:
        return None  # a service request's kind: never a task file's

    def bind(self, engine: Engine, fmt: PromptFormat, run: RunSettings) -> ChatChoiceKind:
        return ChatChoiceKind(self, engine, fmt, run)


class ChatChoiceKind(ChatPrompts, LabelsKind):
    """The labels kind on conversations: `LabelsKind.score` scores each batch."""

    def __init__(self, spec: LabelsSpec, engine: Engine, fmt: PromptFormat, run: RunSettings):
        super().__init__(spec, engine, fmt, run)
        self.prefix_tokens = ()  # every item has its own head (its conversation's)


@dataclass(frozen=True)
class NextTokenSpec(KindSpec):
    """A chat completion's next token and its top log-probabilities over the vocabulary."""

    name = "next-token"  # type: ignore[misc]
    Settings = ChatSettings
    calibrates = abstains = False  # type: ignore[misc]
    no_calibration = NO_CALIBRATION  # type: ignore[misc]
    truncates = False  # type: ignore[misc]
    no_truncation = NO_TRUNCATION  # type: ignore[misc]

    @classmethod
    def wants(cls, args: KindArgs) -> bool:
        return args.get(ChatSettings) is not None and not args.labels

    @classmethod
    def from_args(cls, args: KindArgs) -> NextTokenSpec:
        return cls()

    @property
    def labels(self) -> tuple[str, ...]:
        return ()

    def prompt(self, system: str | None, template: str) -> PromptFormat:
        return PromptFormat(None, CHAT_TEMPLATE)

    def bind(self, engine: Engine, fmt: PromptFormat, run: RunSettings) -> NextTokenKind:
        return NextTokenKind(self, engine, fmt, run)


class NextTokenKind(ChatPrompts, OnePrompt):
    """The next token of each conversation: the most probable `TOP_TOKENS` of the vocabulary."""

    def __init__(self, spec: NextTokenSpec, engine: Engine, fmt: PromptFormat, run: RunSettings):
        require_lm_head(engine)
        super().__init__(spec, engine, fmt, run)
        self._settle()
        self.prefix_tokens = ()  # every item has its own head (its conversation's)
        tok = engine.tokenizer
        with engine.lock:
            # A special token is no text of the answer (as skip_special_tokens decodes it); the
            # end-of-sequence token ends it (OpenAI's finish_reason "stop").
            self.special_ids = frozenset(int(i) for i in tok.all_special_ids)
            self.eos_ids = frozenset(int(i) for i in [tok.eos_token_id] if i is not None)

    @property
    def mode(self) -> str:
        return "next-token"

    def score(self, batch: Batch, items: list[Item], prefix: PrefixCache | None, st: Stats) -> list[Prediction]:
        _, full, _ = self.engine.forward(batch, prefix, mx.array([0], dtype=mx.int32), keep_logits=True)
        count(st, batch, 0)
        assert full is not None
        lp = log_softmax(full)  # float64, of the float32 logits
        out = []
        with self.engine.lock:
            for r, it in enumerate(items):
                top = top_ids(lp[r], TOP_TOKENS)
                tokens = [(int(t), self._text(int(t)), float(lp[r, t]), self._bytes(int(t))) for t in top]
                text = "" if tokens[0][0] in self.special_ids else tokens[0][1]
                out.append(Prediction(it.index, text, n_tokens=len(it.ids), tokens=tokens))
        return out

    def _text(self, token_id: int) -> str:
        return self.engine.tokenizer.decode([token_id])

    def _bytes(self, token_id: int) -> bytes:
        return token_bytes(self.engine.tokenizer, token_id)


def top_ids(row: np.ndarray, k: int) -> np.ndarray:
    """The `k` largest entries' indices of `row`, largest first, ties by the lower index."""
    k = min(k, len(row))
    cut = np.argpartition(-row, k - 1)[:k]
    # the k-th value may be tied with entries argpartition left out: take every entry at least as large
    cand = np.nonzero(row >= row[cut].min())[0]
    return cand[np.lexsort((cand, -row[cand]))][:k]


__all__ = ["ChatChoiceKind", "ChatChoiceSpec", "ChatSettings", "NextTokenKind", "NextTokenSpec", "top_ids"]
