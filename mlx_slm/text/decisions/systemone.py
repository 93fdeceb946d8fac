"""System One's requests (`POST /v1/systemone`, TypeSafe's Jev API) read and checked whole:
`{"model", "state", "questions": {id: {"type": "noul"|"choice"|"score", "instructions",
"criteria"}}}`. Every problem is a `DecisionError` (several: `DecisionErrors`) with FastAPI's
`loc`; unknown fields are ignored (System One's clients add their own, e.g. `x_nonce`), but
a questions file's question fields are checked (`strict`: a typo such as "instrutions" would
drop the instructions unseen). The answers' shape is `answers.systemone_answer`."""

from __future__ import annotations

import difflib
from typing import Any

from .checks import CONTENT, check_model, content_problem, count_problem, json_type, name_problem
from .errors import DecisionError, attempt, raise_all
from .questions import (
    MAX_LEVELS,
    MAX_OPTIONS,
    MAX_QUESTIONS,
    MIN_LEVELS,
    MIN_OPTIONS,
    TYPES,
    DecisionQuestion,
    DecisionRequest,
)
from .settings import DecisionConfig

NOUL_EXAMPLE = '{"type": "noul", "instructions": "Is this spam?", "criteria": {"true": "Unsolicited ads"}}'
CHOICE_EXAMPLE = '{"type": "choice", "instructions": "Which team?", "criteria": {"billing": "Payments", "sales": null}}'
SCORE_EXAMPLE = '{"type": "score", "instructions": "How urgent?", "criteria": ["Can wait", "Today", "Now"]}'
EXAMPLES = {"noul": NOUL_EXAMPLE, "choice": CHOICE_EXAMPLE, "score": SCORE_EXAMPLE}
FIELDS = ("type", "instructions", "criteria")  # a question's own (Transformers' dataclasses refuse others)


def parse_systemone(body: Any, config: DecisionConfig | None = None) -> DecisionRequest:
    """A System One request body (parsed JSON) checked whole: every problem a `DecisionError`
    (several: `DecisionErrors`) with FastAPI's `loc`. Unknown fields are ignored (`x_nonce`)."""
    config = config or DecisionConfig()
    if not isinstance(body, dict):
        raise DecisionError(("body",), f"the body is a JSON object, got {json_type(body)}", "type_error")
    errors: list[DecisionError] = []
    model = attempt(errors, check_model, body, default="")
    if "state" not in body:
        errors.append(DecisionError(("body", "state"), f"field required: the state is {CONTENT}", "missing"))
    else:
        bad = content_problem(body["state"], ("body", "state"), "the state", nullable=False)
        if bad:
            errors.append(bad)
    questions = attempt(errors, systemone_questions, body.get("questions"), config, "questions" in body, default=())
    raise_all(errors)
    return DecisionRequest(body["state"], questions, model, None, "request")


def systemone_questions(
    qs: Any, config: DecisionConfig, given: bool = True, strict: bool = False
) -> tuple[DecisionQuestion, ...]:
    """System One's `questions` object ({id: question}) as questions in its order; `strict`: a
    question's unknown fields refused (a file's: see `_unknown`), else ignored (the wire's)."""
    loc = ("body", "questions")
    if not given:
        raise DecisionError(
            loc, 'field required: questions maps ids to questions, e.g. {"urgent": ' + NOUL_EXAMPLE + "}", "missing"
        )
    if not isinstance(qs, dict):
        why = "the old list form" if isinstance(qs, list) else json_type(qs)
        raise DecisionError(loc, f"questions is an object of id -> question, got {why}", "type_error")
    bad = count_problem(len(qs), 1, MAX_QUESTIONS, loc, "questions")
    if bad:
        raise bad
    errors: list[DecisionError] = []
    out = tuple(attempt(errors, systemone_question, key, q, config, strict) for key, q in qs.items())
    raise_all(errors)
    return out


