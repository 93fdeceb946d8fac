"""`mlx-slm serve`: the HTTP layer over the service core (the `service` package), as TEI's
router over its core.

    request handler (event loop)                 the core (`Service`)
    auth, size limits, JSON checks   -->  classify: task cache, tokenize, bounded queue, micro-batching
    (422 naming the field)                worker, calibration; its own errors (`ServiceError`)
    answer in the route's shape      <--  mapped to statuses here in one table (`http_error`)

    checks.py    the body (size, JSON) and our request's fields; what every wire API shares
    errors.py    `HTTPError`, each API's error `Style` (an enum) and its bodies, the core's errors to statuses
    auth.py      the Bearer key
    openapi.py   the OpenAPI document (every route's entry)
    common.py    `RouteContext`: the steps every route shares (post/get with its style, guard, admit,
                 endpoint, compute, decide)
    ours.py      our API: /v1/classify, /v1/model, /health, /metrics, /openapi.json
    tei.py       text-embeddings-inference's: /predict, /, /info
    vllm.py      vLLM's: /classify, /v1/models
    rerank.py    /rerank (TEI's, or the Cohere/Jina shape as vLLM), /v1/rerank and /v2/rerank (Cohere's)
    systemone.py System One's typed decisions: /v1/systemone (its 422 detail lists, {detail: {error_type}})
    decisions.py OpenAI's Decisions API: /v1/decisions (a refusal per question over the context)
    encoding.py  request bodies with Content-Encoding zstd/gzip/deflate, capped on their decoded size
    app.py       the Starlette app over all of them (`create_app`)
    run.py       binding, uvicorn, SIGTERM as a drain (`run_server`)

Limits answer with JSON errors that name the field: 413 (body size, items or documents per
request, a request's labels or chat choices over `MAX_LABEL_TOKENS` tokens), 422 (invalid or empty fields, prompts over the context), 400 (a rerank on a model
that is no reranker), 429 with Retry-After (the queue
would pass --max-queue-items), 504 (per-request timeout), 401 (Bearer key, when set),
503 (loading, or draining after SIGTERM). A client that goes away has its queued items
dropped before they are computed. SIGTERM: new requests get 503, every accepted request
is finished within --drain-timeout (the queue is answered 503 then; the running micro-batch
finishes), the worker is joined, and the process exits 0. /health is 503 "stalled" while one
micro-batch has run past --request-timeout.

Every client-caused failure is a 4xx with a JSON error (never a 500, never a traceback in
the log): a body that is not UTF-8 JSON, nested too deeply or holding a lone surrogate
(`"\\ud800"`: not encodable text) is 422; a client that leaves while sending its body is
counted as `client_gone` (499, never sent). Every outcome is counted in /metrics
(`mlx_slm_requests_total{outcome=...,route=...}`).

Imports run one way: the server imports the service, never the reverse; the wire API
modules import the shared ones (common, checks, errors), and `app.py` imports the APIs.

May import: ground, text, files, weights, engine, kinds, classifier, jobs, service.
"""

from __future__ import annotations

from ..service import (
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
from .app import create_app
from .auth import API_KEY_ENV, api_key_from_env
from .checks import REQUEST_FIELDS, parse_body, validate_request
from .errors import HTTPError, http_error
from .openapi import OPENAPI
from .run import bind_socket, run_server
from .tei import TEI_FIELDS
from .vllm import VLLM_FIELDS

__all__ = [
    "API_KEY_ENV",
    "OPENAPI",
    "REQUEST_FIELDS",
    "TEI_FIELDS",
    "VLLM_FIELDS",
    "Aborted",
    "Answer",
    "ClientGone",
    "Draining",
    "Failed",
    "HTTPError",
    "Invalid",
    "Loaded",
    "Metrics",
    "NotReady",
    "QueueFull",
    "ServeOptions",
    "Service",
    "ServiceError",
    "TaskSpec",
    "TimedOut",
    "api_key_from_env",
    "bind_socket",
    "classifier_loader",
    "create_app",
    "http_error",
    "parse_body",
    "run_server",
    "validate_request",
]
