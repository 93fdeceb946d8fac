"""Request checks: the body (size, JSON), our /v1/classify's fields, and the parts every
wire API shares (a text or a list of texts, known fields). Each check raises `HTTPError`
naming the field it failed on; none involves the model. TEI's and vLLM's own fields are
checked in their modules (`tei.py`, `vllm.py`)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ..ground.ranges import RANGES
from ..ground.textfiles import has_lone_surrogate, json_error
from ..service import ServeOptions, TaskSpec
from ..text.labels import LABEL_NOT_STRING, MIN_LABELS, label_problem
from ..text.prompts import TRUNCATE_MODES
from .encoding import BODY_FIX, decode_body
from .errors import HTTPError

REQUEST_FIELDS = ("text", "texts", "ids", "labels", "system", "template", "truncate", "min_confidence")


def parse_body(raw: bytes) -> Any:
    """The request body as JSON, or a 422 naming what is wrong (never another exception):
    not UTF-8, not JSON, nested too deeply, or a number too long to convert."""
    try:
        return json.loads(raw)
    except RecursionError:
        raise HTTPError(422, "the body is JSON nested too deeply: send a flat JSON object", "body") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise HTTPError(422, f"the body is not valid JSON ({str(e)[:200]})", "body") from None
    except ValueError as e:  # the one other: an integer of more digits than Python converts
        raise HTTPError(422, f"the body holds {json_error(e)}", "body") from None


def validate_request(raw: bytes, opts: ServeOptions) -> tuple[list[Any], list[Any], TaskSpec]:
    """Everything checked about a request before the model is involved: the body (`parse_body`)
    and its fields (`check_request`). Raises only `HTTPError` (4xx) for a bad request."""
    return check_request(parse_body(raw), opts)


def check_request(data: Any, opts: ServeOptions) -> tuple[list[Any], list[Any], TaskSpec]:
    """Our /v1/classify body: (texts (strings or (text, text_pair) tuples), ids, the request's
    task). Each check names its field."""
    if not isinstance(data, dict):
        raise HTTPError(422, "the body must be a JSON object with 'text' or 'texts'", "body")
    unknown = sorted(set(data) - set(REQUEST_FIELDS))
    if unknown:
        raise HTTPError(422, f"unknown field {unknown[0]!r}: use {', '.join(REQUEST_FIELDS)}", unknown[0])
    texts = _check_items(data, opts)
    return texts, _check_ids(data, len(texts)), _check_task(data)


def _check_items(data: dict[str, Any], opts: ServeOptions) -> list[Any]:
    """`text` (one item) or `texts` (a list of items), each with some valid text; an item is a
    string, or a pair `[text, text_pair]` (a tuple on the way in)."""
    if ("text" in data) == ("texts" in data):
        raise HTTPError(
            422,
            "give exactly one of 'text' (a string) or 'texts' (a list of strings)",
            "text" if "text" not in data else "texts",
        )
    if "text" in data:
        if not isinstance(data["text"], (str, list)):
            raise HTTPError(422, f"'text' must be a string, got {type(data['text']).__name__}", "text")
        texts, names = [pair_item(data["text"], "text")], ["text"]
        if "ids" in data:
            raise HTTPError(422, "'ids' goes with 'texts'; with 'text' there is one item", "ids")
    else:
        texts = data["texts"]
        if not isinstance(texts, list):
            raise HTTPError(422, f"'texts' must be a list of strings, got {type(texts).__name__}", "texts")
        if not texts:
            raise HTTPError(422, "'texts' is empty: give at least one text", "texts")
        check_count(len(texts), "texts", opts)
        names = [f"texts[{i}]" for i in range(len(texts))]
        texts = [pair_item(t, name) if isinstance(t, list) else t for t, name in zip(texts, names)]
        for name, t in zip(names, texts):
            if not isinstance(t, (str, tuple)):
                raise HTTPError(422, f"{name} must be a string, got {type(t).__name__}", name)
    check_text_values(names, texts)
    return texts


def check_count(
    n: int, fld: str, opts: ServeOptions, what: str = "items", cap: tuple[int, str] | None = None, fix: str = "split it"
) -> None:
    """A request of `n` items within the limit that applies (413 naming it: `ServeOptions.items_limit`,
    or `cap`, (limit, what sets it), where lower)."""
    limit, source = opts.items_limit
    if cap is not None and cap[0] < limit:
        limit, source = cap
    if n > limit:
        raise HTTPError(413, f"'{fld}' has {n} {what}, over the limit of {limit} per request ({source}): {fix}", fld)


def pair_item(value: Any, name: str, single_ok: bool = False) -> Any:
    """A request item that may be a pair: a string as it is, `[text, text_pair]` as a tuple
    (each a string, the pair not empty), `[text]` as its text where `single_ok` (TEI's batch)."""
    if isinstance(value, str):
        return value
    shape = "[text, text_pair]" + (" or [text]" if single_ok else "")
    if not (len(value) == 2 or (single_ok and len(value) == 1)):
        raise HTTPError(
            422, f"{name} must be a string or a pair of strings {shape}, got a list of {len(value)} item(s)", name
        )
    for i, x in enumerate(value):
        if not isinstance(x, str):
            raise HTTPError(
                422,
                f"{name}[{i}] must be a string (a pair is {shape} of strings), got {type(x).__name__}",
                name,
            )
    if len(value) == 1:
        return value[0]
    if not value[1].strip():
        raise HTTPError(422, f"{name}[1] is empty: give the pair's second text, or send the first text alone", name)
    if has_lone_surrogate(value[1]):
        raise HTTPError(422, f"{name}[1] holds an unpaired surrogate escape (not valid Unicode text): fix it", name)
    return (value[0], value[1])


def check_text_values(names: Sequence[str], texts: Sequence[Any]) -> None:
    """Each item's text (a pair's first) not empty and valid Unicode (a pair's second: `pair_item`)."""
    for name, x in zip(names, texts):
        t = x[0] if isinstance(x, tuple) else x
        if not t.strip():
            raise HTTPError(422, f"{name} is empty: give the item some text", name)
        if has_lone_surrogate(t):
            raise HTTPError(422, f"{name} holds an unpaired surrogate escape (not valid Unicode text): fix it", name)


def _check_ids(data: dict[str, Any], n: int) -> list[Any]:
    """`ids`: one unique string or integer per text (default: the texts' positions)."""
    if "ids" not in data:
        return list(range(n))
    ids = data["ids"]
    if not isinstance(ids, list) or len(ids) != n:
        raise HTTPError(422, f"'ids' must be a list of {n} ids, one per text", "ids")
    seen: dict[Any, int] = {}
    for i, v in enumerate(ids):
        if isinstance(v, bool) or not isinstance(v, (str, int)):
            raise HTTPError(422, f"ids[{i}] must be a string or an integer", f"ids[{i}]")
        if isinstance(v, str) and has_lone_surrogate(v):
            raise HTTPError(422, f"ids[{i}] holds an unpaired surrogate escape (not valid Unicode text)", f"ids[{i}]")
        k = (type(v).__name__, v)
        if k in seen:
            raise HTTPError(422, f"ids[{i}] repeats ids[{seen[k]}] ({v!r}): ids must be unique", f"ids[{i}]")
        seen[k] = i
    return ids


def _check_task(data: dict[str, Any]) -> TaskSpec:
    """The request's own task: `min_confidence`, `labels`, `system`, `template`, `truncate`."""
    own: dict[str, Any] = {}
    if "min_confidence" in data and data["min_confidence"] is not None:
        mc = data["min_confidence"]
        if RANGES["min_confidence"].problem(mc):  # the CLI's range: NaN and Infinity (JSON extensions) fail
            raise HTTPError(422, "'min_confidence' must be a number from 0 to 1 (or null)", "min_confidence")
        own["min_confidence"] = float(mc)
    if "labels" in data:
        lab = data["labels"]
        # the shape only (blank labels and twins are the service's `labels.validate`'s, after the strip)
        if not isinstance(lab, list) or len(lab) < MIN_LABELS or any(label_problem(x) == LABEL_NOT_STRING for x in lab):
            raise HTTPError(422, "'labels' must be a list of at least two strings", "labels")
        if any(has_lone_surrogate(x) for x in lab):
            raise HTTPError(422, "'labels' holds an unpaired surrogate escape (not valid Unicode text)", "labels")
        own["labels"] = [x.strip() for x in lab]
    if "system" in data:
        if data["system"] is not None and not isinstance(data["system"], str):
            raise HTTPError(422, "'system' must be a string or null", "system")
        if data["system"] and has_lone_surrogate(data["system"]):
            raise HTTPError(422, "'system' holds an unpaired surrogate escape (not valid Unicode text)", "system")
        own["system"] = data["system"] or ""
    if "template" in data:
        tpl = data["template"]
        if not isinstance(tpl, str) or "{text}" not in tpl:
            raise HTTPError(422, "'template' must be a string with a {text} placeholder", "template")
        if has_lone_surrogate(tpl):
            raise HTTPError(422, "'template' holds an unpaired surrogate escape (not valid Unicode text)", "template")
        own["template"] = tpl
    if "truncate" in data:
        tr = data["truncate"]
        if tr is not None and tr is not False and tr not in TRUNCATE_MODES:
            raise HTTPError(422, f"'truncate' must be one of {', '.join(TRUNCATE_MODES)}, false or null", "truncate")
        own["truncate"] = tr or False
    return TaskSpec(**own)


def check_texts(value: Any, fld: str, opts: ServeOptions, pairs: bool = False) -> tuple[list[Any], bool]:
    """A TEI `inputs` or vLLM `input`: one string or a list of strings -> (texts, was one string).
    `pairs` (TEI's /predict): a list's items may also be `[text]` or a pair `[text, text_pair]`
    (a tuple), as TEI reads a batch."""
    if isinstance(value, str):
        texts, names, single = [value], [fld], True
    elif isinstance(value, list):
        if not value:
            raise HTTPError(422, f"'{fld}' is empty: give at least one text", fld)
        check_count(len(value), fld, opts)
        names, single = [f"{fld}[{i}]" for i in range(len(value))], False
        texts = []
        for name, t in zip(names, value):
            if isinstance(t, list) and pairs:
                t = pair_item(t, name, single_ok=True)
            elif isinstance(t, list):
                raise HTTPError(
                    422, f"{name} is a list: text pairs and token ids are not supported; send strings", name
                )
            if not isinstance(t, (str, tuple)):
                raise HTTPError(422, f"{name} must be a string, got {type(t).__name__}", name)
            texts.append(t)
    else:
        raise HTTPError(422, f"'{fld}' must be a string or a list of strings, got {type(value).__name__}", fld)
    check_text_values(names, texts)
    return texts, single


def check_fields(data: Any, fields: Sequence[str], texts_field: str) -> None:
    """A peer's body (TEI's, vLLM's): a JSON object of known fields holding its texts field."""
    if not isinstance(data, dict):
        raise HTTPError(422, f"the body must be a JSON object with {texts_field!r}", "body")
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise HTTPError(422, f"unknown field {unknown[0]!r}: use {', '.join(fields)}", unknown[0])
    if texts_field not in data:
        raise HTTPError(422, f"{texts_field!r} is missing: give a string or a list of strings", texts_field)


def check_name(
    data: dict[str, Any], fld: str, status: int = 422, choices: Sequence[str] | None = None, what: str = ""
) -> str | None:
    """An optional string field of any route (`model`, `user`, `encoding_format`): absent or null
    is None; anything else that is not a string, or (with `choices`) not one of them, is a
    `status` error naming the field, never read as a default (`[]`, `""`, `false` and `0` are
    not "float"); a lone surrogate is refused (it could not be echoed back). `what`: the value's
    meaning, for the message. The one check behind every route's `model` (chat's reader has the
    same rule: `text.chat.read_request`)."""
    v = data.get(fld)
    if v is None:
        return None
    if choices is not None and v not in choices:
        raise HTTPError(
            status,
            f"'{fld}' must be {' or '.join(map(repr, choices))} (or absent), got {v!r}",
            fld,
            outcome="invalid",
        )
    if not isinstance(v, str):
        raise HTTPError(status, f"'{fld}' must be a string{what} (or absent), got {_kind(v)}", fld, outcome="invalid")
    if has_lone_surrogate(v):
        raise HTTPError(
            status,
            f"'{fld}' holds an unpaired surrogate escape (not valid Unicode text): fix it",
            fld,
            outcome="invalid",
        )
    return v


def _kind(v: Any) -> str:
    if isinstance(v, bool):
        return f"a boolean ({str(v).lower()})"
    names = {int: "an integer", float: "a number", list: "a list", dict: "an object"}
    return names.get(type(v), type(v).__name__)


async def read_body(request: Any, limit: int) -> bytes:
    """The request's body, at most `limit` bytes as sent and as decoded from its Content-Encoding
    (zstd, gzip, deflate: `encoding.decode_body`), else a 413."""
    n = request.headers.get("content-length")
    if n is not None and n.isdigit() and int(n) > limit:
        raise HTTPError(413, f"the body is {n} bytes, over the limit of {limit}: {BODY_FIX}", "body")
    from starlette.requests import ClientDisconnect  # lazy: starlette is the serve extra's

    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise HTTPError(413, f"the body is over the limit of {limit} bytes: {BODY_FIX}", "body")
            chunks.append(chunk)
    except ClientDisconnect:  # the client left mid-upload: counted, nothing logged, nobody to answer
        raise HTTPError(499, "the client closed the connection while sending the body", outcome="client_gone") from None
    return decode_body(b"".join(chunks), request.headers.get("content-encoding"), limit)
