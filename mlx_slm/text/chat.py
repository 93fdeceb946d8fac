"""OpenAI's chat-completion request, read without HTTP and without a model.

A chat completion here is answered in one of three ways, never by free generation:

* a choice (`guided_choice`, vLLM's extension, or `structured_outputs: {"choice": [...]}`): the
  most probable of the choices, each scored as a label continuing the rendered prompt;
* a JSON schema whose one free value is an `enum` of strings (`response_format`
  `{"type": "json_schema", ...}`, or vLLM's `guided_json` / `structured_outputs: {"json": ...}`):
  the enum's values are the choices, scored exactly as `guided_choice` scores them (each value as
  a label continuing the rendered prompt: the JSON around it is the same for every value and is
  not scored), and the answer is the JSON the schema implies holding the chosen value;
* neither, with `max_tokens: 1`: the model's next token, greedy, and its top log-probabilities.

`read_request` checks a request body field by field and gives a `ChatRequest` (the conversation,
the choices or the next token, the JSON shape of the answer); every problem is a `ChatError`
naming the field (as OpenAI names it: `messages[2].content`) and the fix. `token_bytes` gives a
token's exact bytes. Nothing here loads a model or knows HTTP: the wire (`server/openai.py`)
and the chat kinds (`kinds/chat.py`) share it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..ground.errors import UserError
from ..ground.textfiles import has_lone_surrogate
from .labels import MIN_LABELS

MAX_TOP_LOGPROBS = 20  # OpenAI's limit on top_logprobs
# OpenAI's roles, as the chat template is given them: "developer" is OpenAI's newer name for "system".
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}

ANSWERS = (
    'this server answers a chat completion with a choice ("guided_choice": [...] in the body, extra_body= '
    'in OpenAI\'s SDK; or "structured_outputs": {"choice": [...]}), with a JSON schema whose one free value is '
    'an enum of strings (response_format={"type": "json_schema", ...}), or with the next token ("max_tokens": 1, '
    'and "logprobs": true, "top_logprobs": N for its log-probabilities)'
)

# Fields taken and ignored: the answer is always the most probable (as at temperature 0), one choice.
IGNORED = frozenset(
    {
        "model",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "seed",
        "frequency_penalty",
        "presence_penalty",
        "repetition_penalty",
        "stop",
        "stop_token_ids",
        "user",
        "metadata",
        "store",
        "service_tier",
        "prompt_cache_key",
        "safety_identifier",
        "priority",
        "request_id",
        "parallel_tool_calls",
        "stream_options",
        "reasoning_effort",
        "verbosity",
        "skip_special_tokens",
        "spaces_between_special_tokens",
        "include_stop_str_in_output",
        "ignore_eos",
        "min_tokens",
        "cache_salt",
        "guided_decoding_backend",
        "guided_whitespace_pattern",
        "length_penalty",
    }
)
_ANSWER_FIELDS = frozenset(
    {
        "messages",
        "guided_choice",
        "guided_json",
        "structured_outputs",
        "response_format",
        "max_tokens",
        "max_completion_tokens",
        "logprobs",
        "top_logprobs",
        "n",
        "stream",
    }
)


def _unset(v: Any) -> bool:
    return v is None or v is False or v == [] or v == {}


# Fields refused when set: what this server would have to do for them, and the fix.
REFUSED: dict[str, str] = {
    "tools": "tools are not called here: drop 'tools'; " + ANSWERS,
    "functions": "functions are not called here: drop 'functions'; " + ANSWERS,
    "function_call": "functions are not called here: drop 'function_call'",
    "logit_bias": "the choices are scored as the model gives them: drop 'logit_bias'",
    "audio": "the model reads and writes text only: drop 'audio'",
    "prediction": "predicted outputs need free generation: drop 'prediction'",
    "web_search_options": "there is no web search here: drop 'web_search_options'",
    "echo": "the prompt is not echoed: drop 'echo'",
    "prompt_logprobs": "the prompt's log-probabilities are not computed: drop 'prompt_logprobs'",
    "guided_regex": "a regular expression needs free generation: list the answers in 'guided_choice'",
    "guided_grammar": "a grammar needs free generation: list the answers in 'guided_choice'",
    "use_beam_search": "there is no beam search: the answer is the most probable choice",
    "allowed_token_ids": "give the answers as 'guided_choice' instead of 'allowed_token_ids'",
    "bad_words": "give the answers as 'guided_choice' instead of 'bad_words'",
    "logits_processors": "logits processors are not run: drop 'logits_processors'",
    "continue_final_message": "the assistant's next turn is answered: end the messages with the user's turn",
    "chat_template": "the model's own chat template renders the messages: drop 'chat_template'",
    "chat_template_kwargs": "the model's own chat template renders the messages as it is: drop 'chat_template_kwargs'",
    "documents": "documents are not passed to the chat template: put them in the messages",
    "mm_processor_kwargs": "the model reads text only: drop 'mm_processor_kwargs'",
    "truncate_prompt_tokens": "the messages are not cut: shorten them to fit the model's context",
    "return_tokens_as_token_ids": "tokens are returned as text (with their bytes): drop 'return_tokens_as_token_ids'",
    "kv_transfer_params": "drop 'kv_transfer_params'",
    "vllm_xargs": "drop 'vllm_xargs'",
}


class ChatError(UserError, ValueError):
    """A chat request that cannot be answered as it is: `field` names the request field at fault."""

    def __init__(self, message: str, field: str):
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class Conversation:
    """The messages as the chat template is given them: (role, text) turns, the last the user's."""

    turns: tuple[tuple[str, str], ...]

    def messages(self, last: str | None = None) -> list[dict[str, str]]:
        """The turns as chat messages; `last`: the last turn's text replaced (a probe for the
        prompt's head, the part of it that does not depend on the last turn)."""
        out = [{"role": r, "content": t} for r, t in self.turns]
        if last is not None:
            out[-1]["content"] = last
        return out


