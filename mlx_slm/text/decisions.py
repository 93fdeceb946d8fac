"""Typed decisions (System One's `/v1/systemone`, OpenAI's `/v1/decisions`): what a request
is, how each question is asked, and how its answer is shaped. Pure: no model.

A decision request is a *state* (a text, a JSON object or a list) and several questions
about it, each of a type:

* ``noul`` (OpenAI: ``predicate``): yes or no, answered as P(true);
* ``choice``: one of 2..255 options (System One: names with optional descriptions; OpenAI:
  typed values, a string and a boolean of the same text distinct);
* ``score``: one of 2..10 ordered levels, answered as the expected level.

Every question is asked as Transformers' generic decision prompt (`DECISION_PROMPT` of
`transformers.decision`): the state, then the question's instructions and its labelled
options, as the ONE user message of the model's own chat template (no system message), and
read at the last position on the option labels' logits (A, B, C, ... or Yes/No), divided by
the question type's temperature and softmaxed. The state comes first, so every question of
a request shares the state's tokens (`text.branches` runs them once).

Beyond the 26 letters, a choice's labels are its options' own names, scored whole (the label
trie); Transformers refuses such a question ("this model reads at most 26 options"). A string
that writes as a boolean value also given ("true" and true) is labelled as JSON (`option_labels`).

Errors are `DecisionError`s with a `loc` (FastAPI's path to the field, from "body") and a
`type`, so each route words them in its own shape.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from ..ground.textfiles import InputError, not_utf8, read_text_file
from .decision_answers import (
    KINDS,
    DecisionKind,
    choice_confidence,
    expected_level,
    openai_answer,
    question_text,
    refusal,
    render_user_message,
    score_confidence,
    systemone_answer,
    text,
)
from .decision_types import (
    LETTERS,
    MAX_DEPTH,
    MAX_LEVELS,
    MAX_OPTIONS,
    MAX_QUESTIONS,
    MIN_LEVELS,
    MIN_OPTIONS,
    TYPES,
    YES_NO,
    DecisionConfig,
    DecisionError,
    DecisionErrors,
    DecisionQuestion,
    DecisionRequest,
    details,
    option_text,
)

__all__ = [
    "KINDS",
    "LETTERS",
    "MAX_DEPTH",
    "MAX_LEVELS",
    "MAX_OPTIONS",
    "MAX_QUESTIONS",
    "MIN_LEVELS",
    "MIN_OPTIONS",
    "TYPES",
    "YES_NO",
    "DecisionConfig",
    "DecisionError",
    "DecisionErrors",
    "DecisionKind",
    "DecisionQuestion",
    "DecisionRequest",
    "choice_confidence",
    "details",
    "expected_level",
    "openai_answer",
    "openai_questions",
    "openai_state",
    "option_text",
    "parse_openai",
    "parse_systemone",
    "question_text",
    "load_questions_file",
    "questions_of",
    "read_questions_file",
    "refusal",
    "render_user_message",
    "score_confidence",
    "systemone_answer",
    "systemone_questions",
    "text",
]

# --------------------------------------------------------------------------- reading requests: shared checks

_CONTENT = "a string, an object or an array"


def state_problem(state: Any, loc: tuple = ("body", "state")) -> DecisionError | None:
    """Why `state` cannot be a request's state (not a string, object or array; too deep; not
    valid Unicode), as the routes say it, or None: `decide` checks each input row's state with it."""
    return _content_problem(state, loc, "the state", nullable=False)


def _content_problem(x: Any, loc: tuple, what: str, nullable: bool = True, depth: int = 0) -> DecisionError | None:
    """Why `x` is not a string/object/array (or null where allowed), too deep, or not UTF-8."""
    if x is None:
        return None if nullable else DecisionError(loc, f"{what} is null: give {_CONTENT}", "type_error")
    if not isinstance(x, (str, dict, list)):
        return DecisionError(loc, f"{what} must be {_CONTENT}, got {_json_type(x)}", "type_error")
    return _json_problem(x, loc, what)


