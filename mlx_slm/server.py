"""`mlx-slm serve`: the HTTP layer over the service core (`service.py`), as TEI's router over its core.

    request handler (event loop)                 the core (`Service`)
    auth, size limits, JSON checks   -->  classify: task LRU, tokenize, bounded queue, micro-batching
    (422 naming the field)                worker, calibration; its own errors (`ServiceError`)
    answer in the route's shape      <--  mapped to statuses here in one table (`http_error`)

This module owns what is HTTP: the body limits, request parsing and validation for our
/v1/classify, TEI's /predict and vLLM's /classify (each check names the field it failed on),
the Starlette routes (`_Routes`), auth, the OpenAPI document, the error bodies in each API's
style, and binding, running and draining the server. The core knows none of it.

Limits answer with JSON errors that name the field: 413 (body size, items per request),
422 (invalid or empty fields, prompts over the context), 429 with Retry-After (the queue
would pass --max-queue-items), 504 (per-request timeout), 401 (Bearer key, when set),
503 (loading, or draining after SIGTERM). A client that goes away has its queued items
dropped before they are computed. SIGTERM: new requests get 503, every accepted request
is finished within --drain-timeout, then the process exits 0.

Every client-caused failure is a 4xx with a JSON error (never a 500, never a traceback in
the log): a body that is not UTF-8 JSON, nested too deeply or holding a lone surrogate
(`"\\ud800"`: not encodable text) is 422; a client that leaves while sending its body is
counted as `client_gone` (499, never sent). Every outcome is counted in /metrics
(`mlx_slm_requests_total{outcome=...}`).
"""

from __future__ import annotations

import errno
import hmac
import json
import os
import signal
import threading
import time
from collections.abc import Callable, Sequence
from types import SimpleNamespace
from typing import Any

from .io import has_lone_surrogate
from .prompts import TRUNCATE_MODES
from .service import (
    Aborted,
    Answer,
    ClientGone,
    Draining,
    Failed,
    Invalid,
    Loaded,
    Metrics,
    NotReady,
    QueueFull,
    ServeOptions,
    Service,
    ServiceError,
    TaskSpec,
    TimedOut,
    classifier_loader,
)

API_KEY_ENV = "MLX_SLM_API_KEY"
REQUEST_FIELDS = ("text", "texts", "ids", "labels", "system", "template", "truncate", "min_confidence")


# --------------------------------------------------------------------------- errors