def systemone_question(key: str, q: Any, config: DecisionConfig, strict: bool = False) -> DecisionQuestion:
    loc = ("body", "questions", key)
    bad = name_problem(key, loc, "a question id")
    if bad:
        raise bad
    if not isinstance(q, dict):
        raise DecisionError(loc, f"a question is an object, e.g. {NOUL_EXAMPLE}; got {json_type(q)}", "type_error")
    qtype = q.get("type")
    if "type" not in q:
        raise DecisionError((*loc, "type"), f"field required: one of {', '.join(TYPES)}", "missing")
    if qtype not in TYPES:
        raise DecisionError((*loc, "type"), f"the type is one of {', '.join(TYPES)}, got {qtype!r}", "literal_error")
    errors = [_unknown(loc, k) for k in q if strict and k not in FIELDS and not str(k).startswith("x_")]
    instructions = q.get("instructions")
    bad = content_problem(instructions, (*loc, "instructions"), "the instructions")
    if bad:
        errors.append(bad)
    try:
        options, descriptions = _systemone_criteria(qtype, q, (*loc, "criteria"), config)
    except DecisionError as e:
        errors.append(e)
    raise_all(errors)
    labels = config.labels_for(qtype, options)
    return DecisionQuestion(key, qtype, instructions, options, descriptions, labels)


def _unknown(loc: tuple, key: Any) -> DecisionError:
    """A question's field that is none of System One's, in a questions file: a typo ("instrutions")
    would be dropped unseen and the question asked without it; refused, as Transformers' server
    refuses it (on the wire TypeSafe's schema ignores it, and so do the routes); `x_` fields are
    a client's own."""
    near = difflib.get_close_matches(str(key), FIELDS, n=1)
    hint = f" (did you mean {near[0]!r}?)" if near else ""
    return DecisionError(
        (*loc, key), f"unknown field {key!r}: a question has {', '.join(FIELDS)}{hint}", "extra_forbidden"
    )


def _systemone_criteria(qtype: str, q: dict, loc: tuple, config: DecisionConfig) -> tuple[tuple, tuple]:
    criteria = q.get("criteria")
    example = f" (a {qtype} question looks like {EXAMPLES[qtype]})"
    if qtype == "noul":
        if criteria is None:
            criteria = {}
        if not isinstance(criteria, dict):
            raise DecisionError(loc, f"a noul's criteria is an object {{true?, false?}}{example}", "type_error")
        unknown = [k for k in criteria if k not in ("true", "false")]
        if unknown:
            raise DecisionError(loc, f"a noul's criteria has 'true' and 'false' only, not {unknown[0]!r}")
        for k, v in criteria.items():
            bad = content_problem(v, (*loc, k), f"the description of {k!r}")
            if bad:
                raise bad
        options = tuple(config.noul_options)
        return options, tuple(criteria.get(o) for o in options)
    if criteria is None:
        raise DecisionError(loc, f"field required: a {qtype} question needs its criteria{example}", "missing")
    if qtype == "choice":
        if not isinstance(criteria, dict):
            raise DecisionError(loc, f"a choice's criteria maps each option to its description{example}", "type_error")
        bad = count_problem(len(criteria), MIN_OPTIONS, MAX_OPTIONS, loc, "options")
        if bad:
            raise bad
        for k, v in criteria.items():
            bad = name_problem(k, (*loc, k), "an option's name")
            if bad:
                raise bad
            bad = content_problem(v, (*loc, k), f"the description of {k!r}")
            if bad:
                raise bad
        return tuple(criteria), tuple(criteria.values())
    if isinstance(criteria, dict):
        raise DecisionError(
            loc,
            f'a score\'s criteria is a list of levels, lowest first, not the old map form {{"0": ...}}{example}',
            "type_error",
        )
    if not isinstance(criteria, list):
        raise DecisionError(loc, f"a score's criteria is a list of level descriptions{example}", "type_error")
    bad = count_problem(len(criteria), MIN_LEVELS, MAX_LEVELS, loc, "levels")
    if bad:
        raise bad
    for i, v in enumerate(criteria):
        bad = content_problem(v, (*loc, i), f"level {i}", nullable=False)
        if bad:
            raise bad
    return tuple(str(i) for i in range(len(criteria))), tuple(criteria)
