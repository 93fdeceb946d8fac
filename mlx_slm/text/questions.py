"""Several questions per text: what a question is, how it is asked, and how its answer is read.

A question has a `name` (its key in the output), its wording (`question`) and a kind:

* ``choice``: one of `labels` (optionally described, optionally with a `none` option whose
  probability comes back as `abstain`, the others renormalised without it);
* ``yesno``: a statement answered by two one-token words (`answers`, default yes/no);
  `probs` = {yes: p, no: 1 - p};
* ``scale``: one of ordered `levels`; `probs` per level and the `expected` level (the levels'
  numbers when they are numbers, else their ranks 1..n);
* ``multi``: several labels at once: `question` holds `{label}` and is asked once per label
  as a yes/no branch; each label's probability is its own, and the answer holds every label
  at or above `threshold`;
* ``head``: a learned head (`mlx-slm train --label-field NAME`) on the hidden states of the
  text's own prompt (no question wording): one of its labels.

Every question is asked as the full prompt it would have alone (system, the user turn with
the text and the question, the assistant header), so an answer equals that question asked
alone, and Transformers scoring that prompt afresh. How the classifier runs the text once
and every question as a branch after it is in `branches.py`.

Pure: no model, no files but `read_questions`.
"""

from __future__ import annotations

import difflib
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..ground.errors import UserError
from ..ground.ranges import RANGES
from ..ground.textfiles import InputError, check_json_text, json_error, read_text_file
from .heads import Head, HeadError
from .labels import LabelError, softmax, validate

# A question's name is an output key and a CSV column prefix (`team`, `team.p_billing`).
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_\-]{0,63}$")
# Keys of an output row that a question's name would shadow in flat (CSV) outputs.
RESERVED_NAMES = frozenset({"id", "line", "error", "truncated", "answers", "label", "probs", "calibration"})
FIELDS = {"name", "question", "kind", "labels", "descriptions", "none", "answers", "levels", "threshold", "head"}
MAX_QUESTIONS = 256  # as the peer allows; each question's branch runs in the one pass over its text

DEFAULT_SYSTEM = "You answer questions about a text. Answer with exactly one of the options given."
DEFAULT_TEMPLATE = "Text: {text}"
QUESTION_PLACEHOLDER = "{question}"


class QuestionError(UserError, ValueError):
    pass


# --------------------------------------------------------------------------- question types
class QuestionType:
    """What varies between question types (choice, yesno, scale, multi, head): one object each,
    with one interface, which the question, the record shape, the calibration per question and
    the branch layout ask instead of comparing names. Its `name` is a question file's "kind"."""

    name: str = ""
    options_key = "labels"  # its options' field in a question file
    fills: tuple[str, ...] = ()  # the placeholders its wording may hold (filled before the model reads it)
    many = False  # its answer is several labels (each a yes/no branch), not one
    expects = False  # its answer carries the expected level
    calibrates = True  # its probabilities take batch calibration (a learned head's are fitted already)
    abstains = True  # --min-confidence may abstain on its answer
    yes_no = False  # its branches choose between two answer words

    def blocks(self, q: Question) -> list[tuple[str | None, tuple[str, ...]]]:
        opts = q.options
        if "{labels}" in q.question:
            return [(q.question.replace("{labels}", ", ".join(opts)), opts)]
        if q.descriptions:
            lines = "\n".join(f"- {o}: {q.descriptions[o]}" if o in q.descriptions else f"- {o}" for o in opts)
            return [(f"{q.question}\nAnswer with exactly one of:\n{lines}", opts)]
        return [(f"{q.question}\nAnswer with exactly one of: {', '.join(opts)}.", opts)]

    def answer(self, q: Question, scores: Sequence[np.ndarray]) -> dict[str, Any]:
        (s,) = scores
        p = softmax(s)
        return {"label": q.labels[int(np.argmax(p))], "probs": dict(zip(q.labels, map(float, p)))}

    def check(self, q: Question) -> None:
        """Its own checks of a question (beyond the wording's, which every type but head has)."""


