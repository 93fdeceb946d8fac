"""A model's decision settings (`DecisionConfig`): what Transformers reads from a model folder's
`decision.json` and `decision_template.jinja`, read here once, with one serialisation
(`to_record` / `from_record`) that the manifest, Ray's workers and the parity reference share."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...ground import ranges
from ...ground.textfiles import InputError, read_text_file
from .errors import DecisionError
from .questions import LETTERS, YES_NO


def temperature_problem(t: Any) -> str | None:
    """Why `t` is no temperature (a positive finite number; a boolean is none), or None: the one
    check of every temperature (a model's decision.json, a task's fitted ones)."""
    if isinstance(t, bool):
        return f"must be a positive number, got {t!r}"
    return ranges.problem("temperature", t)


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
            why = temperature_problem(t)
            if why is not None:
                raise DecisionError((), f"temperature.{qtype} {why}")

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

    @classmethod
    def of_model(cls, given: str | Path, converted: str | Path | None) -> DecisionConfig:
        """The settings of the model a user named, with one precedence: the folder given, where it
        holds a `decision.json` or a template (a Hugging Face folder keeps them beside its weights),
        else the converted folder's (a converted model keeps them), else Transformers' defaults."""
        own = Path(str(given)).expanduser()
        if own.is_dir() and any((own / f).is_file() for f in ("decision.json", "decision_template.jinja")):
            return cls.from_folder(own)
        return cls.from_folder(converted if converted is not None and Path(converted).is_dir() else None)

    def to_record(self, template: bool = True) -> dict[str, Any]:
        """These settings as JSON, Transformers' `DecisionConfig` field names (what its reference
        path and a Ray worker read back with `from_record`); `template=False` records the
        template's sha256 instead of its text (None: no template), what a manifest and a task compare."""
        own = self.chat_template
        return {
            "labels": {k: list(v) for k, v in self.labels.items()},
            "temperature": dict(self.temperature),
            "noul_options": list(self.noul_options),
            "chat_template": own if template else own and hashlib.sha256(own.encode("utf-8")).hexdigest(),
            "sanitize_control_tokens": self.sanitize_control_tokens,
        }

    @staticmethod
    def asked(record: Mapping[str, Any], types: Sequence[str]) -> dict[str, Any]:
        """What of a `to_record(template=False)` changes the raw answers of questions of `types`:
        their labels and temperatures, a noul's option order, the template and control tokens (a
        field missing read as its default, a field of a later version ignored)."""
        labels, temps = record.get("labels") or {}, record.get("temperature") or {}
        return {
            "labels": {t: labels.get(t) for t in sorted(types)},
            "temperature": {t: float(temps.get(t, 1.0)) for t in sorted(types)},
            "noul_options": (record.get("noul_options") or ["true", "false"]) if "noul" in types else None,
            "chat_template": record.get("chat_template") or None,
            "sanitize_control_tokens": record.get("sanitize_control_tokens", True),
        }

    @classmethod
    def from_record(cls, d: Mapping[str, Any]) -> DecisionConfig:
        """`to_record()`'s JSON back to the settings."""
        return cls.from_dict(d, d.get("chat_template"))

    def temperature_of(self, qtype: str) -> float:
        return float(self.temperature.get(qtype, 1.0))

    def labels_for(self, qtype: str, options: Sequence[str]) -> tuple[str, ...]:
        """The labels the model reads for `options` of a `qtype` question: the config's or
        Transformers' default (Yes/No, A..Z); beyond them, the options' own names (scored whole)."""
        labels = tuple(self.labels.get(qtype) or (YES_NO if qtype == "noul" else LETTERS))
        if len(labels) >= len(options):
            return labels[: len(options)]
        return tuple(options)
