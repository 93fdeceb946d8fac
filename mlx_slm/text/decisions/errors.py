"""A decision request's problems, each with FastAPI's `loc` (the path to the field, from "body")
and a `type`, so each route words them in its own shape (System One's 422 `detail[]`, OpenAI's
400 `param`, a file's line)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from ...ground.errors import UserError


class DecisionError(UserError, ValueError):
    """One problem with a decision request: where (`loc`, from "body"), what (`msg`, naming the
    fix) and its kind (`type`: missing, value_error, type_error, too_long, too_short, images,
    tokens_exceeded, ...)."""

    def __init__(self, loc: Sequence[Any], msg: str, type: str = "value_error"):
        self.loc, self.msg, self.type = tuple(loc), msg, type
        where = ".".join(str(x) for x in self.loc[1:]) if self.loc[:1] == ("body",) else ".".join(map(str, self.loc))
        super().__init__(f"{where}: {msg}" if where else msg)

    def detail(self) -> dict[str, Any]:
        """FastAPI's validation item, as System One's 422 lists them."""
        return {"loc": list(self.loc), "msg": self.msg, "type": self.type}


class DecisionErrors(DecisionError):
    """Several problems at once (every bad question of a request); `errors` lists them."""

    def __init__(self, errors: Sequence[DecisionError]):
        self.errors = list(errors)
        first = self.errors[0]
        super().__init__(first.loc, first.msg, first.type)
        self.args = ("; ".join(str(e) for e in self.errors),)

    def detail(self) -> dict[str, Any]:  # the first; `details` gives them all
        return self.errors[0].detail()

    def details(self) -> list[dict[str, Any]]:
        return [e.detail() for e in self.errors]


def details(error: DecisionError) -> list[dict[str, Any]]:
    """Every validation item of an error (one, or each of `DecisionErrors`)."""
    return error.details() if isinstance(error, DecisionErrors) else [error.detail()]


def raise_all(errors: list[DecisionError]) -> None:
    """Nothing for no errors; the one error; else all of them as `DecisionErrors`."""
    if len(errors) == 1:
        raise errors[0]
    if errors:
        raise DecisionErrors(errors)


T = TypeVar("T")


def attempt(errors: list[DecisionError], parse: Callable[..., T], *args: Any, default: Any = None) -> T | Any:
    """parse(*args), or `default` with its problem(s) added to `errors`: a body is checked whole,
    so a client is told every mistake at once (`raise_all` after the last part)."""
    try:
        return parse(*args)
    except DecisionErrors as e:
        errors.extend(e.errors)
    except DecisionError as e:
        errors.append(e)
    return default