def _json_problem(x: Any, loc: tuple, what: str) -> DecisionError | None:
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


def _json_type(x: Any) -> str:
    return {
        bool: "a boolean",
        int: "a number",
        float: "a number",
        str: "a string",
        list: "an array",
        dict: "an object",
        type(None): "null",
    }.get(type(x), type(x).__name__)


def _check_model(body: Mapping[str, Any]) -> str:
    if "model" not in body:
        raise DecisionError(("body", "model"), "field required: name the model (e.g. 'jev-latest')", "missing")
    model = body["model"]
    if not isinstance(model, str) or not model:
        raise DecisionError(
            ("body", "model"), f"the model is a non-empty string, got {_json_type(model)}", "type_error"
        )
    return model


def _count_problem(n: int, lo: int, hi: int, loc: tuple, what: str) -> DecisionError | None:
    if n < lo:
        return DecisionError(loc, f"{n} {what}: give at least {lo}", "too_short")
    if n > hi:
        return DecisionError(loc, f"{n} {what}: at most {hi} are allowed", "too_long")
    return None


def _raise(errors: list[DecisionError]) -> None:
    if len(errors) == 1:
        raise errors[0]
    if errors:
        raise DecisionErrors(errors)


# --------------------------------------------------------------------------- System One

NOUL_EXAMPLE = '{"type": "noul", "instructions": "Is this spam?", "criteria": {"true": "Unsolicited ads"}}'
CHOICE_EXAMPLE = '{"type": "choice", "instructions": "Which team?", "criteria": {"billing": "Payments", "sales": null}}'
SCORE_EXAMPLE = '{"type": "score", "instructions": "How urgent?", "criteria": ["Can wait", "Today", "Now"]}'
EXAMPLES = {"noul": NOUL_EXAMPLE, "choice": CHOICE_EXAMPLE, "score": SCORE_EXAMPLE}


def parse_systemone(body: Any, config: DecisionConfig | None = None) -> DecisionRequest:
    """A System One request body (parsed JSON) checked whole: every problem a `DecisionError`
    (several: `DecisionErrors`) with FastAPI's `loc`. Unknown fields are ignored (`x_nonce`)."""
    config = config or DecisionConfig()
    if not isinstance(body, dict):
        raise DecisionError(("body",), f"the body is a JSON object, got {_json_type(body)}", "type_error")
    errors: list[DecisionError] = []
    model = ""
    try:
        model = _check_model(body)
    except DecisionError as e:
        errors.append(e)
    if "state" not in body:
        errors.append(DecisionError(("body", "state"), f"field required: the state is {_CONTENT}", "missing"))
    else:
        bad = _content_problem(body["state"], ("body", "state"), "the state", nullable=False)
        if bad:
            errors.append(bad)
    questions: tuple[DecisionQuestion, ...] = ()
    try:
        questions = systemone_questions(body.get("questions"), config, "questions" in body)
    except DecisionErrors as e:
        errors.extend(e.errors)
    except DecisionError as e:
        errors.append(e)
    _raise(errors)
    return DecisionRequest(body["state"], questions, model, None, "systemone")


def systemone_questions(qs: Any, config: DecisionConfig, given: bool = True) -> tuple[DecisionQuestion, ...]:
    """System One's `questions` object ({id: question}) as questions in its order."""
    loc = ("body", "questions")
    if not given:
        raise DecisionError(
            loc, 'field required: questions maps ids to questions, e.g. {"urgent": ' + NOUL_EXAMPLE + "}", "missing"
        )
    if not isinstance(qs, dict):
        why = "the old list form" if isinstance(qs, list) else _json_type(qs)
        raise DecisionError(loc, f"questions is an object of id -> question, got {why}", "type_error")
    bad = _count_problem(len(qs), 1, MAX_QUESTIONS, loc, "questions")
    if bad:
        raise bad
    out, errors = [], []
    for key, q in qs.items():
        try:
            out.append(systemone_question(key, q, config))
        except DecisionErrors as e:
            errors.extend(e.errors)
        except DecisionError as e:
            errors.append(e)
    _raise(errors)
    return tuple(out)


