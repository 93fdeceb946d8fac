"""The checks both decision APIs make of what a request holds: a state or an instruction is a
string, an object or an array (or null where allowed), nested at most `MAX_DEPTH` deep, valid
Unicode and finite; a model name; a count within bounds. Each problem a `DecisionError` with
FastAPI's `loc`."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ...ground.textfiles import not_utf8
from .errors import DecisionError
from .questions import MAX_DEPTH

CONTENT = "a string, an object or an array"


def state_problem(state: Any, loc: tuple = ("body", "state")) -> DecisionError | None:
    """Why `state` cannot be a request's state (not a string, object or array; too deep; not
    valid Unicode), as the routes say it, or None: `decide` checks each input row's state with it."""
    return content_problem(state, loc, "the state", nullable=False)


def content_problem(x: Any, loc: tuple, what: str, nullable: bool = True, depth: int = 0) -> DecisionError | None:
    """Why `x` is not a string/object/array (or null where allowed), too deep, or not UTF-8."""
    if x is None:
        return None if nullable else DecisionError(loc, f"{what} is null: give {CONTENT}", "type_error")
    if not isinstance(x, (str, dict, list)):
        return DecisionError(loc, f"{what} must be {CONTENT}, got {json_type(x)}", "type_error")
    return json_problem(x, loc, what)


def json_problem(x: Any, loc: tuple, what: str) -> DecisionError | None:
    """A JSON value nested over `MAX_DEPTH`, or holding text that is not UTF-8 (a lone surrogate)."""
    stack = [(x, 0)]
    while stack:
        v, d = stack.pop()
        if d > MAX_DEPTH:
            return DecisionError(loc, f"{what} is nested over {MAX_DEPTH} levels deep: flatten it", "too_deep")
        if isinstance(v, str):
            why = not_utf8(v)
            if why:
                return DecisionError(loc, f"{what} is not valid Unicode ({why}): fix the text", "value_error")
        elif isinstance(v, dict):
            for k, item in v.items():
                if isinstance(k, str) and not_utf8(k):
                    return DecisionError(loc, f"{what} has a key that is not valid Unicode: fix it", "value_error")
                stack.append((item, d + 1))
        elif isinstance(v, list):
            stack.extend((item, d + 1) for item in v)
        elif isinstance(v, float) and not math.isfinite(v):
            return DecisionError(loc, f"{what} holds {v}, which JSON cannot write", "value_error")
    return None


def json_type(x: Any) -> str:
    return {
        bool: "a boolean",
        int: "a number",
        float: "a number",
        str: "a string",
        list: "an array",
        dict: "an object",
        type(None): "null",
    }.get(type(x), type(x).__name__)


def check_model(body: Mapping[str, Any], example: str = "jev-latest") -> str:
    """The request's `model`, a non-empty string (`example`: the name the route's client sends by default)."""
    if "model" not in body:
        raise DecisionError(("body", "model"), f"field required: name the model (e.g. {example!r})", "missing")
    model = body["model"]
    if not isinstance(model, str) or not model:
        raise DecisionError(("body", "model"), f"the model is a non-empty string, got {json_type(model)}", "type_error")
    return model


def count_problem(n: int, lo: int, hi: int, loc: tuple, what: str) -> DecisionError | None:
    if n < lo:
        return DecisionError(loc, f"{n} {what}: give at least {lo}", "too_short")
    if n > hi:
        return DecisionError(loc, f"{n} {what}: at most {hi} are allowed", "too_long")
    return None


def name_problem(name: Any, loc: tuple, what: str) -> DecisionError | None:
    """Why `name` (a question id, an option's name) is no name: not a string, empty or blank,
    or not valid Unicode (a lone surrogate), each said as it is; None if it is fine."""
    if not isinstance(name, str):
        return DecisionError(loc, f"{what} must be a string, got {json_type(name)}", "type_error")
    why = not_utf8(name)
    if why:
        return DecisionError(loc, f"{what} is not valid Unicode ({why}): fix the text", "value_error")
    if not name.strip():
        return DecisionError(loc, f"{what} must be non-empty text, got {name!r}", "value_error")
    return None
