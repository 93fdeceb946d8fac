"""System One's typed decisions (TypeSafe's Jev API): POST /v1/systemone.

    {"model", "state": str | object | array, "questions": {id: {"type": "noul"|"choice"|"score", ...}}}
    -> {"model", "answers": {id: answer}, "usage": {"input_tokens", "output_tokens"}, "x_...": ...}

The body is read as `text.decisions.systemone.parse_systemone` reads it (every bad-input case there, each
naming its field), and answered by the service's `decide` path: the request is one item of the
scheduler's queue, so decision requests share its bound, deadlines and micro-batches with every
other route; the state's tokens run once and each question is a branch after them. Each answer
is `text.decisions.answers.answer`'s System One shape (TypeSafe's confidence formulas); an answer
that a served task's fitted method or the server's own (`--decision-style`, `--decision-permute`,
`--decision-calibrate`) made carries `x_method` and `x_raw_probabilities` (or `x_raw_noul`).

Errors are System One's (FastAPI's) shapes: validation 422 `{"detail": [{"loc": ["body", ...],
"msg", "type"}]}` (a state or question over the model's context: type `tokens_exceeded`), any
other `{"detail": {"error_type", "message"}}`: 401 `authentication_error`, 404 for a model this
server does not serve, 413 over the body limit (compressed or decoded), 429 / 503 / 504 as every
route. Unknown top-level fields are ignored (System One's clients add their own); extra answer
fields would carry the `x_` prefix, as the API asks.
"""

from __future__ import annotations

import time
from typing import Any

from ..service import ServiceError
from ..text.decisions.answers import answer
from ..text.decisions.errors import DecisionError, DecisionErrors
from ..text.decisions.systemone import parse_systemone
from .auth import check_auth
from .checks import parse_body, read_body
from .common import RouteContext
from .errors import HTTPError, Style, http_error, json_response

SYSTEMONE_PATHS = ("/v1/systemone",)


def validation_error(e: DecisionError) -> HTTPError:
    """A `DecisionError` (or several) as System One's 422, each naming its place in the body."""
    errs = list(e.errors) if isinstance(e, DecisionErrors) else [e]

    def after_body(loc: tuple[Any, ...]) -> tuple[Any, ...]:  # the leading "body" only: a question may be named body
        return loc[1:] if loc[:1] == ("body",) else loc

    details = [(after_body(d.loc), d.msg, d.type) for d in errs]
    return HTTPError(422, errs[0].msg, ".".join(map(str, details[0][0])) or "body", outcome="invalid", details=details)


def _no_images(fld: str) -> HTTPError:
    msg = "images (assets) are not supported by this server, which reads text only: send the state as text or JSON"
    return HTTPError(422, msg, fld, outcome="invalid", details=[((fld,) if fld != "body" else (), msg, "images")])


class SystemOneRoutes:
    """POST /v1/systemone over the service."""

    def __init__(self, ctx: RouteContext):
        self.ctx = ctx

    def routes(self) -> list[Any]:
        return [self.ctx.post(p, self.systemone, Style.SYSTEMONE) for p in SYSTEMONE_PATHS]

    async def systemone(self, request: Any, t0: float) -> Any:
        """One System One request (see the module docstring)."""
        ctx = self.ctx
        check_auth(request, ctx.opts.api_key)
        ctx.service.require_ready()
        if request.headers.get("content-type", "").lower().startswith("multipart/"):
            raise _no_images("body")  # typesafe-sdk sends images (assets) as multipart/form-data
        data = parse_body(await read_body(request, ctx.opts.max_body_bytes))
        if isinstance(data, dict) and data.get("assets"):
            raise _no_images("assets")
        config = await ctx.decision_settings(data, "jev-latest")
        try:
            req = parse_systemone(data, config)
        except DecisionError as e:
            raise validation_error(e) from None
        try:
            result = await ctx.decide(request, t0, req)
        except DecisionError as e:  # a state or question over the model's context: tokens_exceeded
            raise validation_error(e) from None
        except ServiceError as e:
            err = http_error(e)
            if err.status == 422:  # the core's Invalid: the request cannot run (over the context)
                details = [(tuple(str(e.field or "state").split(".")), e.message, "tokens_exceeded")]
                err = HTTPError(422, err.message, err.field, err.headers, err.outcome, details=details)
            raise err from None
        over = [q.key for q, p in zip(req.questions, result.probabilities) if p is None]
        if over:  # System One answers a request whole or not at all
            why = "the state and this question are over the model's context: shorten the state or the question"
            details = [(("questions", k), why, "tokens_exceeded") for k in over]
            raise HTTPError(422, "over the model's context", "questions", outcome="invalid", details=details)
        return json_response(self.answer(req, result, t0))

    def answer(self, req: Any, result: Any, t0: float) -> dict[str, Any]:
        """System One's response: one answer per question id, in the request's order."""
        raw = result.raw or (None,) * len(req.questions)
        applied = result.applied or (None,) * len(req.questions)
        answers = {
            q.key: answer(q, p, "systemone", r, a)
            for q, p, r, a in zip(req.questions, result.probabilities, raw, applied)
        }
        return {
            "model": self.ctx.served_name(),
            "answers": answers,
            "usage": {"input_tokens": int(result.input_tokens), "output_tokens": 0},
            "x_cached_tokens": int(result.cached_tokens),
            "x_total_ms": round((time.perf_counter() - t0) * 1000, 3),
        }