class HTTPError(Exception):
    """An HTTP error answer: status, message, the field at fault, headers, the outcome counted in
    /metrics, and the body style when it differs from the route's (a vLLM body on /v1/classify)."""

    def __init__(
        self,
        status: int,
        message: str,
        field: str | None = None,
        headers: dict[str, str] | None = None,
        outcome: str | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.field, self.headers = status, message, field, headers or {}
        self.style: str | None = None
        self.outcome = outcome or {
            401: "unauthorized",
            413: "too_large",
            422: "invalid",
            429: "overloaded",
            503: "unavailable",
            504: "timeout",
        }.get(status, "error")

    def body(self, style: str = "ours") -> dict[str, Any]:
        """The JSON error: ours, `{"error": {"status", "message", "field"}}`; on the TEI routes
        TEI's `{"error": message, "error_type"}` (what its clients read); on vLLM's routes ours
        with OpenAI's `type`, `param` and `code` added."""
        msg = _printable(self.message)
        if style == "tei":
            return {"error": msg, "error_type": _TEI_ERROR_TYPES.get(self.status, "Backend")}
        err: dict[str, Any] = {"status": self.status, "message": msg}
        if self.field is not None:
            err["field"] = _printable(self.field)
        if style == "openai":
            err.update(
                type="invalid_request_error" if 400 <= self.status < 500 else "server_error",
                param=err.get("field"),
                code=self.status,
            )
        return {"error": err}


_TEI_ERROR_TYPES = {
    401: "Unauthorized",
    404: "NotFound",
    405: "MethodNotAllowed",
    413: "Validation",
    422: "Validation",
    429: "Overloaded",
    503: "Unhealthy",
    504: "Backend",
}


def _printable(s: str) -> str:
    """`s` with any lone surrogate (from a client's JSON, e.g. an unknown field "\\ud800")
    written as its escape, so that the error response itself can be encoded."""
    return s.encode("utf-8", "backslashreplace").decode("utf-8")


# The one map from the core's errors to HTTP: (status, outcome counted in /metrics).
_STATUS: dict[type[ServiceError], tuple[int, str]] = {
    Invalid: (422, "invalid"),
    QueueFull: (429, "overloaded"),
    NotReady: (503, "unavailable"),
    Draining: (503, "unavailable"),
    Aborted: (503, "unavailable"),
    TimedOut: (504, "timeout"),
    ClientGone: (499, "client_gone"),
    Failed: (500, "error"),
}


def http_error(e: ServiceError | HTTPError) -> HTTPError:
    """The HTTP answer to an error: the core's mapped by `_STATUS` (Retry-After from its
    `retry_after`); ours (auth, body, validation) as it is."""
    if isinstance(e, HTTPError):
        return e
    status, outcome = _STATUS[type(e)]
    headers = {"Retry-After": str(e.retry_after)} if e.retry_after is not None else None
    return HTTPError(status, e.message, e.field, headers, outcome)


def _error_response(e: HTTPError, style: str = "ours") -> Any:
    """The error as a JSON response in a route's style (ours, "tei" or "openai")."""
    from starlette.responses import JSONResponse

    return JSONResponse(e.body(e.style or style), status_code=e.status, headers=e.headers)


def _json(content: Any, headers: dict[str, str] | None = None, status: int = 200) -> Any:
    from starlette.responses import JSONResponse

    return JSONResponse(content, status_code=status, headers=headers)


# --------------------------------------------------------------------------- request checks


def parse_body(raw: bytes) -> Any:
    """The request body as JSON, or a 422 naming what is wrong (never another exception):
    not UTF-8, not JSON, nested too deeply, or a number too long to convert."""
    try:
        return json.loads(raw)
    except RecursionError:
        raise HTTPError(422, "the body is JSON nested too deeply: send a flat JSON object", "body") from None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, an integer of too many digits
        raise HTTPError(422, f"the body is not valid JSON ({str(e)[:200]})", "body") from None


def validate_request(raw: bytes, opts: ServeOptions) -> tuple[list[str], list[Any], TaskSpec]:
    """Everything checked about a request before the model is involved: the body (`parse_body`)
    and its fields (`_check_request`). Raises only `HTTPError` (4xx) for a bad request."""
    return _check_request(parse_body(raw), opts)


def _check_request(data: Any, opts: ServeOptions) -> tuple[list[str], list[Any], TaskSpec]:
    """Our /v1/classify body: (texts, ids, the request's task). Each check names its field."""
    if not isinstance(data, dict):
        raise HTTPError(422, "the body must be a JSON object with 'text' or 'texts'", "body")
    unknown = sorted(set(data) - set(REQUEST_FIELDS))
    if unknown:
        raise HTTPError(422, f"unknown field {unknown[0]!r}: use {', '.join(REQUEST_FIELDS)}", unknown[0])
    texts = _check_items(data, opts)
    return texts, _check_ids(data, len(texts)), _check_task(data)


def _check_items(data: dict[str, Any], opts: ServeOptions) -> list[str]:
    """`text` (one string) or `texts` (a list of strings), each with some valid text."""
    if ("text" in data) == ("texts" in data):
        raise HTTPError(
            422,
            "give exactly one of 'text' (a string) or 'texts' (a list of strings)",
            "text" if "text" not in data else "texts",
        )
    if "text" in data:
        if not isinstance(data["text"], str):
            raise HTTPError(422, f"'text' must be a string, got {type(data['text']).__name__}", "text")
        texts, names = [data["text"]], ["text"]
        if "ids" in data:
            raise HTTPError(422, "'ids' goes with 'texts'; with 'text' there is one item", "ids")
    else:
        texts = data["texts"]
        if not isinstance(texts, list):
            raise HTTPError(422, f"'texts' must be a list of strings, got {type(texts).__name__}", "texts")
        if not texts:
            raise HTTPError(422, "'texts' is empty: give at least one text", "texts")
        if len(texts) > opts.max_items_per_request:
            raise HTTPError(
                413,
                f"'texts' has {len(texts)} items, over the limit of {opts.max_items_per_request} per request: split it",
                "texts",
            )
        for i, t in enumerate(texts):
            if not isinstance(t, str):
                raise HTTPError(422, f"texts[{i}] must be a string, got {type(t).__name__}", f"texts[{i}]")
        names = [f"texts[{i}]" for i in range(len(texts))]
    _check_text_values(names, texts)
    return texts


def _check_text_values(names: Sequence[str], texts: Sequence[str]) -> None:
    for name, t in zip(names, texts):
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
    task = TaskSpec()
    if "min_confidence" in data and data["min_confidence"] is not None:
        mc = data["min_confidence"]
        if isinstance(mc, bool) or not isinstance(mc, (int, float)) or not 0.0 <= mc <= 1.0:
            raise HTTPError(422, "'min_confidence' must be a number from 0 to 1 (or null)", "min_confidence")
        task.min_confidence = float(mc)
    if "labels" in data:
        lab = data["labels"]
        if not isinstance(lab, list) or not all(isinstance(x, str) for x in lab) or len(lab) < 2:
            raise HTTPError(422, "'labels' must be a list of at least two strings", "labels")
        if any(has_lone_surrogate(x) for x in lab):
            raise HTTPError(422, "'labels' holds an unpaired surrogate escape (not valid Unicode text)", "labels")
        task.labels = [x.strip() for x in lab]
    if "system" in data:
        if data["system"] is not None and not isinstance(data["system"], str):
            raise HTTPError(422, "'system' must be a string or null", "system")
        if data["system"] and has_lone_surrogate(data["system"]):
            raise HTTPError(422, "'system' holds an unpaired surrogate escape (not valid Unicode text)", "system")
        task.system = data["system"] or ""
    if "template" in data:
        tpl = data["template"]
        if not isinstance(tpl, str) or "{text}" not in tpl:
            raise HTTPError(422, "'template' must be a string with a {text} placeholder", "template")
        if has_lone_surrogate(tpl):
            raise HTTPError(422, "'template' holds an unpaired surrogate escape (not valid Unicode text)", "template")
        task.template = tpl
    if "truncate" in data:
        tr = data["truncate"]
        if tr is not None and tr is not False and tr not in TRUNCATE_MODES:
            raise HTTPError(422, f"'truncate' must be one of {', '.join(TRUNCATE_MODES)}, false or null", "truncate")
        task.truncate = tr or False
    return task


def _check_texts(value: Any, fld: str, opts: ServeOptions) -> tuple[list[str], bool]:
    """A TEI `inputs` or vLLM `input`: one string or a list of strings -> (texts, was one string)."""
    if isinstance(value, str):
        texts, names, single = [value], [fld], True
    elif isinstance(value, list):
        if not value:
            raise HTTPError(422, f"'{fld}' is empty: give at least one text", fld)
        if len(value) > opts.max_items_per_request:
            raise HTTPError(
                413,
                f"'{fld}' has {len(value)} items, over the limit of {opts.max_items_per_request} per request: split it",
                fld,
            )
        names, single = [f"{fld}[{i}]" for i in range(len(value))], False
        for name, t in zip(names, value):
            if isinstance(t, list):
                raise HTTPError(
                    422, f"{name} is a list: text pairs and token ids are not supported; send strings", name
                )
            if not isinstance(t, str):
                raise HTTPError(422, f"{name} must be a string, got {type(t).__name__}", name)
        texts = value
    else:
        raise HTTPError(422, f"'{fld}' must be a string or a list of strings, got {type(value).__name__}", fld)
    _check_text_values(names, texts)
    return texts, single


TEI_FIELDS = ("inputs", "raw_scores", "truncate", "truncation_direction", "parameters")


def _check_fields(data: Any, fields: Sequence[str], texts_field: str) -> None:
    """A peer's body (TEI's, vLLM's): a JSON object of known fields holding its texts field."""
    if not isinstance(data, dict):
        raise HTTPError(422, f"the body must be a JSON object with {texts_field!r}", "body")
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise HTTPError(422, f"unknown field {unknown[0]!r}: use {', '.join(fields)}", unknown[0])
    if texts_field not in data:
        raise HTTPError(422, f"{texts_field!r} is missing: give a string or a list of strings", texts_field)


def _check_tei(data: Any, opts: ServeOptions) -> tuple[list[str], bool, TaskSpec, bool, int | None]:
    """TEI's /predict body: {"inputs": str | [str], "raw_scores"?, "truncate"?, "truncation_direction"?},
    and the InferenceClient's {"inputs", "parameters": {"function_to_apply"?, "top_k"?}}.
    Returns (texts, one string given, task, raw scores, top k)."""
    _check_fields(data, TEI_FIELDS, "inputs")
    texts, single = _check_texts(data["inputs"], "inputs", opts)
    task = TaskSpec()
    raw_scores = data.get("raw_scores", False)
    if raw_scores is None:
        raw_scores = False
    if not isinstance(raw_scores, bool):
        raise HTTPError(422, "'raw_scores' must be true or false", "raw_scores")
    direction = data.get("truncation_direction") or "Right"
    if not isinstance(direction, str) or direction.lower() not in ("right", "left"):
        raise HTTPError(422, '\'truncation_direction\' must be "Right" or "Left"', "truncation_direction")
    if "truncate" in data and data["truncate"] is not None:
        tr = data["truncate"]
        if not isinstance(tr, bool):
            raise HTTPError(422, "'truncate' must be true or false", "truncate")
        # TEI cuts the end off ("Right", keeping the head) unless told "Left" (keeping the tail).
        task.truncate = ("head" if direction.lower() == "right" else "tail") if tr else False
    top_k = None
    params = data.get("parameters")
    if params is not None:
        if not isinstance(params, dict):
            raise HTTPError(422, "'parameters' must be an object", "parameters")
        extra = sorted(k for k, v in params.items() if k not in ("function_to_apply", "top_k") and v is not None)
        if extra:
            raise HTTPError(
                422, f"unknown parameter {extra[0]!r}: use function_to_apply, top_k", f"parameters.{extra[0]}"
            )
        fn = params.get("function_to_apply")
        if fn is not None:
            if fn not in ("softmax", "none"):
                raise HTTPError(
                    422,
                    f"function_to_apply {fn!r} is not supported: 'softmax' (probabilities, the default) or 'none' "
                    "(the raw label scores); one label per text, so no 'sigmoid'",
                    "parameters.function_to_apply",
                )
            raw_scores = raw_scores or fn == "none"
        k = params.get("top_k")
        if k is not None:
            if isinstance(k, bool) or not isinstance(k, int) or k < 1:
                raise HTTPError(422, "'top_k' must be an integer of 1 or more", "parameters.top_k")
            top_k = k
    return texts, single, task, raw_scores, top_k


VLLM_FIELDS = ("model", "input", "truncate_prompt_tokens", "user", "priority", "request_id")


def _check_vllm(data: Any, opts: ServeOptions) -> tuple[list[str], bool, TaskSpec]:
    """vLLM's classification body: {"model", "input": str | [str], "truncate_prompt_tokens"?}
    (`user`, `priority`, `request_id` are accepted and ignored)."""
    _check_fields(data, VLLM_FIELDS, "input")
    if data.get("model") is not None and not isinstance(data["model"], str):
        raise HTTPError(422, "'model' must be a string", "model")
    texts, single = _check_texts(data["input"], "input", opts)
    task = TaskSpec()
    tpt = data.get("truncate_prompt_tokens")
    if tpt is not None:
        if isinstance(tpt, bool) or not isinstance(tpt, int) or tpt != -1:
            raise HTTPError(
                422,
                "'truncate_prompt_tokens' must be -1 (truncate to the model's context, keeping the end as vLLM "
                "does) or null; a token count is not supported",
                "truncate_prompt_tokens",
            )
        task.truncate = "tail"
    return texts, single, task


async def _read_body(request: Any, limit: int) -> bytes:
    n = request.headers.get("content-length")
    if n is not None and n.isdigit() and int(n) > limit:
        raise HTTPError(413, f"the body is {n} bytes, over the limit of {limit}", "body")
    from starlette.requests import ClientDisconnect

    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise HTTPError(413, f"the body is over the limit of {limit} bytes", "body")
            chunks.append(chunk)
    except ClientDisconnect:  # the client left mid-upload: counted, nothing logged, nobody to answer
        raise HTTPError(499, "the client closed the connection while sending the body", outcome="client_gone") from None
    return b"".join(chunks)


async def _until_disconnect(request: Any) -> None:
    while True:
        msg = await request.receive()
        if msg["type"] == "http.disconnect":
            return


_STR_OR_LIST = {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}, "minItems": 1}]}
_COMMON_ERRORS = {
    "401": {"description": "missing or wrong Bearer key"},
    "413": {"description": "body or item count over the limit"},
    "422": {"description": "invalid field, empty text, prompt over the context"},
    "429": {"description": "queue full; see Retry-After"},
    "503": {"description": "loading or shutting down"},
    "504": {"description": "request timeout"},
}


