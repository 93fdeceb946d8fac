"""Our own API: POST /v1/classify (a body with vLLM's `input` is answered as vLLM's /classify),
GET /v1/model, and the open routes /health, /metrics and /openapi.json."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import mlx.core as mx

from ..files.output import result_record
from ..service import ServiceError
from ..text.decisions.methods import Methods
from .checks import check_request
from .common import RouteContext
from .errors import HTTPError, Style, http_error, json_response
from .openapi import OPENAPI
from .vllm import VLLMRoutes


def model_head(clf: Any) -> dict[str, Any]:
    """Which head the model has: its sequence-classification score head (architecture, labels,
    problem type, function), or the LM head of a causal LM."""
    own = getattr(clf.engine.model, "seqcls", None)
    if own is None:
        return {"kind": "lm" if getattr(clf.engine.model, "has_lm_head", True) else "none (a bare backbone: it embeds)"}
    return {"kind": "seqcls", **own.to_dict()}


def decision_methods(plan: Any) -> Any:
    """What `GET /v1/model` says of how decisions are answered, always in one shape: the server's
    default method (the raw letters: calibration "none") and each saved one (none: []), with the
    rule that applies it."""
    methods = plan.methods if plan is not None else Methods()
    saved = [{"key": m.key, "digest": m.digest, **m.record()} for m in methods.saved.values()]
    return {
        "default": methods.default.record(),
        "questions": saved,
        "applies_to": "a question asked with the same type, instructions, options and descriptions (its digest), "
        "on either route and under any id; another question gets the default",
    }


class OurRoutes:
    """Our routes over the service; `vllm` answers a vLLM body sent to /v1/classify."""

    def __init__(self, ctx: RouteContext, vllm: VLLMRoutes):
        self.ctx, self.vllm = ctx, vllm

    def routes(self) -> list[Any]:
        ctx = self.ctx
        return [
            ctx.post("/v1/classify", self.classify),
            ctx.get("/v1/model", self.model_info),
            ctx.get("/health", self.health, guarded=False),
            ctx.get("/metrics", self.metrics_route, guarded=False),
            ctx.get("/openapi.json", self.openapi, guarded=False),
        ]

    async def classify(self, request: Any, t0: float) -> Any:
        """Our /v1/classify; a body with vLLM's `input` gets vLLM's answer (as vLLM serves it)."""
        data = await self.ctx.admit(request)
        if isinstance(data, dict) and "input" in data and not {"text", "texts"} & set(data):
            try:
                return await self.vllm.answer(request, t0, data)
            except (HTTPError, ServiceError) as e:
                raise http_error(e, Style.VLLM) from None
        if isinstance(data, dict) and "inputs" in data and not {"text", "texts"} & set(data):
            raise HTTPError(
                422,
                "'inputs' is text-embeddings-inference's field: POST that body to /predict (TEI's answer), "
                "or send 'text'/'texts' here",
                "inputs",
            )
        texts, ids, task = check_request(data, self.ctx.opts)  # an item may be a (text, text_pair) pair
        names = ["text"] if "text" in data else [f"texts[{i}]" for i in range(len(texts))]
        whole = "texts" if len(texts) > 1 else "text"
        ans = await self.ctx.compute(request, t0, texts, task, names, whole, '"truncate": "head"|"tail"|"middle"')

        results = []
        for i, pr in enumerate(ans.predictions):
            rec = result_record(SimpleNamespace(id=ids[i], line=None, error=None), pr, ans.calibration.method)
            _, q, inf = ans.raw[i]
            rec["queue_ms"], rec["inference_ms"] = round(q * 1000, 3), round(inf * 1000, 3)
            results.append(rec)
        total = (time.perf_counter() - t0) * 1000
        q_ms = max(r["queue_ms"] for r in results)
        i_ms = max(r["inference_ms"] for r in results)
        # A head task answers a request with its own labels or prompt by label scoring: say which ran
        # (the kind's name: labels, head, questions, seqcls or rerank).
        scoring = ans.classifier.spec.name
        return json_response(
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

    async def model_info(self, request: Any) -> Any:
        service, opts = self.ctx.service, self.ctx.opts
        ld = service.loaded
        clf = ld.clf  # type: ignore[union-attr]
        cal, conf = service.calibration_for(service.default_key)
        return json_response(
            {
                "model": ld.model,  # type: ignore[union-attr]
                "path": str(clf.path) if clf.path else None,
                "weights_sha256": ld.weights_sha256,  # type: ignore[union-attr]
                "dtype": clf.engine.compute_dtype,
                "device": str(mx.default_device()),
                "max_length": clf.max_length,
                "head": model_head(clf),
                "reranker": self._reranker(),
                "embeddings": self._embeddings(),
                "decisions": {
                    "routes": ["/v1/systemone", "/v1/decisions"],
                    "names": self.ctx.model_names(),
                    # how the routes answer: the server's own style, orders and prior (the raw letters by
                    # default), and the served task's fitted and trained questions (by digest; none: [])
                    "calibration": decision_methods(ld.decision_plan),  # type: ignore[union-attr]
                    "state_cache": opts.state_cache,
                },
                "task": {
                    **clf.spec.info(),  # the kind's: its labels (and questions)
                    "system": clf.format.system,
                    "template": clf.format.template,
                    "examples": len(clf.format.examples),
                    "scoring": clf.mode,
                    "truncate": clf.truncate,
                    "calibration": cal.method,
                    "min_confidence": conf,
                    "warmup": cal.warmup,
                },
                "limits": {
                    "max_batch_items": opts.max_batch_items,
                    "max_batch_tokens": opts.max_batch_tokens or clf.batching.max_batch_tokens,
                    "max_wait_ms": opts.max_wait_ms,
                    "max_queue_items": opts.max_queue_items,
                    "max_items_per_request": opts.items_limit[0],
                    "max_body_bytes": opts.max_body_bytes,
                    "request_timeout_s": opts.request_timeout_s,
                },
            }
        )

    def _reranker(self) -> dict[str, Any]:
        """What the rerank routes run: the reranker's settings, or why the model has none."""
        try:
            return self.ctx.service.tasks.reranker().info()["rerank"]
        except ServiceError as e:
            return {"scorer": None, "why": e.message}

    def _embeddings(self) -> dict[str, Any]:
        """What the embedding routes run: the model folder's pooling, or why the model does not embed."""
        try:
            return self.ctx.service.tasks.pooling().info()
        except ServiceError as e:
            return {"pooling": None, "why": e.message}

    async def health(self, request: Any) -> Any:
        """200 `{"status": "ok"}` only while the server answers: 503 while loading, after a failed
        load or a dead worker, while draining, and while the worker is stuck on one micro-batch
        past the request timeout ("stalled", as TEI's /health answers 503 for a backend that
        does not answer), so that a load balancer or Kubernetes takes it out of rotation."""
        service = self.ctx.service
        if service.load_error:
            return json_response({"status": "failed", "error": service.load_error}, status=503)
        if service.draining:
            return json_response({"status": "draining"}, status=503)
        if not service.ready:
            return json_response({"status": "loading"}, status=503)
        stalled = service.stalled()
        if stalled is not None:
            return json_response({"status": "stalled", "error": stalled}, status=503, headers={"Retry-After": "5"})
        return json_response({"status": "ok"})

    async def metrics_route(self, request: Any) -> Any:
        from starlette.responses import PlainTextResponse  # lazy: starlette is the serve extra's

        return PlainTextResponse(self.ctx.service.metrics_text(), media_type="text/plain; version=0.0.4")

    async def openapi(self, request: Any) -> Any:
        return json_response(OPENAPI)
