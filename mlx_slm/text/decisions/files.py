"""A questions file (`--questions Q.json`): a System One `questions` object, an OpenAI
`questions` list, or a whole request body of either, read with a model's decision settings."""

from __future__ import annotations

import json
from typing import Any

from ...ground.textfiles import InputError, read_text_file
from .errors import DecisionError
from .openai import openai_questions
from .questions import DecisionQuestion
from .settings import DecisionConfig
from .systemone import systemone_questions


def read_questions_file(path: str, config: DecisionConfig | None = None) -> tuple[DecisionQuestion, ...]:
    """Questions from a JSON file: a System One `questions` object, an OpenAI `questions` list,
    or a whole request body of either. A problem is a `DecisionError` naming the file."""
    return load_questions_file(path, config)[1]


def load_questions_file(path: str, config: DecisionConfig | None = None) -> tuple[Any, tuple[DecisionQuestion, ...]]:
    """A questions file's questions as JSON (a whole body's `questions` taken out: what a run
    records) and as read (`read_questions_file`)."""
    config = config or DecisionConfig()
    try:
        raw = read_text_file(path, "--questions")
        obj = json.loads(raw, object_pairs_hook=_once)
    except InputError as e:
        raise DecisionError((), str(e)) from None
    except _Twice as e:  # JSON keeps the last silently: a question, an option or a field would vanish unseen
        raise DecisionError(
            (),
            f"--questions {path}: the key {e.key!r} is written twice in one object (JSON keeps only the last, so "
            "the other would be dropped unseen): give each question id, option and field once",
        ) from None
    except (ValueError, RecursionError) as e:
        raise DecisionError((), f"--questions {path}: not valid JSON ({e}): fix the file") from None
    try:
        return unwrap_questions(obj), questions_of(obj, config, strict=True)
    except DecisionError as e:
        raise DecisionError((), f"--questions {path}: {e}", e.type) from None  # {e} names the field


class _Twice(ValueError):
    def __init__(self, key: str):
        super().__init__(key)
        self.key = key


def _once(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys are each written once (`json.loads`'s object_pairs_hook)."""
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise _Twice(k)
        out[k] = v
    return out


def unwrap_questions(obj: Any) -> Any:
    """A questions file's questions: a whole request body's `questions` (an OpenAI list, or a System
    One object of questions), else the file itself (a System One questions object may hold a
    question whose id is "questions": its value is one question, with its type, not an object of them)."""
    got = obj.get("questions") if isinstance(obj, dict) else None
    if isinstance(got, list) or (isinstance(got, dict) and not isinstance(got.get("type"), str)):
        return got  # (a question has a type; an object of questions has none, or a question called "type")
    return obj


def questions_of(obj: Any, config: DecisionConfig, strict: bool = False) -> tuple[DecisionQuestion, ...]:
    """The questions of a parsed questions file (see `read_questions_file`); `strict`: a System One
    question's unknown fields refused (a file given now; a task's questions are read as saved)."""
    obj = unwrap_questions(obj)
    if isinstance(obj, list):
        return openai_questions(obj, config)
    if isinstance(obj, dict):
        return systemone_questions(obj, config, strict=strict)
    raise DecisionError(
        (),
        "a questions file holds a System One questions object, an OpenAI questions list, or a whole request body",
        "type_error",
    )