def _json_body(properties: dict[str, Any], required: Sequence[str] = ()) -> dict[str, Any]:
    """An OpenAPI request body: a required JSON object with these properties."""
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        schema["required"] = list(required)
    return {"required": True, "content": {"application/json": {"schema": schema}}}


_TEI_PREDICT: dict[str, Any] = {
    "summary": "text-embeddings-inference's /predict: one list of {label, score} per input, best first "
    "(a single string is answered as a list holding its one list).",
    "security": [{"bearer": []}],
    "requestBody": _json_body(
        {
            "inputs": _STR_OR_LIST,
            "raw_scores": {"type": "boolean", "description": "the model's label scores, no softmax"},
            "truncate": {"type": "boolean", "nullable": True},
            "truncation_direction": {"type": "string", "enum": ["Right", "Left"]},
            "parameters": {
                "type": "object",
                "description": "Hugging Face InferenceClient's: function_to_apply (softmax|none), top_k",
            },
        },
        required=["inputs"],
    ),
    "responses": {
        "200": {"description": "[[{label, score}, ...], ...]; errors are {error, error_type}"},
        **_COMMON_ERRORS,
    },
}
_VLLM_CLASSIFY: dict[str, Any] = {
    "summary": "vLLM's classification API: {model, input} -> {id, object: list, created, model, "
    "data: [{index, label, probs (the task's label order), num_classes}], usage}. "
    "POST /v1/classify with an 'input' field answers the same.",
    "security": [{"bearer": []}],
    "requestBody": _json_body(
        {
            "model": {"type": "string", "description": "any name: the server has one model"},
            "input": _STR_OR_LIST,
            "truncate_prompt_tokens": {"type": "integer", "enum": [-1], "nullable": True},
            "user": {"type": "string"},
            "priority": {"type": "integer"},
            "request_id": {"type": "string"},
        },
        required=["input"],
    ),
    "responses": {"200": {"description": "vLLM's ClassificationResponse"}, **_COMMON_ERRORS},
}

