"""A decision question's prompt (Transformers' DECISION_PROMPT, exactly) and its answer in each
API's shape, with TypeSafe's confidences (see `text.decisions`). Pure: no model."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np

from .decision_types import LETTERS, YES_NO, DecisionQuestion

# --------------------------------------------------------------------------- the prompt


def text(x: Any) -> str:
    """DECISION_PROMPT's `text` macro: nothing for null, a string as it is, anything else as
    JSON the way Transformers' `tojson` writes it (non-ASCII kept, default separators)."""
    if x is None:
        return ""
    if isinstance(x, str):
        return x
    return json.dumps(x, ensure_ascii=False)


def question_text(q: DecisionQuestion) -> str:
    """DECISION_PROMPT after the state: the instructions, the labelled options and the answer line."""
    labels = list(q.labels)
    lines = [text(q.instructions)]
    for option, label, description in zip(q.option_names(), labels, q.descriptions):
        answer = text(description)
        if q.type == "noul":
            answer = answer or (option if labels != list(YES_NO) else "")
            if answer:
                lines.append(f"{label}: {answer}")
        else:
            if q.type == "choice":
                answer = f"{option}: {answer}" if answer else option
            lines.append(f"{label}. {answer}")
    out = "\n".join(x for x in lines if x) + "\n"
    if q.type == "noul":
        return out + f"Answer {labels[0]} or {labels[1]} only."
    answer_word = "letter" if labels == list(LETTERS[: len(labels)]) else "label"
    what = "option" if q.type == "choice" else "level"
    return out + f"Answer with the {answer_word} of the {what} that fits best ({labels[0]} to {labels[-1]}) only."


def render_user_message(state: Any, q: DecisionQuestion) -> str:
    """Exactly DECISION_PROMPT's text for `state` and `q`: the user message Transformers sends."""
    return text(state) + "\n\n" + question_text(q)


# --------------------------------------------------------------------------- answers


def choice_confidence(p: Sequence[float]) -> float:
    """TypeSafe's: (p_max - 1/n) / (1 - 1/n), 1 for one option, never below 0."""
    p = np.asarray(p, dtype=np.float64)
    n = len(p)
    return 1.0 if n == 1 else float(max(0.0, (p.max() - 1 / n) / (1 - 1 / n)))


def score_confidence(p: Sequence[float]) -> float:
    """TypeSafe's: 1 - sum p_i |i - mode| / D, D the same for a uniform distribution; never below 0."""
    p = np.asarray(p, dtype=np.float64)
    n = len(p)
    if n == 1:
        return 1.0
    mode = int(np.argmax(p))
    distance = float(sum(pi * abs(i - mode) for i, pi in enumerate(p)))
    uniform = sum(abs(i - (n - 1) / 2) for i in range(n)) / n
    return max(0.0, 1 - distance / uniform)


def expected_level(p: Sequence[float]) -> float:
    return float(sum(i * float(pi) for i, pi in enumerate(p)))


class DecisionKind:
    """What varies between question types: their names in each API and their answers' shapes."""

    name = ""
    openai_name = ""

    def systemone(self, q: DecisionQuestion, p: np.ndarray) -> dict[str, Any]:
        raise NotImplementedError

    def openai(self, q: DecisionQuestion, p: np.ndarray) -> dict[str, Any]:
        raise NotImplementedError


class Noul(DecisionKind):
    name, openai_name = "noul", "predicate"

    @staticmethod
    def p_true(q: DecisionQuestion, p: np.ndarray) -> float:
        return float(p[list(q.options).index("true")])

    def systemone(self, q: DecisionQuestion, p: np.ndarray) -> dict[str, Any]:
        return {"type": "noul", "noul": self.p_true(q, p)}

    def openai(self, q: DecisionQuestion, p: np.ndarray) -> dict[str, Any]:
        return {"type": "predicate", "name": q.name, "probability": self.p_true(q, p)}


class Choice(DecisionKind):
    name = openai_name = "choice"

    def systemone(self, q: DecisionQuestion, p: np.ndarray) -> dict[str, Any]:
        names = q.option_names()
        return {
            "type": "choice",
            "choice": names[int(np.argmax(p))],
            "confidence": choice_confidence(p),
            "probabilities": {o: float(x) for o, x in zip(names, p)},
        }

    def openai(self, q: DecisionQuestion, p: np.ndarray) -> dict[str, Any]:
        return {
            "type": "choice",
            "name": q.name,
            "choice": q.options[int(np.argmax(p))],
            "confidence": choice_confidence(p),
            "probabilities": [{"value": o, "probability": float(x)} for o, x in zip(q.options, p)],
        }


class Score(DecisionKind):
    name = openai_name = "score"

    def systemone(self, q: DecisionQuestion, p: np.ndarray) -> dict[str, Any]:
        return {
            "type": "score",
            "score": expected_level(p),
            "legend": dict(zip(q.options, q.descriptions)),
            "confidence": score_confidence(p),
            "probabilities": {o: float(x) for o, x in zip(q.options, p)},
        }

    def openai(self, q: DecisionQuestion, p: np.ndarray) -> dict[str, Any]:
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


KINDS: dict[str, DecisionKind] = {k.name: k for k in (Noul(), Choice(), Score())}


def systemone_answer(q: DecisionQuestion, probs: np.ndarray) -> dict[str, Any]:
    """System One's answer to `q` from its options' probabilities (in `q.options` order)."""
    return KINDS[q.type].systemone(q, np.asarray(probs, dtype=np.float64))


def openai_answer(q: DecisionQuestion, probs: np.ndarray) -> dict[str, Any]:
    """OpenAI's answer to `q` (`name` null for an unnamed question)."""
    return KINDS[q.type].openai(q, np.asarray(probs, dtype=np.float64))


def refusal(q: DecisionQuestion) -> dict[str, Any]:
    """OpenAI's per-question refusal (a question that cannot be answered, e.g. its prompt over the context)."""
    return {"type": "refusal", "name": q.name}