def systemone_question(key: str, q: Any, config: DecisionConfig) -> DecisionQuestion:
    loc = ("body", "questions", key)
    if not key or not_utf8(key):
        raise DecisionError(loc, "a question id is a non-empty string of valid Unicode", "value_error")
    if not isinstance(q, dict):
        raise DecisionError(loc, f"a question is an object, e.g. {NOUL_EXAMPLE}; got {_json_type(q)}", "type_error")
    qtype = q.get("type")
    if "type" not in q:
        raise DecisionError((*loc, "type"), f"field required: one of {', '.join(TYPES)}", "missing")
    if qtype not in TYPES:
        raise DecisionError((*loc, "type"), f"the type is one of {', '.join(TYPES)}, got {qtype!r}", "literal_error")
    errors = []
    instructions = q.get("instructions")
    bad = _content_problem(instructions, (*loc, "instructions"), "the instructions")
    if bad:
        errors.append(bad)
    try:
        options, descriptions = _systemone_criteria(qtype, q, (*loc, "criteria"), config)
    except DecisionError as e:
        errors.append(e)
    _raise(errors)
    labels = config.labels_for(qtype, options)
    return DecisionQuestion(key, qtype, instructions, options, descriptions, labels)


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
            bad = _content_problem(v, (*loc, k), f"the description of {k!r}")
            if bad:
                raise bad
        options = tuple(config.noul_options)
        return options, tuple(criteria.get(o) for o in options)
    if criteria is None:
        raise DecisionError(loc, f"field required: a {qtype} question needs its criteria{example}", "missing")
    if qtype == "choice":
        if not isinstance(criteria, dict):
            raise DecisionError(loc, f"a choice's criteria maps each option to its description{example}", "type_error")
        bad = _count_problem(len(criteria), MIN_OPTIONS, MAX_OPTIONS, loc, "options")
        if bad:
            raise bad
        for k, v in criteria.items():
            if not k.strip() or not_utf8(k):
                raise DecisionError(loc, f"option {k!r}: an option's name is non-empty text", "value_error")
            bad = _content_problem(v, (*loc, k), f"the description of {k!r}")
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
    bad = _count_problem(len(criteria), MIN_LEVELS, MAX_LEVELS, loc, "levels")
    if bad:
        raise bad
    for i, v in enumerate(criteria):
        bad = _content_problem(v, (*loc, i), f"level {i}", nullable=False)
        if bad:
            raise bad
    return tuple(str(i) for i in range(len(criteria))), tuple(criteria)


# --------------------------------------------------------------------------- OpenAI


def parse_openai(body: Any, config: DecisionConfig | None = None) -> DecisionRequest:
    """An OpenAI `decisions.create` body checked whole (`DecisionError`s as for System One;
    images are type "images", for a 400 that says so)."""
    config = config or DecisionConfig()
    if not isinstance(body, dict):
        raise DecisionError(("body",), f"the body is a JSON object, got {_json_type(body)}", "type_error")
    errors: list[DecisionError] = []
    model, state, questions = "", None, ()
    try:
        model = _check_model(body)
    except DecisionError as e:
        errors.append(e)
    try:
        state = openai_state(body)
    except DecisionError as e:
        errors.append(e)
    try:
        questions = openai_questions(body.get("questions"), config, "questions" in body)
    except DecisionErrors as e:
        errors.extend(e.errors)
    except DecisionError as e:
        errors.append(e)
    key = body.get("prompt_cache_key")
    if key is not None and not isinstance(key, str):
        errors.append(DecisionError(("body", "prompt_cache_key"), "prompt_cache_key is a string", "type_error"))
    _raise(errors)
    return DecisionRequest(state, questions, model, key, "openai")


