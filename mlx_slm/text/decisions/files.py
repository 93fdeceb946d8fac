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
        obj = json.loads(raw)
    except InputError as e:
        raise DecisionError((), str(e)) from None
    except (ValueError, RecursionError) as e:
        raise DecisionError((), f"--questions {path}: not valid JSON ({e}): fix the file") from None
    try:
        return unwrap_questions(obj), questions_of(obj, config, strict=True)
    except DecisionError as e:
        raise DecisionError((), f"--questions {path}: {e}", e.type) from None  # {e} names the field


def unwrap_questions(obj: Any) -> Any:
    """A questions file's questions: a whole request body's `questions`, else the file itself."""
    return obj["questions"] if isinstance(obj, dict) and isinstance(obj.get("questions"), (dict, list)) else obj


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
