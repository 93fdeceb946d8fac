"""HTTP errors: our `HTTPError` (a status, the field at fault, headers, the outcome counted
in /metrics), its JSON body in each API's style, and the one table from the core's errors
to statuses (`http_error`). A new core error kind needs its line in `_STATUS`, or answers as the
nearest kind it derives from (its class hierarchy is read: a subclass of `TimedOut` is a 504)."""

from __future__ import annotations

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
)


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
        self.code: str | None = None  # OpenAI's error code ("model_not_found"), on the OpenAI routes
        # System One's validation errors: each (loc after "body", msg, type); None: one from `field`
        self.details: list[tuple[tuple[Any, ...], str, str]] | None = None
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
        with OpenAI's `type`, `param` and `code` added; on OpenAI's chat routes ("oai") OpenAI's own."""
        msg = _printable(self.message)
        if style == "systemone":
            return self._systemone(msg)
        if style == "oai":  # OpenAI's own, on its chat routes: {"error": {"message", "type", "param", "code"}}
            kind = "invalid_request_error" if self.status < 500 else "server_error"
            field = None if self.field is None else _printable(self.field)
            return {"error": {"message": msg, "type": kind, "param": field, "code": self.code}}
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

    def _systemone(self, msg: str) -> dict[str, Any]:
        """System One's (FastAPI's) shapes: a 422 `{"detail": [{"loc": ["body", ...], "msg", "type"}]}`,
        any other status `{"detail": {"error_type", "message"}}`."""
        if self.status == 422:
            details = self.details or [((self.field,) if self.field not in (None, "body") else (), msg, "value_error")]
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
        kind = self.code or _SYSTEMONE_ERROR_TYPES.get(
            self.status, "unknown" if self.status >= 500 else "invalid_request_error"
        )
        return {"detail": {"error_type": kind, "message": msg}}


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


def http_error(e: ServiceError | HTTPError) -> HTTPError:
    """The HTTP answer to an error: the core's mapped by `_STATUS` (Retry-After from its
    `retry_after`); ours (auth, body, validation) as it is."""
    if isinstance(e, HTTPError):
        return e
    status, outcome = next(_STATUS[k] for k in type(e).__mro__ if k in _STATUS)
    headers = {"Retry-After": str(e.retry_after)} if e.retry_after is not None else None
    return HTTPError(status, e.message, e.field, headers, outcome)


def error_response(e: HTTPError, style: str = "ours") -> Any:
    """The error as a JSON response in a route's style (ours, "tei", "openai", "oai" or "systemone")."""
    from starlette.responses import JSONResponse

    return JSONResponse(e.body(e.style or style), status_code=e.status, headers=e.headers)


def json_response(content: Any, headers: dict[str, str] | None = None, status: int = 200) -> Any:
    from starlette.responses import JSONResponse

    return JSONResponse(content, status_code=status, headers=headers)