@dataclass(frozen=True)
class JsonAnswer:
    """The answer a JSON schema implies: its one free value (`key`: the property holding it; None:
    the schema is the enum itself) among `choices`, beside the fixed properties (`fixed`: each
    required property's `const`, in the schema's order, the free one at its place as None)."""

    choices: tuple[str, ...]
    key: str | None = None
    fixed: tuple[tuple[str, Any], ...] = ()

    def content(self, value: str) -> str:
        """The answer's JSON text, as `json.dumps` writes it (`{"category": "billing"}`)."""
        obj = value if self.key is None else {k: value if k == self.key else v for k, v in self.fixed}
        text = json.dumps(obj, ensure_ascii=False)
        # a schema's own key or const holding an unpaired surrogate: written as its JSON escape
        return json.dumps(obj) if has_lone_surrogate(text) else text


@dataclass(frozen=True)
class ChatRequest:
    """A chat completion request as this server answers it: the conversation, and the choices
    (None: the next token), the JSON an answer is written as (None: the choice itself), and
    the log-probabilities asked for (`top_logprobs`: how many alternatives; None: not given)."""

    conversation: Conversation
    choices: tuple[str, ...] | None
    json: JsonAnswer | None
    logprobs: bool
    top_logprobs: int | None
    model: str | None
    source: str  # the field that gave the choices ("guided_choice", "response_format", ...), or "max_tokens"


def read_request(data: Any) -> ChatRequest:
    """A chat-completion body, checked field by field (a `ChatError` names the first at fault)."""
    if not isinstance(data, dict):
        raise ChatError(f"the body must be a JSON object with 'model' and 'messages', got {_kind(data)}", "body")
    _check_fields(data)
    model = data.get("model")
    if model is not None and not isinstance(model, str):
        raise ChatError(f"'model' must be a string, got {_kind(model)}", "model")
    conversation = read_messages(data.get("messages"))
    choices, js, source = _choices(data)
    logprobs, top = _logprobs(data)
    limit = _max_tokens(data)
    if choices is None:
        if limit != 1:
            got = "absent" if limit is None else limit
            raise ChatError(
                f"'max_tokens' is {got}: text of more than one token is not generated here; " + ANSWERS,
                "max_tokens",
            )
    return ChatRequest(conversation, choices, js, logprobs, top, model, source)


