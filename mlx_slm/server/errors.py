"""HTTP errors: our `HTTPError` (a status, the field at fault, headers, the outcome counted
in /metrics), its JSON body in each API's `Style` (an enum a route chooses once), and the one
table from the core's errors to statuses (`http_error`). A new core error kind needs its line in
`_STATUS`, or answers as the nearest kind it derives from (its class hierarchy is read: a
subclass of `TimedOut` is a 504)."""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from typing import Any

from ..service import (
    Aborted,
    ClientGone,
    Draining,
    Failed,
    Invalid,
    NotReady,
    NotSupported,
    QueueFull,
    ServiceError,
    TimedOut,
    TooLarge,
    TooSlow,
)


class Style(Enum):
    """How a route writes its errors: chosen once, where the route is declared
    (`RouteContext.post`/`get`), and read by every error the route answers (its handler's, the
    core's, Starlette's own 404 and 405 on its path)."""

    OURS = "ours"  # {"error": {"status", "message", "field"}}
    TEI = "tei"  # text-embeddings-inference's {"error": message, "error_type"} (what its clients read)
    VLLM = "vllm"  # ours with OpenAI's `type`, `param` and `code` added (vLLM's /classify, rerank, embeddings)
    OPENAI = "openai"  # OpenAI's own {"error": {"message", "type", "param", "code"}}: a 422 as its 400
    SYSTEMONE = "systemone"  # System One's (FastAPI's) {"detail": ...}

    @property
    def of_framework(self) -> Style:
        """The style of Starlette's own errors (404, 405) on a path of this style: vLLM's routes
        answer them in ours, as they always have."""
        return Style.OURS if self is Style.VLLM else self

    def status(self, e: HTTPError) -> int:
        """The status the error answers with: OpenAI's routes say a request they cannot take
        (our 422: a field's value) with OpenAI's 400."""
        return 400 if self is Style.OPENAI and e.status == 422 else e.status

    def body(self, e: HTTPError) -> dict[str, Any]:
        """The error's JSON body in this style."""
        return _BODIES[self](e, _printable(e.message))


