"""The data of typed decisions (see `text.decisions`): errors with FastAPI's `loc`, a model's
`DecisionConfig` (Transformers' `decision.json`), a `DecisionQuestion` and a `DecisionRequest`.
Pure: no model."""

from __future__ import annotations

import json
import math
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..ground.errors import UserError
from ..ground.textfiles import InputError, read_text_file

TYPES = ("noul", "choice", "score")
MAX_QUESTIONS = 400  # OpenAI's bound; System One documents none (transformers serve: 64)
MIN_OPTIONS, MAX_OPTIONS = 2, 255
MIN_LEVELS, MAX_LEVELS = 2, 10
MAX_DEPTH = 32  # nesting of a state or an instruction object (OpenAI's input_json bound)
LETTERS = tuple(string.ascii_uppercase)
YES_NO = ("Yes", "No")


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


# --------------------------------------------------------------------------- the model's settings


@dataclass(frozen=True)
class DecisionConfig:
    """A model's decision settings, as Transformers reads them from `decision.json` (and
    `decision_template.jinja`): labels and temperature per question type, the order of a noul's
    two options, and whether control tokens in user text are encoded as text."""

    labels: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    temperature: Mapping[str, float] = field(default_factory=dict)
    chat_template: str | None = None
    noul_options: tuple[str, str] = ("true", "false")
    sanitize_control_tokens: bool = True

    def __post_init__(self) -> None:
        if sorted(self.noul_options) != ["false", "true"]:
            raise DecisionError((), f"noul_options must order 'true' and 'false', got {list(self.noul_options)!r}")
        for qtype, t in self.temperature.items():
            if not isinstance(t, (int, float)) or isinstance(t, bool) or not (t > 0 and math.isfinite(t)):
                raise DecisionError((), f"temperature.{qtype} must be a positive number, got {t!r}")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], chat_template: str | None = None) -> DecisionConfig:
        """From `decision.json`'s object: fields this version does not know are ignored (as Transformers)."""
        if not isinstance(d, Mapping):
            raise DecisionError((), f"decision.json holds a JSON object, got {type(d).__name__}")
        labels = d.get("labels") or {}
        temperature = d.get("temperature") or {}
        if not isinstance(labels, Mapping) or not all(
            isinstance(v, list) and all(isinstance(x, str) and x for x in v) for v in labels.values()
        ):
            raise DecisionError((), "decision.json 'labels' maps a question type to a list of label strings")
        if not isinstance(temperature, Mapping):
            raise DecisionError((), "decision.json 'temperature' maps a question type to a number")
        return cls(
            labels={k: tuple(v) for k, v in labels.items()},
            temperature={
                k: float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v
                for k, v in temperature.items()
            },
            chat_template=chat_template if chat_template is not None else d.get("chat_template"),
            noul_options=tuple(d.get("noul_options") or ("true", "false")),  # type: ignore[arg-type]
            sanitize_control_tokens=bool(d.get("sanitize_control_tokens", True)),
        )

    @classmethod
    def from_folder(cls, path: str | Path | None) -> DecisionConfig:
        """A model folder's `decision.json` and `decision_template.jinja` (each optional: the
        defaults are Transformers' generic prompt, Yes/No and A, B, C..., temperature 1)."""
        if path is None:
            return cls()
        folder = Path(path)
        template = None
        if (folder / "decision_template.jinja").is_file():
            template = (folder / "decision_template.jinja").read_text(encoding="utf-8")
        if not (folder / "decision.json").is_file():
            return cls(chat_template=template)
        try:
            d = json.loads(read_text_file(str(folder / "decision.json"), "decision.json"))
        except (InputError, ValueError) as e:
            raise DecisionError((), f"{folder / 'decision.json'}: not valid JSON ({e}): fix the file") from None
        return cls.from_dict(d, template)

    def temperature_of(self, qtype: str) -> float:
        return float(self.temperature.get(qtype, 1.0))

    def labels_for(self, qtype: str, options: Sequence[str]) -> tuple[str, ...]:
        """The labels the model reads for `options` of a `qtype` question: the config's or
        Transformers' default (Yes/No, A..Z); beyond them, the options' own names (scored whole)."""
        labels = tuple(self.labels.get(qtype) or (YES_NO if qtype == "noul" else LETTERS))
        if len(labels) >= len(options):
            return labels[: len(options)]
        return tuple(options)


# --------------------------------------------------------------------------- questions and requests


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


@dataclass(frozen=True)
class DecisionRequest:
    """One request: its state and questions, the model it names, OpenAI's prompt_cache_key,
    and which API asked (the answers' shape)."""

    state: Any
    questions: tuple[DecisionQuestion, ...]
    model: str = ""
    cache_key: str | None = None
    api: str = "systemone"


def option_text(option: Any) -> str:
    """An option as the prompt writes it: a name as it is; an OpenAI boolean value as JSON."""
    return option if isinstance(option, str) else json.dumps(option)
