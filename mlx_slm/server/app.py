"""The Starlette app: the routes of every wire API over one `Service`, its lifespan (the
worker starts and stops with it) and Starlette's own errors (404, 405) in our JSON shape, in
the style of the path's route (`RouteContext.framework_error`)."""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import Any

from ..service import Service
from .common import RouteContext
from .decisions import DecisionRoutes
from .embed import EmbedRoutes
from .openai import OpenAIRoutes
from .ours import OurRoutes
from .rerank import RerankRoutes
from .systemone import SystemOneRoutes
from .tei import TEIRoutes
from .vllm import VLLMRoutes


def create_app(service: Service, *, start_worker: bool = True) -> Any:
    """The Starlette app over `service` (its lifespan starts and stops the worker)."""
    from starlette.applications import Starlette  # lazy: starlette is the serve extra's
    from starlette.concurrency import run_in_threadpool  # lazy: as above
    from starlette.exceptions import HTTPException as StarletteHTTPException  # lazy: as above

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
        exception_handlers={StarletteHTTPException: ctx.framework_error},
    )