_ROLES = ("user", "system", "developer")


def openai_state(body: Mapping[str, Any]) -> Any:
    """The state of an OpenAI request's `input`: a string as it is; one message of one part its
    text (or its JSON data); several parts or messages their texts joined by a blank line (a
    system or developer message's prefixed "System:"/"Developer:")."""
    loc = ("body", "input")
    if "input" not in body:
        raise DecisionError(loc, "field required: the input is a string or a list of messages", "missing")
    x = body["input"]
    if isinstance(x, str):
        bad = _json_problem(x, loc, "the input")
        if bad:
            raise bad
        return x
    if not isinstance(x, list) or not x:
        raise DecisionError(loc, "the input is a string or a non-empty list of messages", "type_error")
    parts: list[tuple[str, Any]] = []
    for i, m in enumerate(x):
        mloc = (*loc, i)
        if not isinstance(m, dict):
            raise DecisionError(mloc, "a message is an object {role, content}", "type_error")
        if m.get("type", "message") != "message":
            raise DecisionError(
                (*mloc, "type"),
                f"input items of type {m.get('type')!r} are not supported here: send messages",
                "value_error",
            )
        role = m.get("role")
        if role not in _ROLES:
            raise DecisionError((*mloc, "role"), f"the role is one of {', '.join(_ROLES)}, got {role!r}", "value_error")
        for content in _message_parts(m.get("content"), (*mloc, "content"), role):
            parts.append((role, content))
    if len(parts) == 1 and parts[0][0] == "user":
        return parts[0][1]
    texts = [text(c) for _, c in parts]
    return "\n\n".join(t if r == "user" else f"{r.capitalize()}: {t}" for (r, _), t in zip(parts, texts))


def _message_parts(content: Any, loc: tuple, role: str) -> list[Any]:
    if isinstance(content, str):
        bad = _json_problem(content, loc, "the content")
        if bad:
            raise bad
        return [content]
    if not isinstance(content, list) or not content:
        raise DecisionError(loc, "a message's content is a string or a non-empty list of parts", "type_error")
    return [_part(p, (*loc, i), role) for i, p in enumerate(content)]


def _part(p: Any, loc: tuple, role: str) -> Any:
    """One content part: input_text's text, input_json's data; an image refused (type "images")."""
    part_type = p.get("type") if isinstance(p, dict) else None
    if part_type == "input_text" and isinstance(p.get("text"), str):
        bad = _json_problem(p["text"], (*loc, "text"), "the text")
        if bad:
            raise bad
        return p["text"]
    if part_type == "input_json" and role == "user":
        data = p.get("data")
        if not isinstance(data, (dict, list)):
            raise DecisionError((*loc, "data"), "input_json's data is an object or an array of objects", "type_error")
        bad = _json_problem(data, (*loc, "data"), "the JSON data")
        if bad:
            raise bad
        # its size as compact JSON in UTF-8 (what a client sends, not our pretty-printing)
        size = len(json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode("utf-8"))
        values = _json_values(data)
        if values > MAX_JSON_VALUES or size > MAX_JSON_BYTES:
            raise DecisionError(
                (*loc, "data"),
                f"input_json's data holds {values:,} values in {size:,} bytes: at most "
                f"{MAX_JSON_VALUES:,} values and {MAX_JSON_BYTES // 1024} KiB (OpenAI's limits)",
                "too_long",
            )
        return data
    if part_type == "input_image":
        raise DecisionError(loc, "images are not supported by this model: send text (input_text, input_json)", "images")
    raise DecisionError(
        loc, "a part is {type: input_text, text} or (in a user message) {type: input_json, data}", "type_error"
    )


MAX_JSON_VALUES, MAX_JSON_BYTES = 10_000, 256 * 1024  # an input_json part's bounds (OpenAI's)