class Choice(QuestionType):
    name, fills = "choice", ("{labels}",)

    def answer(self, q: Question, scores: Sequence[np.ndarray]) -> dict[str, Any]:
        if not q.none:
            return super().answer(q, scores)
        (s,) = scores
        p = softmax(s)  # the none option's mass is the abstain; it wins only as the likeliest option
        rest = p[:-1] / p[:-1].sum()
        won = int(np.argmax(p)) < len(q.labels)
        return {
            "label": q.labels[int(np.argmax(rest))] if won else None,
            "probs": dict(zip(q.labels, map(float, rest))),
            "abstain": float(p[-1]),
        }


class YesNo(QuestionType):
    name, options_key, yes_no = "yesno", "answers", True

    def blocks(self, q: Question) -> list[tuple[str | None, tuple[str, ...]]]:
        return [(f"{q.question}\nAnswer {q.labels[0]} or {q.labels[1]}.", q.labels)]


class Scale(QuestionType):
    name, options_key, fills, expects = "scale", "levels", ("{labels}",), True

    def answer(self, q: Question, scores: Sequence[np.ndarray]) -> dict[str, Any]:
        out = super().answer(q, scores)
        out["expected"] = float(np.dot(softmax(scores[0]), q.level_values))
        return out

    def check(self, q: Question) -> None:
        if len(q.labels) < 2:
            raise QuestionError(f"scale question {q.name!r} has {len(q.labels)} level(s): give at least two")


class Multi(QuestionType):
    name, fills, many, abstains, yes_no = "multi", ("{label}",), True, False, True

    def blocks(self, q: Question) -> list[tuple[str | None, tuple[str, ...]]]:
        yes, no = q.answers
        return [(f"{q.question.replace('{label}', lab)}\nAnswer {yes} or {no}.", q.answers) for lab in q.labels]

    def answer(self, q: Question, scores: Sequence[np.ndarray]) -> dict[str, Any]:
        p_yes = [float(softmax(s)[0]) for s in scores]
        return {
            "labels": [lab for lab, p in zip(q.labels, p_yes) if p >= q.threshold],
            "probs": dict(zip(q.labels, p_yes)),
        }

    def check(self, q: Question) -> None:
        if "{label}" not in q.question:
            raise QuestionError(
                f"multi question {q.name!r} must hold {{label}}: it is asked once per label, "
                "e.g. 'Does this ticket mention {label}?'"
            )


class HeadQuestion(QuestionType):
    """A learned head on the text's own prompt: no wording, its head's labels."""

    name, calibrates = "head", False

    def blocks(self, q: Question) -> list[tuple[str | None, tuple[str, ...]]]:
        return [(None, q.labels)]


TYPES: dict[str, QuestionType] = {t.name: t for t in (Choice(), YesNo(), Scale(), Multi(), HeadQuestion())}
KINDS = tuple(TYPES)  # the names a question file's "kind" takes