def _check_fields(data: Mapping[str, Any]) -> None:
    for name in data:
        if name in REFUSED:
            if not _unset(data[name]) and not (name == "function_call" and data[name] == "none"):
                raise ChatError(f"'{name}' is not supported: {REFUSED[name]}", name)
        elif name not in IGNORED and name not in _ANSWER_FIELDS and name not in ("tool_choice", "modalities"):
            raise ChatError(
                f"unknown field {name!r}: this server takes OpenAI's chat-completion fields and vLLM's "
                "guided_choice and structured_outputs",
                name,
            )
    if data.get("stream"):
        raise ChatError("'stream': true is not served: ask without it (an answer is one choice, sent whole)", "stream")
    n = data.get("n")
    if n is not None and (isinstance(n, bool) or n != 1):
        raise ChatError(f"'n' must be 1 (one answer: the most probable), got {n!r}", "n")
    tc = data.get("tool_choice")
    if tc is not None and tc not in ("none", "auto"):
        raise ChatError("'tool_choice' is not supported: tools are not called here; drop it", "tool_choice")
    mod = data.get("modalities")
    if mod is not None and mod != ["text"]:
        raise ChatError("'modalities' must be [\"text\"] or absent: the model writes text only", "modalities")


def _kind(v: Any) -> str:
    names = {type(None): "null", bool: "a boolean", int: "an integer", float: "a number", str: "a string"}
    return names.get(type(v), "a list" if isinstance(v, list) else "an object" if isinstance(v, dict) else "a value")


def _text(v: Any, fld: str) -> str:
    if has_lone_surrogate(v):
        raise ChatError(f"{fld} holds an unpaired surrogate escape (not valid Unicode text): fix it", fld)
    return v


# ----------------------------------------------------------------------------- messages


_NOT_TEXT = {
    "image_url": "an image",
    "input_image": "an image",
    "image": "an image",
    "input_audio": "audio",
    "audio_url": "audio",
    "video_url": "a video",
    "file": "a file",
}
_MESSAGE_FIELDS = ("role", "content", "name", "tool_calls", "function_call", "refusal", "annotations", "audio")


def read_messages(value: Any) -> Conversation:
    """OpenAI's `messages`: a non-empty list of {"role", "content"}; roles system, developer (read
    as system), user and assistant; content a string or a list of text parts (joined by a
    newline, as vLLM joins them); the last message the user's."""
    if not isinstance(value, list) or not value:
        got = "missing" if value is None else "empty" if value == [] else _kind(value)
        raise ChatError(
            f'\'messages\' must be a non-empty list of {{"role", "content"}} objects (got {got}): e.g. '
            '[{"role": "user", "content": "My card was charged twice"}]',
            "messages",
        )
    turns = [_message(m, f"messages[{i}]") for i, m in enumerate(value)]
    if turns[-1][0] != "user":
        raise ChatError(
            f"messages[{len(turns) - 1}] is the {value[-1]['role']}'s: the last message must be the user's "
            "(this server answers the assistant's next turn)",
            f"messages[{len(turns) - 1}].role",
        )
    return Conversation(tuple(turns))


def _message(m: Any, fld: str) -> tuple[str, str]:
    if not isinstance(m, dict):
        raise ChatError(f'{fld} must be an object {{"role", "content"}}, got {_kind(m)}', fld)
    for k in m:
        if k not in _MESSAGE_FIELDS and k not in ("tool_call_id", "reasoning_content", "reasoning"):
            raise ChatError(f"{fld} has an unknown field {k!r}: a message has 'role' and 'content'", f"{fld}.{k}")
    role = m.get("role")
    if role in ("tool", "function"):
        raise ChatError(
            f"{fld} is a {role} result: tools are not called here, so there are none to answer; drop it", f"{fld}.role"
        )
    if not isinstance(role, str) or role not in ROLES:
        raise ChatError(f"{fld}.role must be one of {', '.join(ROLES)}, got {role!r}", f"{fld}.role")
    for k in ("tool_calls", "function_call", "audio"):
        if not _unset(m.get(k)):
            raise ChatError(f"{fld}.{k} is not supported: tools and audio are not used here; drop it", f"{fld}.{k}")
    if m.get("name") is not None and not isinstance(m["name"], str):
        raise ChatError(f"{fld}.name must be a string", f"{fld}.name")
    return ROLES[role], _content(m.get("content"), f"{fld}.content")