def _json_values(x: Any) -> int:
    """The values in a JSON value (containers and scalars alike)."""
    n, stack = 0, [x]
    while stack:
        v = stack.pop()
        n += 1
        if isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return n


def openai_questions(qs: Any, config: DecisionConfig, given: bool = True) -> tuple[DecisionQuestion, ...]:
    """OpenAI's `questions` list as questions, in order; a question's key is its name or "#<index>"."""
    loc = ("body", "questions")
    if not given:
        raise DecisionError(loc, "field required: questions is a list of 1 to 400 questions", "missing")
    if not isinstance(qs, list):
        raise DecisionError(loc, f"questions is a list, got {_json_type(qs)}", "type_error")
    bad = _count_problem(len(qs), 1, MAX_QUESTIONS, loc, "questions")
    if bad:
        raise bad
    out, errors = [], []
    for i, q in enumerate(qs):
        try:
            out.append(openai_question(i, q, config))
        except DecisionErrors as e:
            errors.extend(e.errors)
        except DecisionError as e:
            errors.append(e)
    _raise(errors)
    first: dict[str, int] = {}
    for i, q in enumerate(out):  # answers are found by key: one key twice would lose an answer
        j = first.setdefault(q.key, i)
        if j != i:
            raise DecisionError(
                (*loc, i, "name"),
                f"the name {q.key!r} is question {j}'s already: names are unique (an unnamed "
                "question is known as '#<its index>')",
                "value_error",
            )
    return tuple(out)


_OPENAI_TYPES = {"predicate": "noul", "choice": "choice", "score": "score"}


def openai_question(i: int, q: Any, config: DecisionConfig) -> DecisionQuestion:
    loc = ("body", "questions", i)
    if not isinstance(q, dict):
        raise DecisionError(loc, "a question is an object {type, instructions, ...}", "type_error")
    qtype = q.get("type")
    if qtype not in _OPENAI_TYPES:
        raise DecisionError(
            (*loc, "type"),
            f"the type is one of {', '.join(_OPENAI_TYPES)}, got {qtype!r}",
            "missing" if "type" not in q else "literal_error",
        )
    name = q.get("name")
    if name is not None and (not isinstance(name, str) or not_utf8(name)):
        raise DecisionError((*loc, "name"), "a question's name is a string", "type_error")
    if "instructions" not in q:
        raise DecisionError((*loc, "instructions"), "field required: what is asked, as a string", "missing")
    instructions = _openai_instructions(q["instructions"], (*loc, "instructions"))
    ours = _OPENAI_TYPES[qtype]
    levels: tuple[str, ...] = ()
    if ours == "noul":
        options: tuple = tuple(config.noul_options)
        descriptions: tuple = (None, None)
    elif ours == "choice":
        options, descriptions = _openai_choices(q.get("choices"), (*loc, "choices"))
    else:
        levels, descriptions = _openai_levels(q.get("levels"), (*loc, "levels"))
        options = tuple(str(k) for k in range(len(levels)))
    labels = config.labels_for(ours, option_labels(options))
    key = name if name else f"#{i}"
    return DecisionQuestion(key, ours, instructions, options, descriptions, labels, name, levels)


def _openai_instructions(x: Any, loc: tuple) -> Any:
    if isinstance(x, str):
        bad = _json_problem(x, loc, "the instructions")
        if bad:
            raise bad
        return x
    if not isinstance(x, list) or not x:
        raise DecisionError(loc, "instructions are a string or a non-empty list of parts", "type_error")
    parts = [_part(p, (*loc, j), "user") for j, p in enumerate(x)]
    return parts[0] if len(parts) == 1 else "\n\n".join(text(p) for p in parts)


def option_labels(options: Sequence[Any]) -> list[str]:
    """The options' texts as labels (beyond the letters): a string that writes as a boolean value
    also given ("true" with true) is labelled as JSON (`"true"`), so the two stay distinct."""
    typed = {option_text(o) for o in options if isinstance(o, bool)}
    return [json.dumps(o, ensure_ascii=False) if isinstance(o, str) and o in typed else option_text(o) for o in options]