OPENAPI: dict[str, Any] = {
    "openapi": "3.0.3",
    "info": {"title": "mlx-slm", "version": "1"},
    "paths": {
        "/v1/classify": {
            "post": {
                "summary": "Classify one text or a list of texts into one of the task's labels "
                "(a body with vLLM's 'input' field gets vLLM's answer, as POST /classify).",
                "security": [{"bearer": []}],
                "requestBody": _json_body(
                    {
                        "text": {"type": "string"},
                        "texts": {"type": "array", "items": {"type": "string"}},
                        "ids": {
                            "type": "array",
                            "items": {"oneOf": [{"type": "string"}, {"type": "integer"}]},
                        },
                        "labels": {"type": "array", "items": {"type": "string"}, "minItems": 2},
                        "system": {"type": "string", "nullable": True},
                        "template": {"type": "string", "description": "must contain {text}"},
                        "truncate": {"type": "string", "enum": list(TRUNCATE_MODES), "nullable": True},
                        "min_confidence": {
                            "type": "number",
                            "minimum": 0,
                            "maximum": 1,
                            "nullable": True,
                            "description": "abstain (label null, abstained true) below this probability",
                        },
                    }
                ),
                "responses": {
                    "200": {
                        "description": "results[i]: id, label, probs, raw_probs and calibration (when calibrated), "
                        "abstained, truncated, queue_ms, inference_ms; scoring: 'head' (the task's learned head) "
                        "or 'labels' (label scoring: a task without a head, or the request's own labels or "
                        "prompt); headers x-total-time, x-queue-time, x-inference-time (ms)"
                    },
                    "401": {"description": "missing or wrong Bearer key"},
                    "413": {"description": "body or item count over the limit (error.field names it)"},
                    "422": {"description": "invalid field, empty text, prompt over the context (error.field)"},
                    "429": {"description": "queue full; see Retry-After"},
                    "503": {"description": "loading or shutting down"},
                    "504": {"description": "request timeout"},
                },
            }
        },
        "/classify": {"post": _VLLM_CLASSIFY},
        "/predict": {"post": _TEI_PREDICT},
        "/": {"post": {**_TEI_PREDICT, "summary": "As POST /predict (Hugging Face's InferenceClient posts here)."}},
        "/info": {
            "get": {
                "summary": "text-embeddings-inference's /info: model_id, model_sha, model_dtype, "
                "model_type.classifier.id2label, max_input_length, max_batch_tokens, max_client_batch_size, version.",
                "security": [{"bearer": []}],
            }
        },
        "/v1/models": {
            "get": {
                "summary": "OpenAI/vLLM model list: the one served model (id, max_model_len, labels).",
                "security": [{"bearer": []}],
            }
        },
        "/v1/model": {"get": {"summary": "Model, weights sha256, dtype, device, default task, limits."}},
        "/health": {"get": {"summary": "200 when loaded and warmed; 503 before, and while draining."}},
        "/metrics": {"get": {"summary": "Prometheus text format."}},
    },
    "components": {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
}


# --------------------------------------------------------------------------- the routes


class _Routes:
    """The routes over one `Service`: each checks and parses its API's request, hands the texts
    to the core (`Service.classify`) and writes the answer in its API's shape. Errors, ours
    and the core's (`http_error`), become JSON bodies in the route's style."""

    def __init__(self, service: Service):
        self.service, self.opts, self.metrics = service, service.opts, service.metrics
        self.started = int(time.time())

    # ---------------------------------------------------------------- shared steps
    def check_auth(self, request: Any) -> None:
        key = self.opts.api_key
        if not key:
            return
        got = request.headers.get("authorization", "")
        scheme, _, token = got.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), key.encode()):
            raise HTTPError(
                401,
                "missing or wrong API key: send 'Authorization: Bearer KEY'",
                "authorization",
                headers={"WWW-Authenticate": "Bearer"},
            )

    def guard(self, request: Any) -> HTTPError | None:
        """Auth and readiness for the read-only model routes; None when they pass."""
        try:
            self.check_auth(request)
            self.service.require_loaded()
        except (HTTPError, ServiceError) as e:
            return http_error(e)
        return None

    def endpoint(self, handler: Callable[..., Any], style: str = "ours") -> Callable[..., Any]:
        """A classifying route: every outcome counted in /metrics, every error a JSON body in the
        route's style (ours, TEI's, or OpenAI/vLLM's), a bug of ours one log line and a 500."""
        m = self.metrics

        async def run(request: Any) -> Any:
            t0 = time.perf_counter()
            try:
                resp = await handler(request, t0)
                m.count(m.requests, "ok")
                m.observe("mlx_slm_request_seconds", time.perf_counter() - t0)
                return resp
            except (HTTPError, ServiceError) as e:
                err = http_error(e)
                m.count(m.requests, err.outcome)
                return _error_response(err, style)
            except Exception as e:  # noqa: BLE001 - a bug of ours: one log line, a counted 500, no ASGI traceback
                import logging

                logging.getLogger("mlx_slm.server").error(
                    "%s %s failed: %s: %s", request.method, request.url.path, type(e).__name__, e
                )
                m.count(m.requests, "error")
                return _error_response(HTTPError(500, f"internal error ({type(e).__name__}): please report it"), style)

        return run

    async def admit(self, request: Any) -> Any:
        """Auth, readiness, then the body as JSON (a 4xx naming what is wrong)."""
        self.check_auth(request)
        self.service.require_ready()
        return parse_body(await _read_body(request, self.opts.max_body_bytes))

    async def compute(
        self, request: Any, t0: float, texts: list[str], task: TaskSpec, names: list[str], whole: str, hint: str
    ) -> Answer:
        """The core's answer to one request's texts. `names`: each text's field, for errors;
        `whole`: the field a timeout names; `hint`: how this API asks for truncation."""
        return await self.service.classify(
            texts,
            task,
            names=names,
            whole=whole,
            truncate_hint=hint,
            started=t0,
            gone=lambda: _until_disconnect(request),
        )

    def served_name(self) -> str:
        ld = self.service.loaded
        return (ld.model if ld is not None and ld.model else None) or "mlx-slm"

    # ---------------------------------------------------------------- classifying routes
    async def classify(self, request: Any, t0: float) -> Any:
        """Our /v1/classify; a body with vLLM's `input` gets vLLM's answer (as vLLM serves it)."""
        data = await self.admit(request)
        if isinstance(data, dict) and "input" in data and not {"text", "texts"} & set(data):
            try:
                return await self.vllm_answer(request, t0, data)
            except (HTTPError, ServiceError) as e:
                err = http_error(e)
                err.style = "openai"
                raise err from None
        if isinstance(data, dict) and "inputs" in data and not {"text", "texts"} & set(data):
            raise HTTPError(
                422,
                "'inputs' is text-embeddings-inference's field: POST that body to /predict (TEI's answer), "
                "or send 'text'/'texts' here",
                "inputs",
            )
        texts, ids, task = _check_request(data, self.opts)
        names = ["text"] if "text" in data else [f"texts[{i}]" for i in range(len(texts))]
        whole = "texts" if len(texts) > 1 else "text"
        ans = await self.compute(request, t0, texts, task, names, whole, '"truncate": "head"|"tail"|"middle"')
        from .output import result_record

        results = []
        for i, pr in enumerate(ans.predictions):
            rec = result_record(SimpleNamespace(id=ids[i], line=None, error=None), pr, ans.calibration.method)
            _, q, inf = ans.raw[i]
            rec["queue_ms"], rec["inference_ms"] = round(q * 1000, 3), round(inf * 1000, 3)
            results.append(rec)
        total = (time.perf_counter() - t0) * 1000
        q_ms = max(r["queue_ms"] for r in results)
        i_ms = max(r["inference_ms"] for r in results)
        # A head task answers a request with its own labels or prompt by label scoring: say which ran.
        scoring = "head" if ans.classifier.mode == "head" else "labels"
        return _json(
            {
                "results": results,
                "scoring": scoring,
                "total_ms": round(total, 3),
                "queue_ms": q_ms,
                "inference_ms": i_ms,
            },
            headers={
                "x-total-time": str(int(round(total))),
                "x-queue-time": str(int(round(q_ms))),
                "x-inference-time": str(int(round(i_ms))),
            },
        )

    async def tei_predict(self, request: Any, t0: float) -> Any:
        """text-embeddings-inference's /predict (and Hugging Face's InferenceClient, which posts
        `{"inputs", "parameters"}` to its base URL): one list of {label, score}, best first, per
        input; a single string is answered as a list holding its one list."""
        data = await self.admit(request)
        texts, single, task, raw_scores, top_k = _check_tei(data, self.opts)
        names = ["inputs"] if single else [f"inputs[{i}]" for i in range(len(texts))]
        ans = await self.compute(request, t0, texts, task, names, "inputs", '"truncate": true')
        out = []
        for p in ans.predictions:
            vals = p.scores if raw_scores else p.probs
            ranked = sorted(({"label": lab, "score": float(v)} for lab, v in vals.items()), key=lambda d: -d["score"])
            out.append(ranked[:top_k] if top_k else ranked)
        return _json(out)

    async def vllm_classify(self, request: Any, t0: float) -> Any:
        return await self.vllm_answer(request, t0, await self.admit(request))

    async def vllm_answer(self, request: Any, t0: float, data: Any) -> Any:
        """vLLM's classification API: `{"model", "input": str | [str]}` -> `{"id", "object": "list",
        "created", "model", "data": [{"index", "label", "probs", "num_classes"}], "usage"}`; `probs`
        in the task's label order. `model` is accepted as any name (one model per server) and the
        answer names the served one."""
        import uuid

        texts, single, task = _check_vllm(data, self.opts)
        names = ["input"] if single else [f"input[{i}]" for i in range(len(texts))]
        ans = await self.compute(request, t0, texts, task, names, "input", '"truncate_prompt_tokens": -1')
        labels = list(ans.classifier.labels)
        rows = []
        for i, p in enumerate(ans.predictions):
            row: dict[str, Any] = {
                "index": i,
                "label": p.label,
                "probs": [float(p.probs[lab]) for lab in labels],
                "num_classes": len(labels),
            }
            if p.abstained:
                row["abstained"] = True
            rows.append(row)
        n = sum(p.n_tokens for p in ans.predictions)
        return _json(
            {
                "id": f"classify-{uuid.uuid4().hex}",
                "object": "list",
                "created": int(time.time()),
                "model": self.served_name(),
                "data": rows,
                "usage": {"prompt_tokens": n, "total_tokens": n, "completion_tokens": 0, "prompt_tokens_details": None},
            }
        )

    # ---------------------------------------------------------------- model records
    async def model_info(self, request: Any) -> Any:
        if (e := self.guard(request)) is not None:
            return _error_response(e)
        import mlx.core as mx

        service, opts = self.service, self.opts
        ld = service.loaded
        clf = ld.clf  # type: ignore[union-attr]
        cal, conf = service.calibration_for(service.default_key)
        return _json(
            {
                "model": ld.model,  # type: ignore[union-attr]
                "path": str(clf.path) if clf.path else None,
                "weights_sha256": ld.weights_sha256,  # type: ignore[union-attr]
                "dtype": clf.engine.compute_dtype,
                "device": str(mx.default_device()),
                "max_length": clf.max_length,
                "task": {
                    "labels": list(clf.labels),
                    "system": clf.format.system,
                    "template": clf.format.template,
                    "examples": len(clf.format.examples),
                    "scoring": clf.mode,
                    "truncate": clf.truncate,
                    "calibration": cal.kind,
                    "min_confidence": conf,
                    "warmup": cal.warmup,
                },
                "limits": {
                    "max_batch_items": opts.max_batch_items,
                    "max_batch_tokens": opts.max_batch_tokens or clf.max_batch_tokens,
                    "max_wait_ms": opts.max_wait_ms,
                    "max_queue_items": opts.max_queue_items,
                    "max_items_per_request": opts.max_items_per_request,
                    "max_body_bytes": opts.max_body_bytes,
                    "request_timeout_s": opts.request_timeout_s,
                },
            }
        )

    async def tei_info(self, request: Any) -> Any:
        """text-embeddings-inference's /info, for a sequence classifier."""
        from . import __version__

        if (e := self.guard(request)) is not None:
            return _error_response(e, "tei")
        ld, opts = self.service.loaded, self.opts
        clf = ld.clf  # type: ignore[union-attr]
        labels = list(clf.labels)
        return _json(
            {
                "model_id": self.served_name(),
                "model_sha": ld.weights_sha256,  # type: ignore[union-attr]
                "model_dtype": clf.engine.compute_dtype,
                "model_type": {
                    "classifier": {
                        "id2label": {str(i): lab for i, lab in enumerate(labels)},
                        "label2id": {lab: i for i, lab in enumerate(labels)},
                    }
                },
                "max_concurrent_requests": opts.max_queue_items,
                "max_input_length": clf.max_length,
                "max_batch_tokens": opts.max_batch_tokens or clf.max_batch_tokens,
                "max_batch_requests": opts.max_batch_items,
                "max_client_batch_size": opts.max_items_per_request,
                "auto_truncate": clf.truncate is not None,
                "tokenization_workers": 1,
                "version": __version__,
                "sha": None,
                "docker_label": None,
            }
        )

    async def vllm_models(self, request: Any) -> Any:
        """The OpenAI/vLLM model list: the one model this server serves."""
        if (e := self.guard(request)) is not None:
            return _error_response(e, "openai")
        clf = self.service.loaded.clf  # type: ignore[union-attr]
        name = self.served_name()
        return _json(
            {
                "object": "list",
                "data": [
                    {
                        "id": name,
                        "object": "model",
                        "created": self.started,
                        "owned_by": "mlx-slm",
                        "root": str(clf.path) if clf.path else name,
                        "parent": None,
                        "max_model_len": clf.max_length,
                        "labels": list(clf.labels),
                    }
                ],
            }
        )

    # ---------------------------------------------------------------- open routes and Starlette's errors
    async def health(self, request: Any) -> Any:
        service = self.service
        if service.load_error:
            return _json({"status": "failed", "error": service.load_error}, status=503)
        if service.draining:
            return _json({"status": "draining"}, status=503)
        if not service.ready:
            return _json({"status": "loading"}, status=503)
        return _json({"status": "ok"})

    async def metrics_route(self, request: Any) -> Any:
        from starlette.responses import PlainTextResponse

        return PlainTextResponse(self.service.metrics_text(), media_type="text/plain; version=0.0.4")

    async def openapi(self, request: Any) -> Any:
        return _json(OPENAPI)

    async def starlette_error(self, request: Any, exc: Any) -> Any:
        """Unknown routes (404), wrong methods (405) and any other HTTP error Starlette raises:
        the same JSON error shape as everywhere else."""
        status = getattr(exc, "status_code", 500)
        path = request.url.path
        if status == 404:
            msg = f"no route {path}: see /openapi.json for the routes this server has"
        elif status == 405:
            allow = (getattr(exc, "headers", None) or {}).get("Allow", "")
            msg = f"{request.method} is not allowed on {path}" + (f": use {allow}" if allow else "")
        else:
            msg = str(getattr(exc, "detail", "")) or "HTTP error"
        err = HTTPError(status, msg, headers=dict(getattr(exc, "headers", None) or {}))
        return _error_response(err, "tei" if path in ("/", "/predict", "/info") else "ours")