@dataclass(frozen=True)
class Question:
    """One question asked of every text (see the module docstring for the kinds)."""

    name: str
    question: str
    type: QuestionType | str = "choice"  # a `QuestionType` (or its name, as a question file's "kind" says it)
    labels: tuple[str, ...] = ()  # choice and multi; a scale's levels; yesno's two answer words
    descriptions: Mapping[str, str] = field(default_factory=dict)
    none: str | None = None  # choice: the extra "none of these" option
    threshold: float = 0.5  # multi: a label is on at or above this probability
    answers: tuple[str, str] = ("yes", "no")  # yesno and multi: the two one-token answer words
    head: Any = field(default=None, compare=False)  # a head question's `heads.Head`

    # ------------------------------------------------------------------ building
    @classmethod
    def from_dict(cls, d: Any, where: str = "question") -> Question:
        """A question from its JSON object; a `QuestionError` names `where`, the field and the fix."""
        if not isinstance(d, dict):
            raise QuestionError(
                f'{where}: a question is a JSON object, e.g. {{"name": "team", "question": "Which team?", '
                f'"labels": ["billing", "technical"]}}; got {type(d).__name__}'
            )
        unknown = sorted(set(d) - FIELDS)
        if unknown:
            close = difflib.get_close_matches(unknown[0], sorted(FIELDS), n=1)
            raise QuestionError(
                f"{where}: unknown field {unknown[0]!r}"
                + (f" (did you mean {close[0]!r}?)" if close else f"; the fields are {', '.join(sorted(FIELDS))}")
            )
        kind = d.get("kind", "choice")
        if kind not in KINDS:
            raise QuestionError(f"{where}: kind {kind!r} is not one of {', '.join(KINDS)}")
        if kind == "head" or "head" in d:
            return cls._head_from_dict(d, where)
        for key in ("name", "question"):
            if not isinstance(d.get(key), str) or not d[key].strip():
                raise QuestionError(f"{where}: field {key!r} must be a non-empty string, got {d.get(key)!r}")
        name = d["name"]
        answers = d.get("answers", ["yes", "no"])
        if kind not in ("yesno", "multi") and "answers" in d:
            raise QuestionError(f"{where} ({name!r}): only yesno and multi questions take 'answers'")
        if not isinstance(answers, list) or len(answers) != 2 or not all(isinstance(x, str) for x in answers):
            raise QuestionError(f"{where} ({name!r}): 'answers' are two strings (yes, then no), got {answers!r}")
        labels: Any = {"yesno": answers, "scale": d.get("levels")}.get(kind, d.get("labels"))
        key = {"yesno": "answers", "scale": "levels"}.get(kind, "labels")
        for other in ("labels", "levels"):
            if other != key and other in d:
                raise QuestionError(f"{where} ({name!r}): a {kind} question takes {key!r}, not {other!r}")
        if not isinstance(labels, list) or not all(
            isinstance(x, (str, int)) and not isinstance(x, bool) for x in labels
        ):
            raise QuestionError(f"{where} ({name!r}): field {key!r} must be a list of strings, got {labels!r}")
        descriptions = d.get("descriptions", {})
        if not isinstance(descriptions, dict) or not all(isinstance(v, str) for v in descriptions.values()):
            raise QuestionError(f"{where} ({name!r}): 'descriptions' must map labels to strings")
        none = d.get("none")
        if none is not None and (kind != "choice" or not isinstance(none, str) or not none.strip()):
            raise QuestionError(f"{where} ({name!r}): 'none' is a string, and only a choice question takes it")
        threshold = d.get("threshold", 0.5)
        if "threshold" in d and kind != "multi":
            raise QuestionError(f"{where} ({name!r}): only a multi question takes a 'threshold'")
        bad = RANGES["question_threshold"].problem(threshold)
        if bad:
            raise QuestionError(f"{where} ({name!r}): 'threshold' {bad}")
        try:
            return cls(
                name,
                d["question"],
                kind,
                tuple(str(x) for x in labels),
                descriptions,
                none,
                float(threshold),
                (answers[0], answers[1]),
            )
        except QuestionError as e:
            raise QuestionError(f"{where}: {e}") from None

    @classmethod
    def _head_from_dict(cls, d: dict[str, Any], where: str) -> Question:

        if d.get("kind") != "head" or not isinstance(d.get("head"), dict):
            raise QuestionError(f"{where}: a learned head is a question of kind 'head' with a 'head' object")
        extra = sorted(set(d) - {"name", "kind", "head", "question"})
        if extra:
            raise QuestionError(f"{where}: a head question takes name, kind and head, not {extra[0]!r}")
        if not isinstance(d.get("name"), str):
            raise QuestionError(f"{where}: field 'name' must be a string, got {d.get('name')!r}")

        try:
            head = Head.from_dict(d["head"], f"{where} head")
        except HeadError as e:
            raise QuestionError(str(e)) from None
        return cls(d["name"], d.get("question") or "", "head", tuple(head.labels), head=head)

    def __post_init__(self) -> None:
        check_name(self.name)
        if isinstance(self.type, str):
            if self.type not in TYPES:
                raise QuestionError(f"question {self.name!r}: kind {self.type!r} is not one of {', '.join(KINDS)}")
            object.__setattr__(self, "type", TYPES[self.type])
        t = self.type
        if isinstance(t, HeadQuestion):
            if self.head is None or tuple(self.labels) != tuple(self.head.labels):
                raise QuestionError(f"head question {self.name!r} needs its head (and the head's labels)")
            return
        if not isinstance(self.question, str) or not self.question.strip():
            raise QuestionError(f"question {self.name!r} is empty: write what is asked")
        t.check(self)
        if isinstance(t, YesNo) and tuple(self.labels) != tuple(self.answers):
            object.__setattr__(self, "answers", tuple(self.labels))  # a yesno's options are its answer words
        if len(self.answers) != 2 or self.answers[0] == self.answers[1]:
            raise QuestionError(f"question {self.name!r}: 'answers' are two different words (yes, then no)")
        _check_placeholders(self.name, t, self.question)
        try:
            validate(list(self.options))
        except LabelError as e:
            raise QuestionError(f"question {self.name!r} ({t.options_key}): {e}") from None
        unknown = [k for k in self.descriptions if k not in self.labels]
        if unknown:
            raise QuestionError(
                f"question {self.name!r}: descriptions for {unknown[:3]!r}, not among its {t.options_key}"
            )

    # ------------------------------------------------------------------ asking
    @property
    def options(self) -> tuple[str, ...]:
        """What the model chooses between after this question's prompt (a choice's `none` last)."""
        return self.labels + ((self.none,) if self.none else ())

    def blocks(self) -> list[tuple[str | None, tuple[str, ...]]]:
        """(question text as the model reads it, the answers it chooses between), one per
        branch: one for most types, one per label for ``multi`` (each a yes/no question); a
        head reads the text's own prompt (None: no question in it)."""
        return self.type.blocks(self)  # type: ignore[union-attr]

    # ------------------------------------------------------------------ reading the answer
    def answer(self, scores: Sequence[np.ndarray]) -> dict[str, Any]:
        """The answer from each branch's option scores (log-probabilities up to a constant)."""
        return self.type.answer(self, scores)  # type: ignore[union-attr]

    @property
    def level_values(self) -> np.ndarray:
        """A scale's levels as numbers: themselves when every level is a number, else 1..n."""
        try:
            vals = [float(x) for x in self.labels]
            if all(math.isfinite(v) for v in vals):
                return np.array(vals)
        except ValueError:
            pass
        return np.arange(1, len(self.labels) + 1, dtype=np.float64)

    def record(self) -> dict[str, Any]:
        """What a run's manifest records: the question, a head by its sha256 and parts (not its weights)."""
        if isinstance(self.type, HeadQuestion):
            h = self.head
            return {
                "name": self.name,
                "kind": "head",
                "labels": list(self.labels),
                "sha256": h.sha256,
                "layers": list(h.layers),
                "poolings": list(h.poolings),
            }
        return self.to_dict()

    def to_dict(self) -> dict[str, Any]:
        t = self.type
        if isinstance(t, HeadQuestion):
            return {"name": self.name, "kind": "head", "head": self.head.to_dict()}
        d: dict[str, Any] = {"name": self.name, "question": self.question, "kind": t.name}  # type: ignore[union-attr]
        d[t.options_key] = list(self.labels)  # type: ignore[union-attr]
        if self.descriptions:
            d["descriptions"] = dict(self.descriptions)
        if self.none:
            d["none"] = self.none
        if t.many and self.threshold != 0.5:  # type: ignore[union-attr]
            d["threshold"] = self.threshold
        if t.many and self.answers != ("yes", "no"):  # type: ignore[union-attr]
            d["answers"] = list(self.answers)
        return d


