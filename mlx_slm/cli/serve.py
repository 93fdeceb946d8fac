"""`serve`: the classifier over HTTP (the `server` package), with classify's task options."""

from __future__ import annotations

import sys
from typing import Any

import click

from ..engine.state_cache import STATE_CACHE
from ..files.output import check_run_files, files_read
from ..ground.errors import MissingExtra, UserError
from ..jobs import plan as plans
from ..server import Loaded, ServeOptions, Service, api_key_from_env, bind_socket, run_server
from .base import Command, notice, number, warn_blas
from .decide import method_options
from .options import TASK_OPTION_NAMES, some_task_options, task_settings

# classify's task options, less those about input and output files and the window (the
# worker's micro-batch is its window); the text and gold fields name --calibration-data's.
_SERVE_TASK_OPTIONS = TASK_OPTION_NAMES - {"save_task", "fmt", "id_field", "id_column", "window"}
_CAL_DATA_FIELDS = ("text_field", "text_column", "gold_field")


@click.command(cls=Command, sections={k: "Calibration data" for k in _CAL_DATA_FIELDS})
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on (loopback by default).")
@click.option("--port", default=8080, show_default=True, type=number("port"))
@click.option(
    "--api-key",
    default=None,
    help="Require 'Authorization: Bearer KEY' on /v1/* (default: $MLX_SLM_API_KEY; /health and /metrics stay open).",
)
@click.option(
    "--max-batch-items",
    default=32,
    show_default=True,
    type=number("max_batch_items"),
    help="Items gathered into one micro-batch (1: batching off).",
)
@click.option(
    "--max-wait-ms",
    default=5.0,
    show_default=True,
    type=number("max_wait_ms"),
    help="How long the worker waits for more items once it has one.",
)
@click.option(
    "--max-queue-items",
    default=1024,
    show_default=True,
    type=number("max_queue_items"),
    help="Items waiting, all requests together; beyond that: 429 with Retry-After.",
)
@click.option(
    "--max-items-per-request", default=256, show_default=True, type=number("max_items_per_request"), help="Beyond: 413."
)
@click.option(
    "--max-body-bytes", default=1 << 20, show_default=True, type=number("max_body_bytes"), help="Beyond: 413."
)
@click.option(
    "--request-timeout",
    default=60.0,
    show_default=True,
    type=number("request_timeout"),
    help="Seconds per request, queue included; beyond: 504.",
)
@click.option(
    "--drain-timeout",
    default=30.0,
    show_default=True,
    type=number("drain_timeout"),
    help="SIGTERM: seconds to finish accepted requests before exiting.",
)
@click.option(
    "--task-cache",
    default=8,
    show_default=True,
    type=number("task_cache"),
    help="Per-request tasks (labels/system/template) kept loaded on the one model.",
)
@click.option(
    "--served-model-name",
    "served_model_names",
    multiple=True,
    help="Another name the model answers to (repeatable; the first is the name answers report). The decision "
    "and chat routes also answer to jev-latest and gpt-6-luna, the names the decision clients send by default.",
)
@method_options("decision-", batch=False)
@click.option(
    "--state-cache",
    default=STATE_CACHE,
    show_default=True,
    type=number("state_cache"),
    help="Decisions: recent states whose keys and values are kept, so a state asked again runs only its "
    "questions (0: off).",
)
@click.option(
    "--log-level",
    default="warning",
    show_default=True,
    type=click.Choice(["critical", "error", "warning", "info", "debug"]),
)
@some_task_options(_SERVE_TASK_OPTIONS)
@click.pass_context
def serve(
    ctx: click.Context,
    host: str,
    port: int,
    api_key: str | None,
    max_batch_items: int,
    max_wait_ms: float,
    max_queue_items: int,
    max_items_per_request: int,
    max_body_bytes: int,
    request_timeout: float,
    drain_timeout: float,
    task_cache: int,
    served_model_names: tuple[str, ...],
    state_cache: int,
    log_level: str,
    **o: Any,
) -> None:
    """Serve the classifier over HTTP: POST /v1/classify, GET /v1/model, /health, /metrics;
    TEI's /predict and vLLM's /classify; /rerank, /v1/rerank, /v2/rerank for a reranker
    (--reranker, a one-label sequence classifier, or a model named *Reranker*); typed
    decisions, System One's POST /v1/systemone and OpenAI's POST /v1/decisions (raw
    unless --decision-* or a --task fitted or trained on decisions says otherwise).

    \b
    One model worker gathers queued items into micro-batches (at most
    --max-batch-items, --max-batch-tokens padded tokens, --max-wait-ms) and runs
    them through the same path as `classify`. SIGTERM: new requests get 503,
    accepted ones finish within --drain-timeout, then the exit status is 0.

    Docs: docs/serving.md
    """
    try:
        import starlette  # noqa: F401  # lazy: the serve extra's, checked here to name the pip command
        import uvicorn  # noqa: F401  # lazy: the serve extra's, checked here to name the pip command
    except ImportError:
        raise MissingExtra("mlx-slm serve needs Starlette and uvicorn: pip install 'mlx-slm[serve]'") from None

    warn_blas()
    method = (o.pop("decision_style"), o.pop("decision_permute"), o.pop("decision_calibrate"), state_cache)
    s = task_settings(ctx, o)
    plan = plans.resolve(_refuse_unread_fields(s), notice, decisions_ok=True)
    check_run_files(files_read(s), [])  # the files it reads: there, readable, not links to trouble
    decisions = _decision_plan(plan, s.task_file, method)

    def load() -> Loaded:
        # an embedding model serves its embedding routes
        ready, clf = plans.load_fitted(plan, notice, embeds_only_ok=True)
        return Loaded(
            clf,
            ready.calibration,
            ready.min_confidence,
            ready.warmup,
            model=ready.model.name if ready.model is not None else "",
            weights_sha256=clf.engine.weights_sha256,
            decision_plan=decisions.loaded(clf.engine),
        )

    opts = ServeOptions(
        max_batch_items=max_batch_items,
        max_batch_tokens=s.max_batch_tokens,  # as typed (None: the service's own default)
        max_wait_ms=max_wait_ms,
        max_queue_items=max_queue_items,
        max_items_per_request=max_items_per_request,  # the lower of it and the queue applies: items_limit
        max_body_bytes=max_body_bytes,
        request_timeout_s=request_timeout,
        drain_timeout_s=drain_timeout,
        api_key=api_key_from_env(api_key),
        task_cache=task_cache,
        state_cache=state_cache,
        served_model_names=tuple(served_model_names),
    )
    sock = bind_socket(host, port)  # a port in use is one line and exit 2, before anything starts
    port = sock.getsockname()[1]  # --port 0: the port the system chose
    if not s.quiet:
        notice(
            f"mlx-slm: serving on http://{host}:{port} (loading {plan.model}; /health says 200 when ready)"
            + ("; Bearer key required on /v1/*" if opts.api_key else "")
        )
    service = Service(load, opts)
    try:
        code = run_server(service, host, port, log_level, sock=sock)
    except RuntimeError as e:
        if service.worker_error:  # the worker died serving: a bug, its traceback in the log above
            notice(f"mlx-slm: error: {service.worker_error}")
            sys.exit(70)
        raise UserError(f"{'the model or its task' if s.task_file else 'the model'} could not be loaded: {e}") from None
    if not s.quiet:
        notice("mlx-slm: server stopped")
    sys.exit(code)


def _decision_plan(plan: Any, task_file: str | None, method: tuple[str, int, str, int]) -> Any:
    """How the decision routes answer: the served model, the task's fitted or trained questions, and
    the server's own --decision-style, --decision-permute and --decision-calibrate (no batch prior:
    a server answers one request at a time)."""
    style, permute, calibrate, state_cache = method
    opts = plans.DecisionOptions(
        plan.model.name,
        plan.model.dtype,
        task_file=task_file,
        style=style,
        permute=permute,
        calibrate=calibrate,
        state_cache=state_cache,
        given=frozenset({"model"}),
        prefix="decision-",
    )
    return plans.resolve_decisions(opts, need_questions=False, batch_ok=False)


def _refuse_unread_fields(s: Any) -> Any:
    """Serve reads no input but --calibration-data (requests carry their own texts): its field
    options without it, or for a format it does not have, are refused, not ignored. `s`, checked."""
    plans.check_data_fields(s, (*_CAL_DATA_FIELDS, "pair_field", "pair_column"))
    plans.check_format_fields(s, (s.calibration_data,))
    return s