def create_app(service: Service, *, start_worker: bool = True) -> Any:
    """The Starlette app over `service` (its lifespan starts and stops the worker)."""
    from contextlib import asynccontextmanager

    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.exceptions import HTTPException as StarletteHTTPException
    from starlette.routing import Route

    r = _Routes(service)
    tei_predict = r.endpoint(r.tei_predict, "tei")

    @asynccontextmanager
    async def lifespan(app: Any):  # type: ignore[no-untyped-def]
        if start_worker and service.thread is None:
            service.start()
        try:
            yield
        finally:
            await run_in_threadpool(service.stop)

    return Starlette(
        routes=[
            Route("/v1/classify", r.endpoint(r.classify), methods=["POST"]),
            Route("/classify", r.endpoint(r.vllm_classify, "openai"), methods=["POST"]),
            Route("/predict", tei_predict, methods=["POST"]),
            Route("/", tei_predict, methods=["POST"]),
            Route("/info", r.tei_info, methods=["GET"]),
            Route("/v1/models", r.vllm_models, methods=["GET"]),
            Route("/v1/model", r.model_info, methods=["GET"]),
            Route("/health", r.health, methods=["GET"]),
            Route("/metrics", r.metrics_route, methods=["GET"]),
            Route("/openapi.json", r.openapi, methods=["GET"]),
        ],
        lifespan=lifespan,
        exception_handlers={StarletteHTTPException: r.starlette_error},
    )