def _content(c: Any, fld: str) -> str:
    if isinstance(c, str):
        return _text(c, fld)
    if not isinstance(c, list):
        raise ChatError(
            f'{fld} must be a string or a list of text parts [{{"type": "text", "text": "..."}}], got {_kind(c)}', fld
        )
    parts = []
    for j, part in enumerate(c):
        pf = f"{fld}[{j}]"
        part_type = part.get("type") if isinstance(part, dict) else None
        if part_type in _NOT_TEXT:
            raise ChatError(
                f"{pf} is {_NOT_TEXT[part_type]} ({part_type!r}): the model reads text only; send text parts "
                '{"type": "text", "text": "..."}',
                pf,
            )
        if part_type != "text" or not isinstance(part.get("text"), str):
            raise ChatError(f'{pf} must be a text part {{"type": "text", "text": "..."}}', pf)
        parts.append(_text(part["text"], f"{pf}.text"))
    return "\n".join(parts)


# ----------------------------------------------------------------------------- the answer's form


# vLLM's structured-output settings that change nothing here (the answer is a whole choice).
_SO_IGNORED = ("disable_fallback", "disable_any_whitespace", "disable_additional_properties", "whitespace_pattern")


def _choices(data: Mapping[str, Any]) -> tuple[tuple[str, ...] | None, JsonAnswer | None, str]:
    """(choices, JSON answer, the field they came from) of whichever one field asks for them."""
    given: list[tuple[str, Any]] = []
    if data.get("guided_choice") is not None:
        given.append(("guided_choice", ("choice", data["guided_choice"])))
    if data.get("guided_json") is not None:
        given.append(("guided_json", ("json", data["guided_json"])))
    so = data.get("structured_outputs")
    if so is not None:
        if not isinstance(so, dict):
            raise ChatError(
                '\'structured_outputs\' must be an object, e.g. {"choice": ["yes", "no"]}', "structured_outputs"
            )
        for k, v in so.items():
            if k in ("choice", "json") and v is not None:
                given.append((f"structured_outputs.{k}", (k, v)))
            elif k not in ("choice", "json") and not _unset(v) and k not in _SO_IGNORED:
                raise ChatError(
                    f"'structured_outputs.{k}' is not supported: {k} needs free generation; give "
                    '"choice": [...] or "json": a schema whose one free value is an enum',
                    f"structured_outputs.{k}",
                )
    rf = data.get("response_format")
    if rf is not None:
        got = _response_format(rf)
        if got is not None:
            given.append(("response_format", ("json", got)))
    if len(given) > 1:
        raise ChatError(f"give one of {' and '.join(f for f, _ in given)}: each says what the answer is", given[1][0])
    if not given:
        return None, None, "max_tokens"
    fld, (form, value) = given[0]
    if form == "choice":
        return check_choices(value, fld), None, fld
    schema_fld = "response_format.json_schema.schema" if fld == "response_format" else fld
    if isinstance(value, str):  # vLLM takes a schema as JSON text too
        try:
            value = json.loads(value)
        except ValueError:
            raise ChatError(f"{fld} is a string that is not JSON: give the schema as an object", fld) from None
    js = enum_answer(value, schema_fld)
    return js.choices, js, fld


def check_choices(value: Any, fld: str) -> tuple[str, ...]:
    """A list of at least two distinct non-empty strings (the answers to choose from)."""
    if not isinstance(value, list):
        raise ChatError(f"{fld!r} must be a list of strings (the answers to choose from), got {_kind(value)}", fld)
    if len(value) < MIN_LABELS:
        got = "empty" if not value else f"only {value[0]!r}"
        raise ChatError(f"{fld!r} is {got}: give at least two choices to choose from", fld)
    seen: dict[str, int] = {}
    for i, c in enumerate(value):
        if not isinstance(c, str):
            raise ChatError(f"{fld}[{i}] is {_kind(c)}: the choices must be strings", f"{fld}[{i}]")
        if not c.strip():
            raise ChatError(f"{fld}[{i}] is empty: give every choice some text", f"{fld}[{i}]")
        _text(c, f"{fld}[{i}]")
        if c.strip() in seen:
            raise ChatError(f"{fld}[{i}] {c!r} repeats {fld}[{seen[c.strip()]}]: give each choice once", f"{fld}[{i}]")
        seen[c.strip()] = i
    return tuple(value)


