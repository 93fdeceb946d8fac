"""A decision question and a request, as both APIs ask them, and the bounds both APIs set."""

from __future__ import annotations

import hashlib
import json
import string
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

TYPES = ("noul", "choice", "score")
MAX_QUESTIONS = 400  # OpenAI's bound; System One documents none (transformers serve: 64)
MIN_OPTIONS, MAX_OPTIONS = 2, 255
MIN_LEVELS, MAX_LEVELS = 2, 10
MAX_DEPTH = 32  # nesting of a state or an instruction object (OpenAI's input_json bound)
LETTERS = tuple(string.ascii_uppercase)
YES_NO = ("Yes", "No")
# What is refused when a question does not fit the model's context after its state: the whole
# request (System One answers whole or not at all) or that question alone (OpenAI's refusal).
REFUSALS = ("request", "question")


def text(x: Any) -> str:
    """DECISION_PROMPT's `text` macro: nothing for null, a string as it is, anything else as
    JSON the way Transformers' `tojson` writes it (non-ASCII kept, default separators)."""
    if x is None:
        return ""
    if isinstance(x, str):
        return x
    return json.dumps(x, ensure_ascii=False)


def option_text(option: Any) -> str:
    """An option as the prompt writes it: a name as it is; an OpenAI boolean value as JSON."""
    return option if isinstance(option, str) else json.dumps(option)


def option_labels(options: Sequence[Any]) -> list[str]:
    """The options' names as text, distinct: a string that writes as a boolean value also given
    ("true" with true) is written as JSON (`"true"`), so the two stay apart. What labels them
    beyond the letters, and what keys them wherever an answer is keyed by text (System One's
    probabilities, a calibrator's labels)."""
    typed = {option_text(o) for o in options if isinstance(o, bool)}
    return [json.dumps(o, ensure_ascii=False) if isinstance(o, str) and o in typed else option_text(o) for o in options]


@dataclass(frozen=True)
class DecisionQuestion:
    """One question, as both APIs ask it. `options` are what the answer names (noul: the
    config's noul_options; choice: the names, or OpenAI's typed values; score: "0".."n-1"),
    `descriptions` what the prompt says of each, `levels` a score's OpenAI labels, and `labels`
    what the model reads (Yes/No, A..Z, or the options' own names beyond the letters)."""

    key: str
    type: str
    instructions: Any
    options: tuple[Any, ...]
    descriptions: tuple[Any, ...]
    labels: tuple[str, ...]
    name: str | None = None
    levels: tuple[str, ...] = ()

    def option_names(self) -> tuple[str, ...]:
        """The options as the prompt writes them."""
        return tuple(option_text(o) for o in self.options)

    def answer_names(self) -> tuple[str, ...]:
        """The options as text that tells them apart (`option_labels`): an answer's keys."""
        return tuple(option_labels(self.options))

    def level_names(self) -> tuple[str, ...] | None:
        """A score's levels by name (OpenAI's labels, else System One's descriptions) where each has one
        and they are distinct, else None (other types too): what the names style scores, and what a
        report says beside a level's position ("0".."n-1": its key in an answer and a table)."""
        if self.type != "score":
            return None
        got = tuple(self.levels) if self.levels else tuple(text(d).strip() for d in self.descriptions)
        return got if all(got) and len(set(got)) == len(got) else None

    def level_legend(self) -> str:
        """ "levels by position: 0 = 'poor', 1 = 'fair', ..." for a score with level names, else "":
        said wherever a score's levels are shown by position (levels named "1".."5" are 0..4 there)."""
        got = self.level_names()
        if got is None:
            return ""
        shown = ", ".join(f"{i} = {n!r}" for i, n in enumerate(got[:12]))
        return f"levels by position: {shown}{', ...' if len(got) > 12 else ''}"

    @cached_property
    def digest(self) -> str:
        """The question itself, whatever its wire form or id: its type, its instructions and each
        option with what the prompt says of it, as the model is shown them. A System One question
        and an OpenAI one that show the model the same question have the same digest; a changed
        word, option, description or order gives another. What a task's fitted settings are
        bound to (never the question's id: a client may reuse an id for another question)."""
        shown = self._shown()
        if self.levels and self.level_names() != replace(self, levels=()).level_names():
            # OpenAI's level labels where the names style reads other names than a System One score's
            # descriptions would give ({"label": "Low", "description": "can wait"} is asked as "Low", the
            # System One criterion "Low: can wait" as itself): two questions, two digests
            shown.append(["levels", list(self.level_names() or ())])
        if self.option_names() != self.answer_names():  # an OpenAI string "true" beside the boolean true: the
            shown.append(["shown", list(self.option_names())])  # letters show both as true, the answers keep them apart
        return _digest(shown)

    @property
    def digest_before(self) -> str:
        """The digest as mlx-slm wrote it before a score's level labels and the options as the letters
        show them were part of it: a task saved then binds its methods to its own questions by it
        (`Methods.from_record`)."""
        return _digest(self._shown())

    def _shown(self) -> list[Any]:
        return [self.type, text(self.instructions), list(self.answer_names()), [text(d) for d in self.descriptions]]


def _digest(shown: list[Any]) -> str:
    return hashlib.sha256(json.dumps(shown, ensure_ascii=False).encode("utf-8")).hexdigest()[:16]


@dataclass(frozen=True)
class DecisionRequest:
    """One request: its state and questions, the model it names, OpenAI's prompt_cache_key, and
    what is refused when a question does not fit (`refusal`, one of `REFUSALS`: the route's or
    the run's choice, never the answers' shape)."""

    state: Any
    questions: tuple[DecisionQuestion, ...]
    model: str = ""
    cache_key: str | None = None
    refusal: str = "request"

    def __post_init__(self) -> None:
        if self.refusal not in REFUSALS:
            raise ValueError(f"refusal is one of {REFUSALS}, got {self.refusal!r}")
