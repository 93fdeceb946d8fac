"""The steps every route shares, over one `Service`: auth and readiness (`guard`, `admit`),
the classifying route's wrapper (`endpoint`: every outcome counted, every error a JSON body
in the route's style), and the hand-off to the core (`compute`). The wire APIs (`ours.py`,
`tei.py`, `vllm.py`) are short lists of routes over this."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..service import Answer, Call, Service, ServiceError, TaskSpec
from .auth import check_auth
from .checks import parse_body, read_body
from .errors import HTTPError, Style, error_response, http_error

# The model names the decision clients send by default (typesafe-sdk, jev-lite, openai's docs).
CLIENT_MODEL_NAMES = ("jev-latest", "jev-preview", "gpt-6-luna")


async def until_disconnect(request: Any) -> None:
    while True:
        msg = await request.receive()
        if msg["type"] == "http.disconnect":
            return


class RouteContext:
    """The service, its options and metrics, and the app's start time, with the shared steps.
    Errors, ours and the core's (`http_error`), become JSON bodies in the route's style: each
    route's `Style` is chosen once, where `post` or `get` declares it, and kept by its path
    (`styles`) for Starlette's own errors on it (`framework_error`)."""

    def __init__(self, service: Service):
        self.service, self.opts, self.metrics = service, service.opts, service.metrics
        self.started = int(time.time())
        self.styles: dict[str, Style] = {}  # each route's path: its errors' style

    def post(self, path: str, handler: Callable[..., Any], style: Style = Style.OURS) -> Any:
        """A POST route whose `handler(request, t0)` runs inside `endpoint` (counted; errors in `style`)."""
        from starlette.routing import Route  # lazy: starlette is the serve extra's

        self.styles[path] = style
        return Route(path, self.endpoint(handler, style), methods=["POST"])

    def get(self, path: str, handler: Callable[..., Any], style: Style = Style.OURS, guarded: bool = True) -> Any:
        """A GET route; `guarded`: auth and readiness first (`guard`), its refusal in `style`."""
        from starlette.routing import Route  # lazy: starlette is the serve extra's

        self.styles[path] = style

        async def run(request: Any) -> Any:
            if guarded and (e := self.guard(request)) is not None:
                return error_response(e, style)
            return await handler(request)

        return Route(path, run if guarded else handler, methods=["GET"])

    async def framework_error(self, request: Any, exc: Any) -> Any:
        """Unknown routes (404), wrong methods (405) and any other HTTP error Starlette raises:
        the same JSON error shape as everywhere else, in the style of the path's route."""
        status = getattr(exc, "status_code", 500)
        path = request.url.path
        headers = dict(getattr(exc, "headers", None) or {})
        if status == 404:
            msg = f"no route {path}: see /openapi.json for the routes this server has"
        elif status == 405:
            # Starlette builds Allow from a set: its order changes with the hash seed, so sort it.
            allow = ", ".join(sorted(m.strip() for m in headers.get("Allow", "").split(",") if m.strip()))
            if allow:
                headers["Allow"] = allow
            msg = f"{request.method} is not allowed on {path}" + (f": use {allow}" if allow else "")
        else:
            msg = str(getattr(exc, "detail", "")) or "HTTP error"
        style = self.styles.get(path, Style.OURS).of_framework
        return error_response(HTTPError(status, msg, headers=headers), style)

    def guard(self, request: Any) -> HTTPError | None:
        """Auth and readiness for the read-only model routes; None when they pass."""
        try:
            check_auth(request, self.opts.api_key)
            self.service.require_loaded()
        except (HTTPError, ServiceError) as e:
            return http_error(e)
        return None

    def endpoint(self, handler: Callable[..., Any], style: Style = Style.OURS) -> Callable[..., Any]:
        """A working route: every outcome counted in /metrics, every error a JSON body in the
        route's `style`, a bug of ours one log line and a 500."""
        m = self.metrics

        async def run(request: Any) -> Any:
            t0 = time.perf_counter()
            route = request.url.path  # a route's own path (only matched routes get here)
            try:
                resp = await handler(request, t0)
                m.count_request(route, "ok")
                m.observe("mlx_slm_request_seconds", time.perf_counter() - t0)
                return resp
            except (HTTPError, ServiceError) as e:
                err = http_error(e)
                m.count_request(route, err.outcome)
                return error_response(err, style)
            except Exception as e:  # noqa: BLE001 - a bug of ours: one log line, a counted 500, no ASGI traceback
                logging.getLogger("mlx_slm.server").error(
                    "%s %s failed: %s: %s", request.method, request.url.path, type(e).__name__, e
                )
                m.count_request(route, "error")
                return error_response(HTTPError(500, f"internal error ({type(e).__name__}): please report it"), style)

        return run

    async def admit(self, request: Any) -> Any:
        """Auth, readiness, then the body as JSON (a 4xx naming what is wrong)."""
        check_auth(request, self.opts.api_key)
        self.service.require_ready()
        return parse_body(await read_body(request, self.opts.max_body_bytes))

    async def compute(
        self, request: Any, t0: float, texts: list[Any], task: TaskSpec, names: list[str], whole: str, hint: str
    ) -> Answer:
        """The core's answer to one request's texts (strings, or (text, pair) tuples). `names`: each text's field, for errors;
        `whole`: the field a timeout names; `hint`: how this API asks for truncation."""
        return await self.service.classify(texts, task, self.call(request, t0, names, whole, hint))

    def call(self, request: Any, t0: float, names: list[str], whole: str, hint: str = "") -> Call:
        """The request as the core sees it (`service.Call`): it is gone when the client disconnects."""
        return Call(tuple(names), whole, t0, hint, lambda: until_disconnect(request))

    def one_question(self, route: str, fld: str) -> None:
        """TEI's and vLLM's answers hold one label per text: a served task of several questions
        is answered on our route only (a 422 naming it)."""
        ld = self.service.loaded
        qs = getattr(ld.clf, "questions", None) if ld is not None else None
        if qs is not None:
            raise HTTPError(
                422,
                f"this server's task asks {len(qs)} question(s) per text ({', '.join(q.name for q in qs[:5])}); "
                f'{route} answers one label per text: POST {{"texts": [...]}} to /v1/classify for every answer',
                fld,
            )

    def served_name(self) -> str:
        """The name answers report: the first --served-model-name, else the model as served."""
        if self.opts.served_model_names:
            return self.opts.served_model_names[0]
        ld = self.service.loaded
        return (ld.model if ld is not None and ld.model else None) or "mlx-slm"

    def release_date(self) -> str:
        """System One's `release_date` (YYYY-MM-DD) of the served model: the day its weights were
        written (the folder's newest file), else the day the server started."""
        ld = self.service.loaded
        when = float(self.started)
        path = getattr(ld.clf, "path", None) if ld is not None else None
        try:
            if path:
                when = max((f.stat().st_mtime for f in Path(path).iterdir() if f.is_file()), default=when)
        except OSError:
            pass
        return dt.datetime.fromtimestamp(when, dt.timezone.utc).strftime("%Y-%m-%d")

    async def decision_settings(self, data: Any, also: str) -> Any:
        """A decision request's `model` checked (`check_model`; `also`: the name its client sends
        by default), then the served model's decision settings (`decision_config`)."""
        if isinstance(data, dict) and isinstance(data.get("model"), str):
            self.check_model(data["model"], also)
        return await self.decision_config()

    async def decide(self, request: Any, t0: float, req: Any) -> Any:
        """The core's answer to one decision request (`text.decisions.questions.DecisionRequest`)."""
        return await self.service.decide(req, started=t0, gone=lambda: until_disconnect(request))

    async def decision_config(self) -> Any:
        """The served model's decision settings, off the event loop: the first decision request
        builds the front `Decider` (it takes the front engine's lock and tokenizes)."""
        return await asyncio.get_running_loop().run_in_executor(None, self.service.tasks.decision_config)

    def check_model(self, model: str, also: str = "") -> None:
        """One model per server, under any of its names (`model_names`, the one list every route
        that checks `model` answers to); another: 404 naming them (`also`: the name that route's
        client sends by default)."""
        names = self.model_names()
        if model not in names:
            raise HTTPError(
                404,
                f"the model {model!r} is not served here: ask for {names[0]!r} ("
                + (f"or {also}; " if also else "")
                + "GET /v1/models lists every name)",
                "model",
                outcome="invalid",
                code="not_found_error",
            )

    def model_names(self) -> list[str]:
        """Every name the routes that check `model` answer to (the decision routes, chat
        completions): the served name, each --served-model-name, the
        model's path, and the names the clients send by default (System One's `jev-latest` and
        `jev-preview`, OpenAI's `gpt-6-luna`): one model per server, so they are all this one."""
        ld = self.service.loaded
        names = [self.served_name(), *self.opts.served_model_names]
        if ld is not None:
            names += [ld.model, str(ld.clf.path) if ld.clf.path else ""]
        names += list(CLIENT_MODEL_NAMES)
        return [n for i, n in enumerate(names) if n and n not in names[:i]]