def _response_format(rf: Any) -> Any:
    """The schema of a `response_format` (None: plain text, no schema)."""
    if not isinstance(rf, dict) or not isinstance(rf.get("type"), str):
        raise ChatError(
            '\'response_format\' must be an object with a "type": "json_schema" (or "text")', "response_format"
        )
    format_type = rf["type"]
    if format_type == "text":
        return None
    if format_type == "json_object":
        raise ChatError(
            'response_format {"type": "json_object"} asks for any JSON, which needs free generation: give '
            '{"type": "json_schema", "json_schema": {"name": ..., "schema": ...}} whose one free value is an enum '
            "of strings",
            "response_format.type",
        )
    if format_type != "json_schema":
        raise ChatError(
            f'response_format.type must be "json_schema" or "text", got {format_type!r}', "response_format.type"
        )
    js = rf.get("json_schema")
    if not isinstance(js, dict) or not isinstance(js.get("schema"), dict):
        raise ChatError(
            'response_format.json_schema must be an object {"name": ..., "schema": {...}} holding the schema',
            "response_format.json_schema",
        )
    return js["schema"]


def enum_answer(schema: Any, fld: str) -> JsonAnswer:
    """The answer a JSON schema leaves free: an `enum` of strings at its top level, or as the one
    required property of an object whose other properties are fixed (`const`, or an enum of one
    value); `$ref`s into `$defs`/`definitions` followed (Pydantic writes an Enum class so)."""
    if not isinstance(schema, dict):
        raise ChatError(f"{fld} must be a JSON schema object, got {_kind(schema)}", fld)
    node, where = _deref(schema, schema, fld)
    if "const" in node:
        raise ChatError(f"{where} is one fixed value (const): the schema leaves nothing to choose; " + _SHAPE, where)
    if "enum" in node:
        values = _enum_values(node, where)
        if values is None:
            raise ChatError(f"{where} is one fixed value: the schema leaves nothing to choose; " + _SHAPE, where)
        return JsonAnswer(values)
    props = node.get("properties")
    if node.get("type") != "object" and props is None:
        raise ChatError(f"{where} has no enum: " + _SHAPE, where)
    if not isinstance(props, dict) or not props:
        raise ChatError(f"{where}.properties must name the object's properties: " + _SHAPE, f"{where}.properties")
    # Every value read from the schema is checked for its JSON type first (a list or an object
    # where a name belongs raised TypeError, a 500): a wrong one is a ChatError naming it.
    required = node.get("required", [])
    if not isinstance(required, list) or any(not isinstance(r, str) or r not in props for r in required):
        odd = [r for r in required if not isinstance(r, str)] if isinstance(required, list) else [required]
        got = f" (it holds {_kind(odd[0])})" if odd else ""
        raise ChatError(
            f"{where}.required must be a list of the names (strings) of {where}.properties{got}", f"{where}.required"
        )
    free: list[tuple[str, tuple[str, ...], str]] = []
    fixed: list[tuple[str, Any]] = []
    loose: list[str] = []
    for name, sub in props.items():
        pf = f"{where}.properties.{name}"
        sub, sf = _deref(sub, schema, pf) if isinstance(sub, dict) else (sub, pf)
        if not isinstance(sub, dict):
            raise ChatError(f"{pf} must be a JSON schema object", pf)
        if "const" in sub or ("enum" in sub and isinstance(sub["enum"], list) and len(sub["enum"]) == 1):
            if name in required:
                fixed.append((name, sub["const"] if "const" in sub else sub["enum"][0]))
            continue
        if "enum" in sub:
            free.append((name, _enum_values(sub, sf) or (), sf))
        else:
            loose.append(name)
        if name in required:
            fixed.append((name, None))
    if len(free) + len(loose) > 1:
        names = [n for n, _, _ in free] + loose
        raise ChatError(
            f"{where} leaves {len(names)} free values ({', '.join(names[:5])}): one free value is answered here, "
            'an enum of strings; fix the others with "const", or ask one question per request',
            f"{where}.properties.{names[1]}",
        )
    if loose:
        raise ChatError(
            f"{where}.properties.{loose[0]} has no enum: its value would need free generation; " + _SHAPE,
            f"{where}.properties.{loose[0]}",
        )
    if not free:
        raise ChatError(
            f"{where} has no enum: every property is fixed, so there is nothing to choose; " + _SHAPE, where
        )
    name, values, _ = free[0]
    if name not in required:
        raise ChatError(
            f"{where}.properties.{name} is not required: list it in {where}.required (the answer always holds it)",
            f"{where}.required",
        )
    return JsonAnswer(values, name, tuple(fixed))


_SHAPE = (
    'give a schema whose one free value is an enum of strings: {"type": "string", "enum": ["billing", "technical"]}, '
    'or {"type": "object", "properties": {"category": {"type": "string", "enum": [...]}}, "required": ["category"]}'
)