# --------------------------------------------------------------------------- running it


def bind_socket(host: str, port: int) -> Any:
    """The listening socket, bound before anything starts (as uvicorn would bind it), so that a
    port in use or an address that is not ours is one `UserError` line (exit 2), not uvicorn's
    log and exit 3 after the model thread has started."""
    import socket

    from .errors import UserError

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family=family)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn: not SO_REUSEPORT
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            why = "the port is in use by another process (find it with `ss -ltnp`): stop it, or choose another --port"
        elif e.errno == errno.EACCES:
            why = "permission denied (ports under 1024 need privileges): choose a port of 1024 or more"
        elif isinstance(e, socket.gaierror) or e.errno == errno.EADDRNOTAVAIL:
            why = "that address is not one of this machine's: use 127.0.0.1, 0.0.0.0 or an address it has"
        else:
            why = f"{e.strerror or e}: check --host and --port"
        raise UserError(f"cannot listen on {host}:{port}: {why}") from None
    sock.set_inheritable(True)
    return sock


def run_server(
    service: Service, host: str = "127.0.0.1", port: int = 8080, log_level: str = "warning", sock: Any = None
) -> int:
    """Serve until SIGINT, or SIGTERM then drain; returns the exit status (0 after a drain).

    `sock`: a socket from `bind_socket` (else one is bound here, before the worker starts)."""
    import uvicorn

    if sock is None:
        sock = bind_socket(host, port)
    app = create_app(service)
    config = uvicorn.Config(
        app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=5, lifespan="on", access_log=False
    )
    server = _draining_server(config, service)
    failed: list[str] = []

    def fatal(msg: str) -> None:
        failed.append(msg)
        server.should_exit = True

    service.on_fatal = fatal
    server.run(sockets=[sock])
    if failed:
        raise RuntimeError(failed[0])
    return 0