def _openai_choices(x: Any, loc: tuple) -> tuple[tuple, tuple]:
    if not isinstance(x, list):
        raise DecisionError(
            loc,
            'field required: choices is a list of {"value": ..., "description"?: ...}',
            "missing" if x is None else "type_error",
        )
    bad = _count_problem(len(x), MIN_OPTIONS, MAX_OPTIONS, loc, "choices")
    if bad:
        raise bad
    values, descriptions, seen = [], [], set()
    for j, c in enumerate(x):
        cloc = (*loc, j)
        if not isinstance(c, dict) or "value" not in c:
            raise DecisionError(
                cloc, 'a choice is an object {"value": string or boolean, "description"?}', "type_error"
            )
        v = c["value"]
        if not isinstance(v, (str, bool)):
            raise DecisionError(
                (*cloc, "value"), f"a choice's value is a string or a boolean, got {_json_type(v)}", "type_error"
            )
        if isinstance(v, str) and (not v.strip() or not_utf8(v)):
            raise DecisionError((*cloc, "value"), "a choice's value is non-empty text", "value_error")
        if (type(v), v) in seen:
            raise DecisionError((*cloc, "value"), f"the value {v!r} is given twice: values are unique", "value_error")
        seen.add((type(v), v))
        d = c.get("description")
        if d is not None and not isinstance(d, str):
            raise DecisionError((*cloc, "description"), "a description is a string", "type_error")
        bad = _json_problem(d, (*cloc, "description"), "the description") if d else None
        if bad:
            raise bad
        values.append(v)
        descriptions.append(d)
    return tuple(values), tuple(descriptions)


def _openai_levels(x: Any, loc: tuple) -> tuple[tuple[str, ...], tuple]:
    """A score's levels: each shown to the model as its label (and ": description" when given)."""
    if not isinstance(x, list):
        raise DecisionError(
            loc,
            'field required: levels is a list of {"label": ..., "description"?: ...}',
            "missing" if x is None else "type_error",
        )
    bad = _count_problem(len(x), MIN_LEVELS, MAX_LEVELS, loc, "levels")
    if bad:
        raise bad
    labels, shown = [], []
    for j, lv in enumerate(x):
        lloc = (*loc, j)
        if not isinstance(lv, dict) or not isinstance(lv.get("label"), str):
            raise DecisionError(lloc, 'a level is an object {"label": string, "description"?: string}', "type_error")
        d = lv.get("description")
        if d is not None and not isinstance(d, str):
            raise DecisionError((*lloc, "description"), "a description is a string", "type_error")
        for what, s in (("label", lv["label"]), ("description", d)):
            bad = _json_problem(s, (*lloc, what), f"the {what}") if s else None
            if bad:
                raise bad
        labels.append(lv["label"])
        shown.append(f"{lv['label']}: {d}" if d else lv["label"])
    return tuple(labels), tuple(shown)


# --------------------------------------------------------------------------- a questions file


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
        return unwrap_questions(obj), questions_of(obj, config)
    except DecisionError as e:
        raise DecisionError(e.loc, f"--questions {path}: {e}", e.type) from None


def unwrap_questions(obj: Any) -> Any:
    """A questions file's questions: a whole request body's `questions`, else the file itself."""
    return obj["questions"] if isinstance(obj, dict) and isinstance(obj.get("questions"), (dict, list)) else obj


def questions_of(obj: Any, config: DecisionConfig) -> tuple[DecisionQuestion, ...]:
    """The questions of a parsed questions file (see `read_questions_file`)."""
    obj = unwrap_questions(obj)
    if isinstance(obj, list):
        return openai_questions(obj, config)
    if isinstance(obj, dict):
        return systemone_questions(obj, config)
    raise DecisionError(
        (),
        "a questions file holds a System One questions object, an OpenAI questions list, or a whole request body",
        "type_error",
    )