# Any of these a question's type does not fill (`QuestionType.fills`) would reach the model as literal braces.
_PLACEHOLDERS = ("{label}", "{labels}", "{label_descriptions}", "{question}")


def _check_placeholders(name: str, qtype: QuestionType, question: str) -> None:
    """A placeholder its type does not fill is refused (it was sent to the model as written, where
    --system refuses it): {label} only in a multi question, {labels} in a choice or scale one."""
    kind = qtype.name
    for ph in _PLACEHOLDERS:
        if ph in question and ph not in qtype.fills:
            where = {
                "{label}": "only a multi question fills {label} (it is asked once per label)",
                "{labels}": "only a choice or scale question fills {labels} (the options, comma-separated)",
            }.get(ph, f"no question fills {ph}")
            raise QuestionError(
                f"{kind} question {name!r} holds {ph}, which it would send to the model as written: {where}; "
                f"remove it" + (", or make the question kind multi" if ph == "{label}" else "")
            )


def check_name(name: Any) -> None:
    """A question's name is an output key and a column prefix: a word, and no output field's."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise QuestionError(
            f"question name {name!r}: use letters, digits, '_' or '-' (it names an output field), starting with a letter"
        )
    if name in RESERVED_NAMES:
        raise QuestionError(f"question name {name!r} clashes with an output field: rename the question")


def check_questions(questions: Sequence[Question]) -> tuple[Question, ...]:
    """The questions as a tuple, checked as a set: at least one, at most `MAX_QUESTIONS`, names unique."""
    if isinstance(questions, (str, bytes, Mapping)) or not isinstance(questions, Sequence):
        raise QuestionError(f"questions must be a list of Question, got {type(questions).__name__}")
    qs = tuple(
        q if isinstance(q, Question) else Question.from_dict(q, f"question {i + 1}") for i, q in enumerate(questions)
    )
    if not qs:
        raise QuestionError("no questions given: give at least one")
    if len(qs) > MAX_QUESTIONS:
        raise QuestionError(f"{len(qs)} questions: at most {MAX_QUESTIONS} are asked of a text in one pass; split them")
    seen: dict[str, int] = {}
    for i, q in enumerate(qs, 1):
        if q.name in seen:
            raise QuestionError(f"question name {q.name!r} is given twice (questions {seen[q.name]} and {i})")
        seen[q.name] = i
    return qs


def read_questions(path: str) -> tuple[Question, ...]:
    """Questions from a file: JSONL (one question a line) or one JSON list; every problem a
    `QuestionError` naming the file and the line (or list entry)."""

    try:
        text = read_text_file(path, "--questions")
    except InputError as e:
        raise QuestionError(str(e)) from None
    stripped = text.lstrip()
    objs: list[tuple[str, Any]] = []
    lines: list[int] = []  # each object's line (JSONL)
    if stripped.startswith("["):
        try:
            items = json.loads(text)
        except (ValueError, RecursionError) as e:
            raise QuestionError(
                f"--questions {path}: not valid JSON ({json_error(e, line=True)}): fix the file"
            ) from None
        objs = [(f"--questions {path} entry {i}", x) for i, x in enumerate(items, 1)]
    else:
        for n, line in enumerate(text.split("\n"), 1):
            if not line.strip():
                continue
            try:
                objs.append((f"--questions {path} line {n}", json.loads(line)))
                lines.append(n)
            except (ValueError, RecursionError) as e:
                raise QuestionError(
                    f"--questions {path} line {n}: malformed JSON ({json_error(e)}): fix the line"
                ) from None
    if not objs:
        raise QuestionError(f"--questions {path} holds no questions: one JSON object a line, or a JSON list")
    try:  # a lone surrogate escape in a question's wording or labels: the file's line, not a bug later
        for n, (_, o) in enumerate(objs):
            check_json_text(o, f"--questions {path}", text, lines[n] if lines else None)
    except InputError as e:
        raise QuestionError(str(e)) from None
    qs = [Question.from_dict(o, where) for where, o in objs]
    try:
        return check_questions(qs)
    except QuestionError as e:
        raise QuestionError(f"--questions {path}: {e}") from None


def user_turn(template: str, text: str, block: str) -> str:
    """The user message: the template with the text, and the question where `{question}` is
    (or on its own line after the template). str.replace: texts may hold braces."""
    if QUESTION_PLACEHOLDER in template:
        return template.replace("{text}", text).replace(QUESTION_PLACEHOLDER, block)
    return template.replace("{text}", text) + "\n" + block


def check_template(template: str) -> None:
    """A question comes after its text, so every question shares the text's tokens (run once)."""
    if not isinstance(template, str) or "{text}" not in template:
        raise QuestionError(f"the template {template!r} has no {{text}} placeholder: write where the text goes")
    q = template.find(QUESTION_PLACEHOLDER)
    if q != -1 and q < template.find("{text}"):
        raise QuestionError(
            "the template puts {question} before {text}: the text runs once and each question after it, "
            "so {question} must come after {text} (e.g. 'Ticket: {text}\\n\\n{question}')"
        )