def _draining_server(config: Any, service: Service) -> Any:
    """uvicorn's server with SIGTERM as a drain: 503 to new requests, accepted ones finished
    within the drain timeout, then a normal exit (status 0: the signal is not re-raised).
    A second SIGTERM, or SIGINT, is uvicorn's own shutdown."""
    import uvicorn

    class DrainingServer(uvicorn.Server):
        def __init__(self) -> None:
            super().__init__(config)
            self._drain_started = False

        def handle_exit(self, sig: int, frame: Any) -> None:
            if sig == signal.SIGTERM and not self._drain_started:
                self._drain_started = True
                service.begin_drain()
                threading.Thread(target=self._drain, name="mlx-slm-drain", daemon=True).start()
                return
            super().handle_exit(sig, frame)

        def _drain(self) -> None:
            if not service.wait_idle(service.opts.drain_timeout_s):
                service.abort_pending()
                service.wait_idle(2.0)
            self.should_exit = True

    return DrainingServer()


def api_key_from_env(given: str | None) -> str | None:
    return given or os.environ.get(API_KEY_ENV) or None


__all__ = [
    "HTTPError",
    "Loaded",
    "Metrics",
    "ServeOptions",
    "Service",
    "ServiceError",
    "TaskSpec",
    "classifier_loader",
    "create_app",
    "http_error",
    "run_server",
    "validate_request",
]
