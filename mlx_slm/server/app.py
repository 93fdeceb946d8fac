"""The Starlette app: the routes of every wire API over one `Service`, its lifespan (the
worker starts and stops with it) and Starlette's own errors (404, 405) in our JSON shape."""

from __future__ import annotations

from typing import Any

from ..service import Service
from .common import RouteContext
from .decisions import DECISION_PATHS, DecisionRoutes
from .embed import EmbedRoutes
from .errors import HTTPError, error_response
from .openai import CHAT_PATHS, OpenAIRoutes
from .ours import OurRoutes
from .rerank import RerankRoutes
from .systemone import SYSTEMONE_PATHS, SystemOneRoutes
from .tei import TEI_PATHS, TEIRoutes
from .vllm import VLLMRoutes


async def starlette_error(request: Any, exc: Any) -> Any:
    """Unknown routes (404), wrong methods (405) and any other HTTP error Starlette raises:
    the same JSON error shape as everywhere else."""
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
    err = HTTPError(status, msg, headers=headers)
    if path in SYSTEMONE_PATHS:
        style = "systemone"
    elif path in CHAT_PATHS or path in DECISION_PATHS:
        style = "oai"
    else:
        style = "tei" if path in TEI_PATHS else "ours"
    return error_response(err, style)


def create_app(service: Service, *, start_worker: bool = True) -> Any:
    """The Starlette app over `service` (its lifespan starts and stops the worker)."""
    from contextlib import asynccontextmanager

    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.exceptions import HTTPException as StarletteHTTPException

    ctx = RouteContext(service)
    vllm = VLLMRoutes(ctx)
    routes = OurRoutes(ctx, vllm).routes() + TEIRoutes(ctx).routes() + vllm.routes() + RerankRoutes(ctx).routes()
    routes += OpenAIRoutes(ctx).routes()
    routes += EmbedRoutes(ctx).routes()
    routes += SystemOneRoutes(ctx).routes() + DecisionRoutes(ctx).routes()

    @asynccontextmanager
    async def lifespan(app: Any):  # type: ignore[no-untyped-def]
        if start_worker and service.thread is None:
            service.start()
        try:
            yield
        finally:
            await run_in_threadpool(service.stop)

    return Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={StarletteHTTPException: starlette_error},
    )
