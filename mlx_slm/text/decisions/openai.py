"""OpenAI's decision requests (`POST /v1/decisions`, `client.decisions.create` of the `openai`
SDK) read and checked whole: `{"model", "input": str | [messages], "questions": [{"type":
"predicate"|"choice"|"score", "name"?, "instructions", "choices"? | "levels"?}],
"prompt_cache_key"?, "prompt_cache_options"?, "safety_identifier"?}`. Every problem is a
`DecisionError` with FastAPI's `loc` (an image: type "images"); an unknown parameter is refused
as OpenAI refuses it. A question's key is its name, or "#<index>" when it has none. The
answers' shape is `answers.openai_answer` (and `answers.refusal`)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ...ground.textfiles import not_utf8
from .checks import check_model, count_problem, json_problem, json_type, name_problem
from .errors import DecisionError, attempt, raise_all
from .questions import (
    MAX_LEVELS,
    MAX_OPTIONS,
    MAX_QUESTIONS,
    MIN_LEVELS,
    MIN_OPTIONS,
    DecisionQuestion,
    DecisionRequest,
    option_labels,
    text,
)
from .settings import DecisionConfig


def parse_openai(body: Any, config: DecisionConfig | None = None) -> DecisionRequest:
    """An OpenAI `decisions.create` body checked whole (`DecisionError`s as for System One;
    images are type "images", for a 400 that says so)."""
    config = config or DecisionConfig()
    if not isinstance(body, dict):
        raise DecisionError(("body",), f"the body is a JSON object, got {json_type(body)}", "type_error")
    errors: list[DecisionError] = []
    model = attempt(errors, check_model, body, "gpt-6-luna", default="")
    state = attempt(errors, openai_state, body)
    questions = attempt(errors, openai_questions, body.get("questions"), config, "questions" in body, default=())
    errors += _other_fields(body)
    raise_all(errors)
    return DecisionRequest(state, questions, model, body.get("prompt_cache_key"), "question")


# The parameters of `client.decisions.create` (openai 3.60's DecisionCreateParams): OpenAI
# refuses any other, so a misspelt one (prompt_cache_kye) is a 400 here too, never ignored.
PARAMETERS = ("model", "input", "questions", "prompt_cache_key", "prompt_cache_options", "safety_identifier")
CACHE_MODES = ("implicit", "explicit")


def _other_fields(body: dict) -> list[DecisionError]:
    """The optional parameters checked, and any unknown one refused (naming the known ones)."""
    errors = [
        DecisionError(
            ("body", k), f"unknown parameter {k!r}: the parameters are {', '.join(PARAMETERS)}", "extra_forbidden"
        )
        for k in body
        if k not in PARAMETERS
    ]
    for k in ("prompt_cache_key", "safety_identifier"):
        v = body.get(k)
        if v is not None and (not isinstance(v, str) or not_utf8(v)):
            errors.append(DecisionError(("body", k), f"{k} is a string of valid Unicode", "type_error"))
    opts = body.get("prompt_cache_options")
    if opts is None:
        return errors
    loc = ("body", "prompt_cache_options")
    if not isinstance(opts, dict):
        return [*errors, DecisionError(loc, 'prompt_cache_options is an object {"mode", "ttl"}', "type_error")]
    for k in opts:
        if k not in ("mode", "ttl"):
            errors.append(
                DecisionError((*loc, k), f"unknown field {k!r}: the fields are mode and ttl", "extra_forbidden")
            )
    if opts.get("mode") is not None and opts["mode"] not in CACHE_MODES:
        errors.append(
            DecisionError(
                (*loc, "mode"), f"mode is one of {', '.join(CACHE_MODES)}, got {opts['mode']!r}", "literal_error"
            )
        )
    if "ttl" in opts and opts["ttl"] != "30m":
        errors.append(
            DecisionError(
                (*loc, "ttl"), f'ttl is "30m" (the one value OpenAI supports), got {opts["ttl"]!r}', "literal_error"
            )
        )
    return errors


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
        bad = json_problem(x, loc, "the input")
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
        bad = json_problem(content, loc, "the content")
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
        bad = json_problem(p["text"], (*loc, "text"), "the text")
        if bad:
            raise bad
        return p["text"]
    if part_type == "input_json" and role == "user":
        data = p.get("data")
        if not isinstance(data, (dict, list)):
            raise DecisionError((*loc, "data"), "input_json's data is an object or an array of objects", "type_error")
        bad = json_problem(data, (*loc, "data"), "the JSON data")
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
        raise DecisionError(loc, f"questions is a list, got {json_type(qs)}", "type_error")
    bad = count_problem(len(qs), 1, MAX_QUESTIONS, loc, "questions")
    if bad:
        raise bad
    errors: list[DecisionError] = []
    out = [attempt(errors, openai_question, i, q, config) for i, q in enumerate(qs)]
    raise_all(errors)
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
_COMMON = ("type", "name", "instructions")
QUESTION_FIELDS = {"predicate": _COMMON, "choice": (*_COMMON, "choices"), "score": (*_COMMON, "levels")}


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
    unknown = [k for k in q if k not in QUESTION_FIELDS[qtype]]
    if unknown:
        raise DecisionError(
            (*loc, unknown[0]),
            f"unknown field {unknown[0]!r} in a {qtype} question: its fields are {', '.join(QUESTION_FIELDS[qtype])}",
            "extra_forbidden",
        )
    name = q.get("name")
    bad = None if name is None else name_problem(name, (*loc, "name"), "a question's name")
    if bad:
        raise bad
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
        bad = json_problem(x, loc, "the instructions")
        if bad:
            raise bad
        return x
    if not isinstance(x, list) or not x:
        raise DecisionError(loc, "instructions are a string or a non-empty list of parts", "type_error")
    parts = [_part(p, (*loc, j), "user") for j, p in enumerate(x)]
    return parts[0] if len(parts) == 1 else "\n\n".join(text(p) for p in parts)


def _listed(x: Any, loc: tuple, field: str, shape: str, lo: int, hi: int) -> list:
    """`x`, a list of `lo` to `hi` items (`field`'s, each of `shape`), or the error that says so."""
    if not isinstance(x, list):
        raise DecisionError(
            loc, f"field required: {field} is a list of {shape}", "missing" if x is None else "type_error"
        )
    bad = count_problem(len(x), lo, hi, loc, field)
    if bad:
        raise bad
    return x


def _openai_choices(x: Any, loc: tuple) -> tuple[tuple, tuple]:
    _listed(x, loc, "choices", '{"value": ..., "description"?: ...}', MIN_OPTIONS, MAX_OPTIONS)
    values, descriptions, seen = [], [], set()
    for j, c in enumerate(x):
        cloc = (*loc, j)
        if not isinstance(c, dict) or "value" not in c:
            raise DecisionError(
                cloc, 'a choice is an object {"value": string or boolean, "description"?}', "type_error"
            )
        extra = [k for k in c if k not in ("value", "description")]
        if extra:
            raise DecisionError(
                (*cloc, extra[0]), f"unknown field {extra[0]!r}: a choice has value and description", "extra_forbidden"
            )
        v = c["value"]
        if not isinstance(v, (str, bool)):
            raise DecisionError(
                (*cloc, "value"), f"a choice's value is a string or a boolean, got {json_type(v)}", "type_error"
            )
        bad = name_problem(v, (*cloc, "value"), "a choice's value") if isinstance(v, str) else None
        if bad:
            raise bad
        if (type(v), v) in seen:
            raise DecisionError((*cloc, "value"), f"the value {v!r} is given twice: values are unique", "value_error")
        seen.add((type(v), v))
        d = c.get("description")
        if d is not None and not isinstance(d, str):
            raise DecisionError((*cloc, "description"), "a description is a string", "type_error")
        bad = json_problem(d, (*cloc, "description"), "the description") if d else None
        if bad:
            raise bad
        values.append(v)
        descriptions.append(d)
    return tuple(values), tuple(descriptions)


def _openai_levels(x: Any, loc: tuple) -> tuple[tuple[str, ...], tuple]:
    """A score's levels: each shown to the model as its label (and ": description" when given)."""
    _listed(x, loc, "levels", '{"label": ..., "description"?: ...}', MIN_LEVELS, MAX_LEVELS)
    labels, shown = [], []
    for j, lv in enumerate(x):
        lloc = (*loc, j)
        if not isinstance(lv, dict) or not isinstance(lv.get("label"), str):
            raise DecisionError(lloc, 'a level is an object {"label": string, "description"?: string}', "type_error")
        extra = [k for k in lv if k not in ("label", "description")]
        if extra:
            raise DecisionError(
                (*lloc, extra[0]), f"unknown field {extra[0]!r}: a level has label and description", "extra_forbidden"
            )
        d = lv.get("description")
        if d is not None and not isinstance(d, str):
            raise DecisionError((*lloc, "description"), "a description is a string", "type_error")
        for what, s in (("label", lv["label"]), ("description", d)):
            bad = json_problem(s, (*lloc, what), f"the {what}") if s else None
            if bad:
                raise bad
        labels.append(lv["label"])
        shown.append(f"{lv['label']}: {d}" if d else lv["label"])
    return tuple(labels), tuple(shown)
