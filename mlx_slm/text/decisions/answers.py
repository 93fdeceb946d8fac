"""A question's answer in each API's shape, from its options' probabilities (in `q.options`
order), with TypeSafe's confidences (`confidence`). What varies between question types (their
names in each API, their answers' shapes) is one object per type (`SHAPES`).

System One keys a choice's probabilities by the options' names as text; an OpenAI question may
hold a string and a boolean of the same text (`"true"` and `true`), so those keys are
`DecisionQuestion.answer_names` (the string written as JSON, `"\\"true\\""`): no option is ever
lost to another of the same text. OpenAI's shape keeps the typed values themselves."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from .confidence import choice_confidence, expected_level, score_confidence
from .questions import DecisionQuestion, text


class AnswerShape:
    """What varies between question types: their names in each API and their answers' shapes
    (`applied`: the answer's record, `Method.record`'s, where a choice's none rule is said)."""

    name = ""
    openai_name = ""

    def systemone(self, q: DecisionQuestion, p: np.ndarray, applied: Mapping[str, Any] | None = None) -> dict[str, Any]:
        raise NotImplementedError

    def openai(self, q: DecisionQuestion, p: np.ndarray, applied: Mapping[str, Any] | None = None) -> dict[str, Any]:
        raise NotImplementedError


class NoulAnswer(AnswerShape):
    name, openai_name = "noul", "predicate"

    @staticmethod
    def p_true(q: DecisionQuestion, p: np.ndarray) -> float:
        return float(p[list(q.options).index("true")])

    def systemone(self, q: DecisionQuestion, p: np.ndarray, applied: Mapping[str, Any] | None = None) -> dict[str, Any]:
        return {"type": "noul", "noul": self.p_true(q, p)}

    def openai(self, q: DecisionQuestion, p: np.ndarray, applied: Mapping[str, Any] | None = None) -> dict[str, Any]:
        return {"type": "predicate", "name": q.name, "probability": self.p_true(q, p)}


def chosen_index(q: DecisionQuestion, p: np.ndarray, applied: Mapping[str, Any] | None = None) -> int:
    """The option an answer chooses: the likeliest in `p`, or its question's none option where its
    record (`applied`: `Method.record`'s) says "none of these" answered it. The one home of that
    rule for every reader: the answers' shapes, eval's scoring."""
    none = (applied or {}).get("none_of_these") or {}
    if none.get("answered_none"):
        return list(q.answer_names()).index(none["option"])
    return int(np.argmax(p))


class ChoiceAnswer(AnswerShape):
    name = openai_name = "choice"

    def systemone(self, q: DecisionQuestion, p: np.ndarray, applied: Mapping[str, Any] | None = None) -> dict[str, Any]:
        names = q.answer_names()
        return {
            "type": "choice",
            "choice": names[chosen_index(q, p, applied)],
            "confidence": choice_confidence(p),
            "probabilities": {o: float(x) for o, x in zip(names, p)},
        }

    def openai(self, q: DecisionQuestion, p: np.ndarray, applied: Mapping[str, Any] | None = None) -> dict[str, Any]:
        return {
            "type": "choice",
            "name": q.name,
            "choice": q.options[chosen_index(q, p, applied)],
            "confidence": choice_confidence(p),
            "probabilities": [{"value": o, "probability": float(x)} for o, x in zip(q.options, p)],
        }


class ScoreAnswer(AnswerShape):
    name = openai_name = "score"

    def systemone(self, q: DecisionQuestion, p: np.ndarray, applied: Mapping[str, Any] | None = None) -> dict[str, Any]:
        return {
            "type": "score",
            "score": expected_level(p),
            "legend": dict(zip(q.options, q.descriptions)),
            "confidence": score_confidence(p),
            "probabilities": {o: float(x) for o, x in zip(q.options, p)},
        }

    def openai(self, q: DecisionQuestion, p: np.ndarray, applied: Mapping[str, Any] | None = None) -> dict[str, Any]:
        labels = q.levels or tuple(text(d) for d in q.descriptions)
        return {
            "type": "score",
            "name": q.name,
            "score": expected_level(p),
            "confidence": score_confidence(p),
            "probabilities": [
                {"value": i, "label": lab, "probability": float(x)} for i, (lab, x) in enumerate(zip(labels, p))
            ],
        }


SHAPES: dict[str, AnswerShape] = {k.name: k for k in (NoulAnswer(), ChoiceAnswer(), ScoreAnswer())}


def systemone_answer(
    q: DecisionQuestion, probs: np.ndarray, applied: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """System One's answer to `q` from its options' probabilities (in `q.options` order)."""
    return SHAPES[q.type].systemone(q, np.asarray(probs, dtype=np.float64), applied)


def openai_answer(q: DecisionQuestion, probs: np.ndarray, applied: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """OpenAI's answer to `q` (`name` null for an unnamed question)."""
    return SHAPES[q.type].openai(q, np.asarray(probs, dtype=np.float64), applied)


def refusal(q: DecisionQuestion) -> dict[str, Any]:
    """OpenAI's per-question refusal (a question that cannot be answered, e.g. its prompt over the context)."""
    return {"type": "refusal", "name": q.name}


RAW_FIELDS = {"noul": "noul", "predicate": "probability", "choice": "probabilities", "score": "probabilities"}


def answer(
    q: DecisionQuestion,
    probs: np.ndarray | None,
    shape: str,
    raw: np.ndarray | None = None,
    applied: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """`q`'s answer in `shape` ("systemone" or "openai"; None probabilities: OpenAI's refusal),
    and, when anything beyond the raw letters made it (`applied`, a `Method.record` that is not
    the raw one), what did (`x_method`) and the raw answer's probabilities in the same form
    (`x_raw_<field>`: `x_raw_probabilities`, System One's `x_raw_noul`, OpenAI's
    `x_raw_probability`): extra fields carry the `x_` prefix, as System One asks."""
    if probs is None:
        return refusal(q)
    shaped = openai_answer if shape == "openai" else systemone_answer
    out = shaped(q, probs, applied)
    if not applied or dict(applied) == RAW_METHOD:
        return out
    out["x_method"] = dict(applied)
    # the raw answer differs only where a prior or a fit was divided out (`Method.answer`): said by
    # the record, not by the arrays' identity, which a JSON round trip (Ray's workers) loses
    if raw is not None and applied.get("calibration", "none") != "none":
        fld = RAW_FIELDS[out["type"]]
        out[f"x_raw_{fld}"] = shaped(q, raw)[fld]
    return out


RAW_METHOD = {"style": "letters", "permute": 1, "calibration": "none"}  # `Method().record()`: nothing applied