def _deref(node: dict[str, Any], root: dict[str, Any], fld: str) -> tuple[dict[str, Any], str]:
    """A schema node with its local `$ref` followed (`#/$defs/X`, `#/definitions/X`), and its field name."""
    for _ in range(8):
        ref = node.get("$ref")
        if ref is None:
            return node, fld
        parts = ref.split("/") if isinstance(ref, str) else []
        target = root.get(parts[1]) if len(parts) == 3 and parts[0] == "#" else None
        if parts[1:2] not in (["$defs"], ["definitions"]) or not isinstance(target, dict) or parts[2] not in target:
            raise ChatError(f"{fld}.$ref {ref!r} must point into the schema's $defs (e.g. '#/$defs/Category')", fld)
        node, fld = target[parts[2]], f"{parts[1]}.{parts[2]}"
        if not isinstance(node, dict):
            raise ChatError(f"{fld} must be a JSON schema object", fld)
    raise ChatError(f"{fld}: $ref leads on too far", fld)


def _enum_values(node: dict[str, Any], fld: str) -> tuple[str, ...] | None:
    """An enum of strings (checked as choices), or None when it holds one value (fixed)."""
    values = [node["const"]] if "const" in node else node["enum"]
    if not isinstance(values, list):
        raise ChatError(f"{fld}.enum must be a list of strings", f"{fld}.enum")
    bad = [v for v in values if not isinstance(v, str)]
    if bad:
        raise ChatError(
            f"{fld}.enum holds {_kind(bad[0])} ({bad[0]!r}): the choices must be strings (write "
            f'"{bad[0]}" for a value of your own to read back)',
            f"{fld}.enum",
        )
    if node.get("type") not in (None, "string"):
        raise ChatError(f'{fld}.type must be "string" for an enum of strings', f"{fld}.type")
    if len(values) == 1:
        return None
    return check_choices(values, f"{fld}.enum")


# ----------------------------------------------------------------------------- log-probabilities


def _logprobs(data: Mapping[str, Any]) -> tuple[bool, int | None]:
    lp = data.get("logprobs")
    if lp is not None and not isinstance(lp, bool):
        raise ChatError(f"'logprobs' must be true or false, got {_kind(lp)}", "logprobs")
    top = data.get("top_logprobs")
    if top is not None:
        if isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= MAX_TOP_LOGPROBS:
            raise ChatError(
                f"'top_logprobs' must be a whole number from 0 to {MAX_TOP_LOGPROBS}, got {top!r}", "top_logprobs"
            )
        if not lp:
            raise ChatError("'top_logprobs' needs 'logprobs': true", "logprobs")
    return bool(lp), top


def _max_tokens(data: Mapping[str, Any]) -> int | None:
    limit = None
    for fld in ("max_tokens", "max_completion_tokens"):
        v = data.get(fld)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ChatError(f"'{fld}' must be a whole number of 1 or more, got {v!r}", fld)
        limit = v if limit is None else min(limit, v)
    return limit


# ----------------------------------------------------------------------------- tokens as text and bytes


def token_bytes(tokenizer: Any, token_id: int) -> bytes:
    """A token's exact bytes: a byte-level BPE token (GPT-2's, Qwen's, SmolLM2's) mapped back
    through its byte alphabet, so a token holding part of a character keeps its bytes; any
    other token its decoded text's UTF-8."""
    table = _byte_table(tokenizer)
    if table:
        piece = tokenizer.convert_ids_to_tokens(int(token_id))
        if isinstance(piece, str) and piece and all(c in table for c in piece):
            return bytes(table[c] for c in piece)
    return tokenizer.decode([int(token_id)]).encode("utf-8")


def _byte_table(tokenizer: Any) -> dict[str, int]:
    """GPT-2's byte alphabet reversed ({char: byte}) when the tokenizer decodes byte-level, else {}."""
    got = getattr(tokenizer, "_mlx_slm_byte_table", None)
    if got is not None:
        return got
    table: dict[str, int] = {}
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and type(backend.decoder).__name__ == "ByteLevel":
        keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
        chars, n = list(keep), 0
        for b in range(256):
            if b not in keep:
                keep.append(b)
                chars.append(256 + n)
                n += 1
        table = {chr(c): b for b, c in zip(keep, chars)}
    try:
        tokenizer._mlx_slm_byte_table = table
    except AttributeError:
        pass
    return table