class HTTPError(Exception):
    """An HTTP error answer: status, message, the field at fault, headers, the outcome counted in
    /metrics; `style` when it answers in another style than its route's (a vLLM body on
    /v1/classify: `http_error(e, Style.VLLM)`), `code` (the client's error code: System One's
    error_type, `not_found_error`) and `details` (System One's validation errors: each (loc after
    "body", msg, type); None: one from `field`). Made whole, never changed after."""

    def __init__(
        self,
        status: int,
        message: str,
        field: str | None = None,
        headers: dict[str, str] | None = None,
        outcome: str | None = None,
        style: Style | None = None,
        code: str | None = None,
        details: list[tuple[tuple[Any, ...], str, str]] | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.field, self.headers = status, message, field, headers or {}
        self.style, self.code, self.details = style, code, details
        self.outcome = outcome or {
            401: "unauthorized",
            413: "too_large",
            422: "invalid",
            429: "overloaded",
            503: "unavailable",
            504: "timeout",
        }.get(status, "error")

    def body(self, style: Style | str = Style.OURS) -> dict[str, Any]:
        """The JSON error in `style` (a `Style`, or its value)."""
        return Style(style).body(self)

    def restyled(self, style: Style) -> HTTPError:
        """This error answered in `style` instead of its route's (a new error; this one unchanged)."""
        return HTTPError(
            self.status, self.message, self.field, self.headers, self.outcome, style, self.code, self.details
        )


def _ours(e: HTTPError, msg: str, extra: bool = False) -> dict[str, Any]:
    err: dict[str, Any] = {"status": e.status, "message": msg}
    if e.field is not None:
        err["field"] = _printable(e.field)
    if extra:  # vLLM's: OpenAI's type, param and code beside ours
        err.update(
            type="invalid_request_error" if 400 <= e.status < 500 else "server_error",
            param=err.get("field"),
            code=e.status,
        )
    return {"error": err}


def _openai(e: HTTPError, msg: str) -> dict[str, Any]:
    status = Style.OPENAI.status(e)
    kind = "invalid_request_error" if status < 500 else "server_error"
    field = None if e.field is None else _printable(e.field)
    return {"error": {"message": msg, "type": kind, "param": field, "code": _OPENAI_CODES.get(status)}}


def _tei(e: HTTPError, msg: str) -> dict[str, Any]:
    return {"error": msg, "error_type": _TEI_ERROR_TYPES.get(e.status, "Backend")}


def _systemone(e: HTTPError, msg: str) -> dict[str, Any]:
    """System One's (FastAPI's) shapes: a 422 `{"detail": [{"loc": ["body", ...], "msg", "type"}]}`,
    any other status `{"detail": {"error_type", "message"}}`."""
    if e.status == 422:
        details = e.details or [((e.field,) if e.field not in (None, "body") else (), msg, "value_error")]
        return {
            "detail": [
                {
                    "loc": ["body", *(_printable(x) if isinstance(x, str) else x for x in loc)],
                    "msg": _printable(m),
                    "type": t,
                }
                for loc, m, t in details
            ]
        }
    kind = e.code or _SYSTEMONE_ERROR_TYPES.get(e.status, "unknown" if e.status >= 500 else "invalid_request_error")
    return {"detail": {"error_type": kind, "message": msg}}


_BODIES: dict[Style, Callable[[HTTPError, str], dict[str, Any]]] = {
    Style.OURS: _ours,
    Style.VLLM: lambda e, msg: _ours(e, msg, extra=True),
    Style.OPENAI: _openai,
    Style.TEI: _tei,
    Style.SYSTEMONE: _systemone,
}

# OpenAI's error codes, by status (None: OpenAI's `code` is null for a plain bad request).
_OPENAI_CODES = {401: "invalid_api_key", 404: "model_not_found", 429: "rate_limit_exceeded", 503: "service_unavailable"}

# System One's error_type by status (its adapter spec names authentication_error, timeout, tokens_exceeded, unknown).
_SYSTEMONE_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "authentication_error",
    404: "not_found_error",
    405: "method_not_allowed",
    413: "request_too_large",
    415: "unsupported_media_type",
    429: "rate_limit_error",
    499: "client_gone",
    503: "overloaded_error",
    504: "timeout",
}

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
    TooLarge: (413, "too_large"),
    TooSlow: (413, "too_large"),  # cannot finish within --request-timeout even alone: never the 504 clients retry
    NotSupported: (400, "invalid"),
    QueueFull: (429, "overloaded"),
    NotReady: (503, "unavailable"),
    Draining: (503, "unavailable"),
    Aborted: (503, "unavailable"),
    TimedOut: (504, "timeout"),
    ClientGone: (499, "client_gone"),
    Failed: (500, "error"),
    ServiceError: (500, "error"),  # a kind of none of these: a bug of ours, answered as one
}


def http_error(e: ServiceError | HTTPError, style: Style | None = None) -> HTTPError:
    """The HTTP answer to an error: the core's mapped by `_STATUS` through its class hierarchy
    (the nearest class with a line: a subclass of `TimedOut` is a 504; Retry-After from its
    `retry_after`); ours (auth, body, validation) as it is. `style`: answered in that style
    instead of the route's."""
    if isinstance(e, HTTPError):
        return e if style is None else e.restyled(style)
    status, outcome = next(_STATUS[k] for k in type(e).__mro__ if k in _STATUS)
    headers = {"Retry-After": str(e.retry_after)} if e.retry_after is not None else None
    return HTTPError(status, e.message, e.field, headers, outcome, style)


def error_response(e: HTTPError, style: Style = Style.OURS) -> Any:
    """The error as a JSON response in its route's `style` (or its own, `HTTPError.style`)."""
    from starlette.responses import JSONResponse  # lazy: starlette is the serve extra's

    style = e.style or style
    return JSONResponse(style.body(e), status_code=style.status(e), headers=e.headers)


def json_response(content: Any, headers: dict[str, str] | None = None, status: int = 200) -> Any:
    from starlette.responses import JSONResponse  # lazy: starlette is the serve extra's

    return JSONResponse(content, status_code=status, headers=headers)
