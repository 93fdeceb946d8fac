"""`mlx-slm serve`: the classifier as an HTTP service with dynamic micro-batching.

    request handler (event loop)                      model worker (one thread)
    auth, size limits, JSON checks  --> bounded queue --> gather (max items, token budget,
    tokenize on a front tokenizer       (429 when full)    max wait) -> group by task ->
    (422 naming the field)                                 Classifier.run -> answer each request

One worker thread owns the `Engine` (weights, tokenizer, prefix KV LRU) and runs every
forward pass through `Classifier.run`, the code path `mlx-slm classify` uses, so a
response holds the same labels and probabilities (rounded as `classify` writes them).
Request handlers validate and count tokens with classifiers built on a *copy* of the
tokenizer (its own lock), so admission never waits for a forward pass. Requests with
their own `labels`/`system`/`template`/`truncate` get a classifier from a small LRU (one
per task, all on the one engine); items of the same task share batches and a prefix KV.

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

A timed-out request never holds up the next one: see `Service` ("Deadlines").
"""

from __future__ import annotations

import asyncio
import copy
import errno
import hmac
import itertools
import json
import math
import os
import signal
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from .io import has_lone_surrogate
from .prompts import TRUNCATE_MODES

API_KEY_ENV = "MLX_SLM_API_KEY"
REQUEST_FIELDS = ("text", "texts", "ids", "labels", "system", "template", "truncate", "min_confidence")
LOOKAHEAD = 1024  # waiting items the gatherer looks through for ones of similar length
BATCH_TIME_FRACTION = 0.25  # a micro-batch's estimated compute time stays under this share of the request timeout


# --------------------------------------------------------------------------- options


@dataclass
class ServeOptions:
    max_batch_items: int = 32  # items gathered into one micro-batch (1: batching off)
    max_batch_tokens: int | None = None  # padded suffix tokens per micro-batch (None: the classifier's budget)
    max_wait_ms: float = 5.0  # how long the worker waits for more items once it has one
    max_queue_items: int = 1024  # items waiting, all requests together; beyond: 429
    max_items_per_request: int = 256  # beyond: 413
    max_body_bytes: int = 1 << 20  # beyond: 413
    request_timeout_s: float = 60.0  # beyond: 504
    drain_timeout_s: float = 30.0  # SIGTERM: time to finish accepted requests
    api_key: str | None = None  # Bearer key for /v1/*; /health and /metrics stay open
    task_cache: int = 8  # per-request tasks kept (classifiers on the one engine)


@dataclass
class Loaded:
    """What the loader gives the service: the default task's classifier and how to calibrate it."""

    clf: Any  # Classifier
    calibration: Any = "none"  # a CalibrationSpec, or what CalibrationSpec.of takes
    min_confidence: float | None = None
    warmup: int = 512
    model: str = ""
    weights_sha256: str | None = None
    clf_kwargs: dict[str, Any] = field(default_factory=dict)  # settings shared by per-request tasks


def classifier_loader(
    model: str,
    labels: Sequence[str] | None = None,
    system: str | None = None,
    template: str | None = None,
    calibration: Any = "none",
    min_confidence: float | None = None,
    **kwargs: Any,
) -> Callable[[], Loaded]:
    """A loader for `Service` from `Classifier.load` arguments (the Python API and tests)."""

    def load() -> Loaded:
        from .classifier import Classifier
        from .prompts import DEFAULT_LABELS, DEFAULT_SYSTEM, DEFAULT_TEMPLATE

        clf = Classifier.load(
            model,
            labels or DEFAULT_LABELS,
            DEFAULT_SYSTEM if system is None else (system or None),
            template or DEFAULT_TEMPLATE,
            **kwargs,
        )
        return Loaded(
            clf,
            calibration,
            min_confidence,
            model=str(model),
            weights_sha256=_sha(clf),
            clf_kwargs={k: v for k, v in kwargs.items() if k not in ("dtype", "dequantize")},
        )

    return load


def _sha(clf: Any) -> str | None:
    try:
        return clf.engine.weights_sha256
    except OSError:
        return None


# --------------------------------------------------------------------------- errors and metrics


class HTTPError(Exception):
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


_BUCKETS = {
    "batch_items": (1, 2, 4, 8, 16, 32, 64, 128),
    "batch_tokens": (16, 32, 64, 128, 256, 512, 1024, 2048, 4096),
    "seconds": (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
}


class _Histogram:
    def __init__(self, buckets: Sequence[float]):
        self.buckets, self.counts, self.sum, self.n = tuple(buckets), [0] * len(buckets), 0.0, 0

    def observe(self, v: float) -> None:
        self.sum += v
        self.n += 1
        for i, b in enumerate(self.buckets):
            if v <= b:
                self.counts[i] += 1


class Metrics:
    """Prometheus text exposition, written here (no client library needed); thread-safe."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests: dict[str, int] = {}
        self.items: dict[str, int] = {}
        self.prefix_hits = self.prefix_misses = self.prefix_saved_tokens = self.batches = 0
        self.processed_tokens = self.padding_tokens = 0
        self.hist = {
            "mlx_slm_batch_items": _Histogram(_BUCKETS["batch_items"]),
            "mlx_slm_batch_tokens": _Histogram(_BUCKETS["batch_tokens"]),
            "mlx_slm_queue_seconds": _Histogram(_BUCKETS["seconds"]),
            "mlx_slm_inference_seconds": _Histogram(_BUCKETS["seconds"]),
            "mlx_slm_request_seconds": _Histogram(_BUCKETS["seconds"]),
        }

    def count(self, what: dict[str, int], key: str, n: int = 1) -> None:
        with self.lock:
            what[key] = what.get(key, 0) + n

    def observe(self, name: str, v: float) -> None:
        with self.lock:
            self.hist[name].observe(v)

    def render(self, gauges: dict[str, tuple[str, float]]) -> str:
        out: list[str] = []
        with self.lock:
            out += [
                "# HELP mlx_slm_requests_total Classify requests (/v1/classify, /classify, /predict, /) by outcome.",
                "# TYPE mlx_slm_requests_total counter",
            ]
            out += [f'mlx_slm_requests_total{{outcome="{k}"}} {v}' for k, v in sorted(self.requests.items())]
            out += [
                "# HELP mlx_slm_items_total Items by outcome (ok: classified; dropped: client gone or timed "
                "out before compute).",
                "# TYPE mlx_slm_items_total counter",
            ]
            out += [f'mlx_slm_items_total{{outcome="{k}"}} {v}' for k, v in sorted(self.items.items())]
            for name, v, help_ in (
                ("mlx_slm_batches_total", self.batches, "Micro-batches run by the model worker."),
                (
                    "mlx_slm_prefix_cache_hits_total",
                    self.prefix_hits,
                    "Items whose prompt starts with the cached prefix.",
                ),
                ("mlx_slm_prefix_cache_misses_total", self.prefix_misses, "Items run without the prefix cache."),
                (
                    "mlx_slm_prefix_cache_saved_tokens_total",
                    self.prefix_saved_tokens,
                    "Prompt tokens the prefix cache saved.",
                ),
                ("mlx_slm_processed_tokens_total", self.processed_tokens, "Tokens the forward ran (padding included)."),
                ("mlx_slm_padding_tokens_total", self.padding_tokens, "Padding tokens among them."),
            ):
                out += [f"# HELP {name} {help_}", f"# TYPE {name} counter", f"{name} {v}"]
            for name, (help_, v) in gauges.items():
                out += [f"# HELP {name} {help_}", f"# TYPE {name} gauge", f"{name} {v:g}"]
            helps = {
                "mlx_slm_batch_items": "Items per micro-batch.",
                "mlx_slm_batch_tokens": "Padded suffix tokens per micro-batch.",
                "mlx_slm_queue_seconds": "Time an item waited in the queue.",
                "mlx_slm_inference_seconds": "Compute time of the micro-batch an item ran in.",
                "mlx_slm_request_seconds": "End-to-end time of answered requests.",
            }
            for name, h in self.hist.items():
                out += [f"# HELP {name} {helps[name]}", f"# TYPE {name} histogram"]
                for b, c in zip(h.buckets, h.counts):
                    out.append(f'{name}_bucket{{le="{b:g}"}} {c}')
                out += [f'{name}_bucket{{le="+Inf"}} {h.n}', f"{name}_sum {h.sum:.6f}", f"{name}_count {h.n}"]
        return "\n".join(out) + "\n"


# --------------------------------------------------------------------------- jobs and the worker


class _Job:
    """One accepted request: its items' results arrive from the worker on the event loop."""

    def __init__(self, n: int, loop: asyncio.AbstractEventLoop, deadline: float = math.inf):
        self.results: list[Any] = [None] * n
        self.remaining = n
        self.loop = loop
        self.deadline = deadline  # time.perf_counter() when the request times out (504)
        self.names: list[str] = []  # the items' field names ("text", "texts[3]"), for messages
        self.done = asyncio.Event()
        self.cancelled = False  # client gone or timed out: its queued items are dropped
        self.error: HTTPError | None = None

    def deliver(self, index: int, value: Any) -> None:  # on the loop
        if self.results[index] is None:
            self.results[index] = value
            self.remaining -= 1
            if self.remaining == 0:
                self.done.set()

    def fail(self, err: HTTPError) -> None:  # on the loop
        if self.error is None:
            self.error = err
        self.done.set()


def _post_to(job: _Job, fn: Callable[..., None], *args: Any) -> None:
    """Hand a result to the request's event loop (gone at shutdown: nobody is waiting then)."""
    try:
        job.loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:
        pass


@dataclass
class _WorkItem:
    job: _Job
    index: int
    text: str
    key: tuple
    cost: int  # suffix tokens (after the shared prefix)
    prefix_hit: bool
    t_enqueued: float


class Service:
    """The model worker, its queue and the task LRU; the HTTP app (`create_app`) drives it.

    Deadlines: one worker runs every forward pass, and a forward pass cannot be stopped
    once started, so a request that times out (504) must not leave long work behind that
    the next request then waits for. Four rules keep the queue moving:

    1. Every job carries its deadline (arrival + --request-timeout). Before each micro-batch
       the worker drops the waiting items of jobs that are past it or cancelled (client gone,
       504 sent): they are never computed (counted as `dropped` in /metrics).
    2. A micro-batch is bounded in time, not only in items and tokens: its padded tokens times
       the measured seconds per token stay under `BATCH_TIME_FRACTION` (1/4) of the request
       timeout (at least one item). So after a 504, the work still running for it ends within
       about a quarter of a timeout, and the next request is computed then.
    3. An item whose own estimated compute time is more than its request has left is never
       started: the request gets its 504 at once, naming the item, instead of a forward pass
       that would outlive the request and block the worker.
    4. The rate (seconds per processed token) is measured on the warm-up and on every
       micro-batch (a moving average), so it follows the machine and the model.

    With the default timeout (60 s) rule 2 never binds on the usual budgets (512 tokens on the
    CPU, 4,096 on a GPU); it matters when --request-timeout is short next to a batch's time.
    The estimate is linear in tokens; attention's quadratic part makes it optimistic for
    items near the model's context (a single item is the unit that cannot be split).
    """

    def __init__(self, loader: Callable[[], Loaded], options: ServeOptions | None = None):
        self.loader, self.opts = loader, options or ServeOptions()
        self.metrics = Metrics()
        self.cond = threading.Condition()
        self.queue: deque[_WorkItem] = deque()
        self.ready = False
        self.load_error: str | None = None
        self.draining = False
        self.stopping = False
        self.inflight = 0  # accepted requests not yet answered
        self.loaded: Loaded | None = None
        self._front: OrderedDict[tuple, Any] = OrderedDict()  # classifiers on the front tokenizer
        self._front_lock = threading.Lock()
        self._back: OrderedDict[tuple, Any] = OrderedDict()  # classifiers on the engine (worker only)
        self._rate = 0.0  # recent items/s, for Retry-After
        self._sec_per_token = 0.0  # measured compute seconds per processed token (0: not yet known)
        self.thread: threading.Thread | None = None
        self.on_fatal: Callable[[str], None] | None = None

    # ---------------------------------------------------------------- lifecycle
    def start(self) -> None:
        self.thread = threading.Thread(target=self._main, name="mlx-slm-worker", daemon=True)
        self.thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        with self.cond:
            self.stopping = True
            self.cond.notify_all()
        if self.thread is not None:
            self.thread.join(timeout)

    def _main(self) -> None:
        try:
            self._load()
        except BaseException as e:  # noqa: BLE001 - reported on /health and by the CLI
            self.load_error = f"{type(e).__name__}: {e}"
            if self.on_fatal is not None:
                self.on_fatal(self.load_error)
            return
        self.ready = True
        self._loop()

    def _load(self) -> None:
        from .engine import Engine

        loaded = self.loader()
        clf = loaded.clf
        self.loaded = loaded
        self.default_key = self.task_key(None, None, None, None)
        self._back[self.default_key] = clf
        # The front: the same model object, a copy of the tokenizer with its own lock, so
        # request handlers tokenize while the worker runs a forward pass.
        front_engine = Engine(clf.engine.model, copy.deepcopy(clf.engine.tokenizer), clf.engine.path)
        self.front_engine = front_engine
        self._front[self.default_key] = self._build(front_engine, self.default_key)
        # Warm up: one item through the whole path (computes the default prompt head's KV);
        # its time gives the first seconds-per-token estimate (high: it includes the head).
        t0 = time.perf_counter()
        run = clf.run(["warm-up"], window=1)
        list(run)
        self._note_speed(time.perf_counter() - t0, run.stats.processed_tokens)

    def _note_speed(self, seconds: float, tokens: int) -> None:
        """Fold one measured batch into the seconds-per-token estimate (rules 2-4)."""
        if tokens <= 0 or seconds <= 0:
            return
        r = seconds / tokens
        self._sec_per_token = r if self._sec_per_token == 0 else 0.7 * self._sec_per_token + 0.3 * r

    def _time_budget(self) -> int | None:
        """Padded tokens one micro-batch may hold so that it takes about `BATCH_TIME_FRACTION`
        of the request timeout (None: no estimate yet)."""
        if self._sec_per_token <= 0:
            return None
        return max(1, int(BATCH_TIME_FRACTION * self.opts.request_timeout_s / self._sec_per_token))

    def task_key(self, labels: Sequence[str] | None, system: Any, template: str | None, truncate: Any) -> tuple:
        c = self.loaded.clf  # type: ignore[union-attr]
        t = c.truncate if truncate is None else (truncate or None)
        return (
            tuple(labels) if labels is not None else c.labels,
            c.format.system if system is None else (system or None),
            c.format.template if template is None else template,
            t,
        )

    def _build(self, engine: Any, key: tuple) -> Any:
        from .classifier import Classifier

        base = self.loaded.clf  # type: ignore[union-attr]
        labels, system, template, truncate = key
        same_labels = labels == base.labels
        kw = dict(self.loaded.clf_kwargs)  # type: ignore[union-attr]
        kw.update(
            batch_size=base.batch_size,
            max_batch_tokens=base.max_batch_tokens,
            sort=base.sort,
            use_prefix_cache=kw.get("use_prefix_cache", True),
            truncate=truncate,
            # A learned head's "mode" is no scoring mode: without the head (other labels or prompt),
            # this task scores its labels as a task file without a head would.
            scoring=base.mode if same_labels and base.mode != "head" else "auto",
            examples=base.format.examples if same_labels else (),
        )
        for k in ("calibration", "min_confidence", "warmup"):
            kw.pop(k, None)
        head = kw.pop("head", None) or getattr(base, "head", None)  # it holds for its own labels and prompt only
        if head is not None and same_labels and (system, template) == (base.format.system, base.format.template):
            kw["head"] = head
        return Classifier(engine, None, labels, system, template, **kw)

    def front_classifier(self, key: tuple) -> Any:
        """The task's classifier on the front tokenizer (validation and token counts)."""
        with self._front_lock, self.front_engine.lock:  # construction tokenizes too
            clf = self._front.get(key)
            if clf is None:
                clf = self._build(self.front_engine, key)  # may raise PromptError / LabelError
                self._front[key] = clf
                while len(self._front) > max(1, self.opts.task_cache):
                    k = next(iter(self._front))
                    if k == self.default_key:
                        self._front.move_to_end(k)
                        k = next(iter(self._front))
                    self._front.pop(k)
            else:
                self._front.move_to_end(key)
            return clf

    def _back_classifier(self, key: tuple) -> Any:
        clf = self._back.get(key)
        if clf is None:
            engine = self.loaded.clf.engine  # type: ignore[union-attr]
            with engine.lock:
                clf = self._back[key] = self._build(engine, key)
            while len(self._back) > max(1, self.opts.task_cache):
                k = next(iter(self._back))
                if k == self.default_key:
                    self._back.move_to_end(k)
                    k = next(iter(self._back))
                self._back.pop(k)
        else:
            self._back.move_to_end(key)
        return clf

    def calibration_for(self, key: tuple) -> tuple[Any, float | None]:
        """(CalibrationSpec, min_confidence) for a task: a fitted prior applies only to the
        default task (other labels or prompt: it means nothing there); 'batch' applies per request."""
        from .calibration import CalibrationSpec

        ld = self.loaded
        spec = CalibrationSpec.of(ld.calibration, warmup=ld.warmup)  # type: ignore[union-attr]
        if key != self.default_key and spec.fitted:
            spec = CalibrationSpec(warmup=spec.warmup)
        return spec, ld.min_confidence  # type: ignore[union-attr]

    # ---------------------------------------------------------------- queue
    @property
    def depth(self) -> int:
        return len(self.queue)

    def submit(self, job: _Job, texts: Sequence[str], key: tuple, costs: Sequence[int], hits: Sequence[bool]) -> None:
        now = time.perf_counter()
        with self.cond:
            if self.draining:
                raise HTTPError(
                    503, "the server is shutting down: not accepting new requests", headers={"Retry-After": "5"}
                )
            if len(self.queue) + len(texts) > self.opts.max_queue_items:
                wait = len(self.queue) / self._rate if self._rate > 0 else 1.0
                raise HTTPError(
                    429,
                    f"the queue holds {len(self.queue)} items (limit {self.opts.max_queue_items}); retry later",
                    headers={"Retry-After": str(max(1, math.ceil(wait)))},
                )
            for i, (t, c, h) in enumerate(zip(texts, costs, hits)):
                self.queue.append(_WorkItem(job, i, t, key, c, h, now))
            self.inflight += 1
            self.cond.notify_all()

    def cancel(self, job: _Job) -> int:
        """Drop a job's items still waiting (client gone, timeout); returns how many."""
        with self.cond:
            job.cancelled = True
            before = len(self.queue)
            self.queue = deque(it for it in self.queue if it.job is not job)
            dropped = before - len(self.queue)
        if dropped:
            self.metrics.count(self.metrics.items, "dropped", dropped)
        return dropped

    def finished(self) -> None:
        with self.cond:
            self.inflight -= 1
            self.cond.notify_all()

    def _gather(self) -> list[_WorkItem] | None:
        """The next micro-batch: the oldest waiting item (so none starves), and the waiting
        items of the same task closest to it in length, within --max-batch-items and the
        padded-token budget (rows x longest suffix, as the classifier's planner counts);
        waits up to --max-wait-ms for more while the batch is not full."""
        o = self.opts
        budget = o.max_batch_tokens or self.loaded.clf.max_batch_tokens or (1 << 30)  # type: ignore[union-attr]
        tb = self._time_budget()  # rule 2: bounded in time too
        if tb is not None:
            budget = min(budget, tb)
        with self.cond:
            while not self.queue and not self.stopping:
                self.cond.wait()
            if not self.queue:
                return None
            deadline = time.perf_counter() + o.max_wait_ms / 1000.0
            while True:
                now = time.perf_counter()
                while self.queue and (self.queue[0].job.cancelled or self.queue[0].job.deadline <= now):
                    it = self.queue.popleft()  # rule 1: never computed
                    if not it.job.cancelled:
                        self.metrics.count(self.metrics.items, "dropped")
                if not self.queue:  # everything waiting was cancelled
                    if self.stopping:
                        return None
                    self.cond.wait()
                    deadline = time.perf_counter() + o.max_wait_ms / 1000.0
                    continue
                got, longest = self._select(budget)
                full = len(got) >= o.max_batch_items or (len(got) + 1) * longest > budget
                left = deadline - time.perf_counter()
                if full or left <= 0 or self.stopping or self.draining:
                    chosen = {id(it) for it in got}
                    self.queue = deque(it for it in self.queue if id(it) not in chosen)
                    return got
                self.cond.wait(left)

    def _select(self, budget: int) -> tuple[list[_WorkItem], int]:
        head = self.queue[0]
        got, longest = [head], head.cost
        if self.opts.max_batch_items <= 1:
            return got, longest
        look = itertools.islice(self.queue, 1, 1 + LOOKAHEAD)
        now = time.perf_counter()
        cands = [it for it in look if it.key == head.key and not it.job.cancelled and it.job.deadline > now]
        cands.sort(key=lambda it: abs(it.cost - head.cost))  # stable: older first among equals
        for it in cands:
            if len(got) >= self.opts.max_batch_items:
                break
            nl = max(longest, it.cost)
            if (len(got) + 1) * nl <= budget:
                got.append(it)
                longest = nl
        return got, longest

    def _loop(self) -> None:
        while True:
            got = self._gather()
            if got is None:
                return
            groups: OrderedDict[tuple, list[_WorkItem]] = OrderedDict()
            for it in got:
                groups.setdefault(it.key, []).append(it)
            for key, items in groups.items():
                items = self._runnable(items)
                if items:
                    self._run(key, items)

    def _runnable(self, items: list[_WorkItem]) -> list[_WorkItem]:
        """The items still worth computing now (rules 1 and 3 in the class docstring)."""
        now = time.perf_counter()
        out: list[_WorkItem] = []
        refused: list[_Job] = []
        dropped = 0
        for it in items:
            job = it.job
            if job.cancelled:  # client gone or 504 sent: never computed (counted where it was cancelled)
                dropped += job in refused
                continue
            if job.deadline <= now:
                dropped += 1
                continue
            est = it.cost * self._sec_per_token
            if est > job.deadline - now:
                refused.append(job)
                self._refuse(it, est, job.deadline - now)
                dropped += 1
                continue
            out.append(it)
        dropped += sum(it.job in refused for it in out)
        if dropped:
            self.metrics.count(self.metrics.items, "dropped", dropped)
        return [it for it in out if it.job not in refused]

    def _refuse(self, it: _WorkItem, est: float, left: float) -> None:
        """Rule 3: answer the request 504 now, and drop its waiting items, rather than start
        a forward pass that would outlive it."""
        job = it.job
        name = job.names[it.index] if job.names else f"texts[{it.index}]"
        err = HTTPError(
            504,
            f"{name} would take about {est:.2g} s to compute ({it.cost} tokens at the measured rate), more than "
            f"the {max(0.0, left):.2g} s left of the request timeout of {self.opts.request_timeout_s:g} s: "
            'shorten it (or send "truncate"), or raise --request-timeout',
            name,
        )
        self.cancel(job)
        _post_to(job, job.fail, err)

    def _run(self, key: tuple, items: list[_WorkItem]) -> None:
        m = self.metrics
        t0 = time.perf_counter()
        try:
            clf = self._back_classifier(key)
            run = clf.run([it.text for it in items], window=len(items))
            preds = list(run)
        except Exception as e:  # noqa: BLE001 - answered as 500 to the requests in this batch
            err = HTTPError(500, f"inference failed: {type(e).__name__}: {e}", outcome="error")
            for it in items:
                _post_to(it.job, it.job.fail, err)
            m.count(m.items, "error", len(items))
            return
        t1 = time.perf_counter()
        infer = t1 - t0
        s = run.stats
        self._note_speed(infer, s.processed_tokens)
        with m.lock:
            m.batches += 1
            m.prefix_hits += sum(it.prefix_hit for it in items)
            m.prefix_misses += sum(not it.prefix_hit for it in items)
            m.prefix_saved_tokens += max(0, s.prefix_saved_tokens)
            m.processed_tokens += s.processed_tokens
            m.padding_tokens += s.padding_tokens
            m.hist["mlx_slm_batch_items"].observe(len(items))
            m.hist["mlx_slm_batch_tokens"].observe(len(items) * max(it.cost for it in items))
            m.hist["mlx_slm_inference_seconds"].observe(infer)
            for it in items:
                m.hist["mlx_slm_queue_seconds"].observe(t0 - it.t_enqueued)
        m.count(m.items, "ok", len(items))
        rate = len(items) / infer if infer > 0 else 0.0
        self._rate = rate if self._rate == 0 else 0.8 * self._rate + 0.2 * rate
        for it, p in zip(items, preds):
            _post_to(it.job, it.job.deliver, it.index, (p, t0 - it.t_enqueued, infer))

    # ---------------------------------------------------------------- drain
    def begin_drain(self) -> None:
        with self.cond:
            self.draining = True
            self.cond.notify_all()

    def wait_idle(self, timeout: float) -> bool:
        end = time.monotonic() + timeout
        with self.cond:
            while self.inflight > 0:
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self.cond.wait(min(left, 0.05))
        return True

    def abort_pending(self) -> None:
        """The drain timed out: answer what is still waiting with 503 (never computed)."""
        with self.cond:
            items, self.queue = list(self.queue), deque()
        err = HTTPError(503, "the server shut down before this request was computed (drain timeout)")
        for it in items:
            it.job.cancelled = True
            _post_to(it.job, it.job.fail, err)
        if items:
            self.metrics.count(self.metrics.items, "dropped", len(items))


# --------------------------------------------------------------------------- the HTTP app


def parse_body(raw: bytes) -> Any:
    """The request body as JSON, or a 422 naming what is wrong (never another exception):
    not UTF-8, not JSON, nested too deeply, or a number too long to convert."""
    try:
        return json.loads(raw)
    except RecursionError:
        raise HTTPError(422, "the body is JSON nested too deeply: send a flat JSON object", "body") from None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, an integer of too many digits
        raise HTTPError(422, f"the body is not valid JSON ({str(e)[:200]})", "body") from None


def validate_request(raw: bytes, opts: ServeOptions) -> tuple[list[str], list[Any], dict[str, Any]]:
    """Everything checked about a request before the model is involved: the body (`parse_body`)
    and its fields (`_check_request`). Raises only `HTTPError` (4xx) for a bad request."""
    return _check_request(parse_body(raw), opts)


def _check_request(data: Any, opts: ServeOptions) -> tuple[list[str], list[Any], dict[str, Any]]:
    if not isinstance(data, dict):
        raise HTTPError(422, "the body must be a JSON object with 'text' or 'texts'", "body")
    unknown = sorted(set(data) - set(REQUEST_FIELDS))
    if unknown:
        raise HTTPError(422, f"unknown field {unknown[0]!r}: use {', '.join(REQUEST_FIELDS)}", unknown[0])
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
    for name, t in zip(names, texts):
        if not t.strip():
            raise HTTPError(422, f"{name} is empty: give the item some text", name)
        if has_lone_surrogate(t):
            raise HTTPError(422, f"{name} holds an unpaired surrogate escape (not valid Unicode text): fix it", name)
    ids: list[Any] = list(range(len(texts)))
    if "ids" in data:
        ids = data["ids"]
        if not isinstance(ids, list) or len(ids) != len(texts):
            raise HTTPError(422, f"'ids' must be a list of {len(texts)} ids, one per text", "ids")
        seen: dict[Any, int] = {}
        for i, v in enumerate(ids):
            if isinstance(v, bool) or not isinstance(v, (str, int)):
                raise HTTPError(422, f"ids[{i}] must be a string or an integer", f"ids[{i}]")
            if isinstance(v, str) and has_lone_surrogate(v):
                raise HTTPError(
                    422, f"ids[{i}] holds an unpaired surrogate escape (not valid Unicode text)", f"ids[{i}]"
                )
            k = (type(v).__name__, v)
            if k in seen:
                raise HTTPError(422, f"ids[{i}] repeats ids[{seen[k]}] ({v!r}): ids must be unique", f"ids[{i}]")
            seen[k] = i
    task: dict[str, Any] = {"labels": None, "system": None, "template": None, "truncate": None, "min_confidence": None}
    if "min_confidence" in data and data["min_confidence"] is not None:
        mc = data["min_confidence"]
        if isinstance(mc, bool) or not isinstance(mc, (int, float)) or not 0.0 <= mc <= 1.0:
            raise HTTPError(422, "'min_confidence' must be a number from 0 to 1 (or null)", "min_confidence")
        task["min_confidence"] = float(mc)
    if "labels" in data:
        lab = data["labels"]
        if not isinstance(lab, list) or not all(isinstance(x, str) for x in lab) or len(lab) < 2:
            raise HTTPError(422, "'labels' must be a list of at least two strings", "labels")
        if any(has_lone_surrogate(x) for x in lab):
            raise HTTPError(422, "'labels' holds an unpaired surrogate escape (not valid Unicode text)", "labels")
        task["labels"] = [x.strip() for x in lab]
    if "system" in data:
        if data["system"] is not None and not isinstance(data["system"], str):
            raise HTTPError(422, "'system' must be a string or null", "system")
        if data["system"] and has_lone_surrogate(data["system"]):
            raise HTTPError(422, "'system' holds an unpaired surrogate escape (not valid Unicode text)", "system")
        task["system"] = data["system"] or ""
    if "template" in data:
        tpl = data["template"]
        if not isinstance(tpl, str) or "{text}" not in tpl:
            raise HTTPError(422, "'template' must be a string with a {text} placeholder", "template")
        if has_lone_surrogate(tpl):
            raise HTTPError(422, "'template' holds an unpaired surrogate escape (not valid Unicode text)", "template")
        task["template"] = tpl
    if "truncate" in data:
        tr = data["truncate"]
        if tr is not None and tr is not False and tr not in TRUNCATE_MODES:
            raise HTTPError(422, f"'truncate' must be one of {', '.join(TRUNCATE_MODES)}, false or null", "truncate")
        task["truncate"] = tr or False
    return texts, ids, task


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
    for name, t in zip(names, texts):
        if not t.strip():
            raise HTTPError(422, f"{name} is empty: give the item some text", name)
        if has_lone_surrogate(t):
            raise HTTPError(422, f"{name} holds an unpaired surrogate escape (not valid Unicode text): fix it", name)
    return texts, single


def _default_task() -> dict[str, Any]:
    return {"labels": None, "system": None, "template": None, "truncate": None, "min_confidence": None}


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


def _check_tei(data: Any, opts: ServeOptions) -> tuple[list[str], bool, dict[str, Any], bool, int | None]:
    """TEI's /predict body: {"inputs": str | [str], "raw_scores"?, "truncate"?, "truncation_direction"?},
    and the InferenceClient's {"inputs", "parameters": {"function_to_apply"?, "top_k"?}}.
    Returns (texts, one string given, task, raw scores, top k)."""
    _check_fields(data, TEI_FIELDS, "inputs")
    texts, single = _check_texts(data["inputs"], "inputs", opts)
    task = _default_task()
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
        task["truncate"] = ("head" if direction.lower() == "right" else "tail") if tr else False
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


def _check_vllm(data: Any, opts: ServeOptions) -> tuple[list[str], bool, dict[str, Any]]:
    """vLLM's classification body: {"model", "input": str | [str], "truncate_prompt_tokens"?}
    (`user`, `priority`, `request_id` are accepted and ignored)."""
    _check_fields(data, VLLM_FIELDS, "input")
    if data.get("model") is not None and not isinstance(data["model"], str):
        raise HTTPError(422, "'model' must be a string", "model")
    texts, single = _check_texts(data["input"], "input", opts)
    task = _default_task()
    tpt = data.get("truncate_prompt_tokens")
    if tpt is not None:
        if isinstance(tpt, bool) or not isinstance(tpt, int) or tpt != -1:
            raise HTTPError(
                422,
                "'truncate_prompt_tokens' must be -1 (truncate to the model's context, keeping the end as vLLM "
                "does) or null; a token count is not supported",
                "truncate_prompt_tokens",
            )
        task["truncate"] = "tail"
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
                        "abstained, truncated, queue_ms, inference_ms; headers x-total-time, "
                        "x-queue-time, x-inference-time (ms)"
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


def create_app(service: Service, *, start_worker: bool = True) -> Any:
    """The Starlette app over `service` (its lifespan starts and stops the worker)."""
    from contextlib import asynccontextmanager

    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.requests import Request
    from starlette.responses import JSONResponse, PlainTextResponse
    from starlette.routing import Route

    opts = service.opts
    m = service.metrics

    def error_response(e: HTTPError, style: str = "ours") -> JSONResponse:
        return JSONResponse(e.body(style), status_code=e.status, headers=e.headers)

    def check_auth(request: Request) -> None:
        if not opts.api_key:
            return
        got = request.headers.get("authorization", "")
        scheme, _, token = got.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), opts.api_key.encode()):
            raise HTTPError(
                401,
                "missing or wrong API key: send 'Authorization: Bearer KEY'",
                "authorization",
                headers={"WWW-Authenticate": "Bearer"},
            )

    def endpoint(handler: Callable[..., Any], style: str = "ours") -> Callable[..., Any]:
        """A classifying route: every outcome counted in /metrics, every error a JSON body in the
        route's style (ours, TEI's, or OpenAI/vLLM's), a bug of ours one log line and a 500."""

        async def run(request: Request) -> Any:
            t0 = time.perf_counter()
            try:
                resp = await handler(request, t0)
                m.count(m.requests, "ok")
                m.observe("mlx_slm_request_seconds", time.perf_counter() - t0)
                return resp
            except HTTPError as e:
                m.count(m.requests, e.outcome)
                return error_response(e, getattr(e, "style", None) or style)
            except Exception as e:  # noqa: BLE001 - a bug of ours: one log line, a counted 500, no ASGI traceback
                import logging

                logging.getLogger("mlx_slm.server").error(
                    "%s %s failed: %s: %s", request.method, request.url.path, type(e).__name__, e
                )
                m.count(m.requests, "error")
                return error_response(HTTPError(500, f"internal error ({type(e).__name__}): please report it"), style)

        return run

    def check_ready() -> None:
        if service.draining:
            raise HTTPError(
                503, "the server is shutting down: not accepting new requests", headers={"Retry-After": "5"}
            )
        if not service.ready:
            raise HTTPError(503, service.load_error or "the model is loading", headers={"Retry-After": "5"})

    async def admit(request: Request) -> Any:
        """Auth, readiness, then the body as JSON (a 4xx naming what is wrong)."""
        check_auth(request)
        check_ready()
        return parse_body(await _read_body(request, opts.max_body_bytes))

    async def compute(
        request: Request, t0: float, texts: list[str], task: dict[str, Any], names: list[str], whole: str, hint: str
    ) -> tuple[list[Any], list[Any], Any, Any]:
        """Queue the texts of one request on the model worker and wait for them: (calibrated
        predictions, the worker's (prediction, queue s, inference s) per item, the run's
        `Calibration`, the task's front classifier). `names`: each text's field, for errors;
        `whole`: the field a timeout names; `hint`: how this API asks for truncation."""
        key = service.task_key(task["labels"], task["system"], task["template"], task["truncate"])
        try:
            front = await run_in_threadpool(service.front_classifier, key)
        except ValueError as e:  # PromptError, LabelError: a task that cannot be built
            msg = str(e)
            fld = (
                "labels"
                if task["labels"] is not None and "label" in msg.lower()
                else "template"
                if task["template"] is not None
                else "system"
                if task["system"] is not None
                else "labels"
            )
            raise HTTPError(422, msg, fld) from None
        prepared = await run_in_threadpool(front.prepare, texts)
        for it, name in zip(prepared, names):
            if it.error:
                msg = it.error.replace("--truncate head|tail|middle", hint)
                raise HTTPError(422, f"{name}: {msg}", name)
        p = len(front.prefix_tokens)
        hits = [bool(p) and tuple(it.ids[:p]) == front.prefix_tokens for it in prepared]
        # The label trie runs beside every row's prompt: its nodes count in the micro-batch budget
        # and the time estimate, as in the classifier's own batch plan.
        costs = [len(it.ids) - (p if h else 0) + front.row_extra for it, h in zip(prepared, hits)]
        job = _Job(len(texts), asyncio.get_running_loop(), deadline=t0 + opts.request_timeout_s)
        job.names = names
        service.submit(job, texts, key, costs, hits)
        try:
            waiter = asyncio.ensure_future(job.done.wait())
            gone = asyncio.ensure_future(_until_disconnect(request))
            left = opts.request_timeout_s - (time.perf_counter() - t0)
            await asyncio.wait({waiter, gone}, timeout=max(0.0, left), return_when=asyncio.FIRST_COMPLETED)
            for f in (waiter, gone):
                f.cancel()
            if not job.done.is_set():
                service.cancel(job)
                if gone.done() and not gone.cancelled():
                    raise HTTPError(499, "the client closed the connection", outcome="client_gone")
                raise HTTPError(
                    504,
                    f"not answered within the request timeout of {opts.request_timeout_s:g} s: "
                    "retry, or send fewer texts",
                    whole,
                )
            if job.error is not None:
                raise job.error
        finally:
            service.finished()
        spec, conf = service.calibration_for(key)
        if task["min_confidence"] is not None:
            conf = task["min_confidence"]
        calib = spec.run(front.labels, conf)
        preds = list(calib(r[0] for r in job.results))
        return preds, job.results, calib, front

    async def _classify(request: Request, t0: float) -> Any:
        data = await admit(request)
        if isinstance(data, dict) and "input" in data and not {"text", "texts"} & set(data):
            try:  # vLLM's body (`input`): vLLM's answer, as vLLM serves /v1/classify too
                return await _vllm_answer(request, t0, data)
            except HTTPError as e:
                e.style = "openai"  # type: ignore[attr-defined]
                raise
        if isinstance(data, dict) and "inputs" in data and not {"text", "texts"} & set(data):
            raise HTTPError(
                422,
                "'inputs' is text-embeddings-inference's field: POST that body to /predict (TEI's answer), "
                "or send 'text'/'texts' here",
                "inputs",
            )
        texts, ids, task = _check_request(data, opts)
        names = ["text"] if "text" in data else [f"texts[{i}]" for i in range(len(texts))]
        preds, raw, calib, _ = await compute(
            request,
            t0,
            texts,
            task,
            names,
            "texts" if len(texts) > 1 else "text",
            '"truncate": "head"|"tail"|"middle"',
        )
        from .output import result_record

        results = []
        for i, pr in enumerate(preds):
            rec = result_record(SimpleNamespace(id=ids[i], line=None, error=None), pr, calib.method)
            _, q, inf = raw[i]
            rec["queue_ms"], rec["inference_ms"] = round(q * 1000, 3), round(inf * 1000, 3)
            results.append(rec)
        total = (time.perf_counter() - t0) * 1000
        q_ms = max(r["queue_ms"] for r in results)
        i_ms = max(r["inference_ms"] for r in results)
        return JSONResponse(
            {"results": results, "total_ms": round(total, 3), "queue_ms": q_ms, "inference_ms": i_ms},
            headers={
                "x-total-time": str(int(round(total))),
                "x-queue-time": str(int(round(q_ms))),
                "x-inference-time": str(int(round(i_ms))),
            },
        )

    async def _tei_predict(request: Request, t0: float) -> Any:
        """text-embeddings-inference's /predict (and Hugging Face's InferenceClient, which posts
        `{"inputs", "parameters"}` to its base URL): one list of {label, score}, best first, per
        input; a single string is answered as a list holding its one list."""
        data = await admit(request)
        texts, single, task, raw_scores, top_k = _check_tei(data, opts)
        names = ["inputs"] if single else [f"inputs[{i}]" for i in range(len(texts))]
        preds, _, _, _ = await compute(request, t0, texts, task, names, "inputs", '"truncate": true')
        out = []
        for p in preds:
            vals = p.scores if raw_scores else p.probs
            ranked = sorted(({"label": lab, "score": float(v)} for lab, v in vals.items()), key=lambda d: -d["score"])
            out.append(ranked[:top_k] if top_k else ranked)
        return JSONResponse(out)

    def served_name() -> str:
        ld = service.loaded
        return (ld.model if ld is not None and ld.model else None) or "mlx-slm"

    async def _vllm_classify(request: Request, t0: float) -> Any:
        return await _vllm_answer(request, t0, await admit(request))

    async def _vllm_answer(request: Request, t0: float, data: Any) -> Any:
        """vLLM's classification API: `{"model", "input": str | [str]}` -> `{"id", "object": "list",
        "created", "model", "data": [{"index", "label", "probs", "num_classes"}], "usage"}`; `probs`
        in the task's label order. `model` is accepted as any name (one model per server) and the
        answer names the served one."""
        import uuid

        texts, single, task = _check_vllm(data, opts)
        names = ["input"] if single else [f"input[{i}]" for i in range(len(texts))]
        preds, _, _, front = await compute(request, t0, texts, task, names, "input", '"truncate_prompt_tokens": -1')
        labels = list(front.labels)
        rows = []
        for i, p in enumerate(preds):
            row: dict[str, Any] = {
                "index": i,
                "label": p.label,
                "probs": [float(p.probs[lab]) for lab in labels],
                "num_classes": len(labels),
            }
            if p.abstained:
                row["abstained"] = True
            rows.append(row)
        n = sum(p.n_tokens for p in preds)
        return JSONResponse(
            {
                "id": f"classify-{uuid.uuid4().hex}",
                "object": "list",
                "created": int(time.time()),
                "model": served_name(),
                "data": rows,
                "usage": {"prompt_tokens": n, "total_tokens": n, "completion_tokens": 0, "prompt_tokens_details": None},
            }
        )

    classify = endpoint(_classify)
    tei_predict = endpoint(_tei_predict, "tei")
    vllm_classify = endpoint(_vllm_classify, "openai")

    async def model_info(request: Request) -> Any:
        try:
            check_auth(request)
        except HTTPError as e:
            return error_response(e)
        if not service.ready:
            return error_response(
                HTTPError(503, service.load_error or "the model is loading", headers={"Retry-After": "5"})
            )
        import mlx.core as mx

        ld = service.loaded
        clf = ld.clf  # type: ignore[union-attr]
        spec, conf = service.calibration_for(service.default_key)
        return JSONResponse(
            {
                "model": ld.model,
                "path": str(clf.path) if clf.path else None,  # type: ignore[union-attr]
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
                    "calibration": spec.kind,
                    "min_confidence": conf,
                    "warmup": spec.warmup,
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

    def guard(request: Request) -> Any:
        """Auth and readiness for the read-only model routes; None when they pass."""
        try:
            check_auth(request)
            if not service.ready:
                raise HTTPError(503, service.load_error or "the model is loading", headers={"Retry-After": "5"})
        except HTTPError as e:
            return e
        return None

    async def tei_info(request: Request) -> Any:
        """text-embeddings-inference's /info, for a sequence classifier."""
        from . import __version__

        if (e := guard(request)) is not None:
            return error_response(e, "tei")
        ld = service.loaded
        clf = ld.clf  # type: ignore[union-attr]
        labels = list(clf.labels)
        return JSONResponse(
            {
                "model_id": served_name(),
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

    started = int(time.time())

    async def vllm_models(request: Request) -> Any:
        """The OpenAI/vLLM model list: the one model this server serves."""
        if (e := guard(request)) is not None:
            return error_response(e, "openai")
        clf = service.loaded.clf  # type: ignore[union-attr]
        return JSONResponse(
            {
                "object": "list",
                "data": [
                    {
                        "id": served_name(),
                        "object": "model",
                        "created": started,
                        "owned_by": "mlx-slm",
                        "root": str(clf.path) if clf.path else served_name(),
                        "parent": None,
                        "max_model_len": clf.max_length,
                        "labels": list(clf.labels),
                    }
                ],
            }
        )

    async def http_error(request: Request, exc: Any) -> Any:
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
        return error_response(err, "tei" if path in ("/", "/predict", "/info") else "ours")

    async def health(request: Request) -> Any:
        if service.load_error:
            return JSONResponse({"status": "failed", "error": service.load_error}, status_code=503)
        if service.draining:
            return JSONResponse({"status": "draining"}, status_code=503)
        if not service.ready:
            return JSONResponse({"status": "loading"}, status_code=503)
        return JSONResponse({"status": "ok"})

    async def metrics(request: Request) -> Any:
        gauges = {
            "mlx_slm_queue_items": ("Items waiting in the queue.", service.depth),
            "mlx_slm_inflight_requests": ("Accepted requests not yet answered.", service.inflight),
            "mlx_slm_ready": ("1 when the model is loaded and warmed.", 1 if service.ready else 0),
            "mlx_slm_draining": ("1 after SIGTERM.", 1 if service.draining else 0),
        }
        return PlainTextResponse(m.render(gauges), media_type="text/plain; version=0.0.4")

    async def openapi(request: Request) -> Any:
        return JSONResponse(OPENAPI)

    @asynccontextmanager
    async def lifespan(app: Any):  # type: ignore[no-untyped-def]
        if start_worker and service.thread is None:
            service.start()
        try:
            yield
        finally:
            await run_in_threadpool(service.stop)

    from starlette.exceptions import HTTPException as StarletteHTTPException

    return Starlette(
        routes=[
            Route("/v1/classify", classify, methods=["POST"]),
            Route("/classify", vllm_classify, methods=["POST"]),
            Route("/predict", tei_predict, methods=["POST"]),
            Route("/", tei_predict, methods=["POST"]),
            Route("/info", tei_info, methods=["GET"]),
            Route("/v1/models", vllm_models, methods=["GET"]),
            Route("/v1/model", model_info, methods=["GET"]),
            Route("/health", health, methods=["GET"]),
            Route("/metrics", metrics, methods=["GET"]),
            Route("/openapi.json", openapi, methods=["GET"]),
        ],
        lifespan=lifespan,
        exception_handlers={StarletteHTTPException: http_error},
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


__all__ = ["HTTPError", "Loaded", "Metrics", "ServeOptions", "Service", "classifier_loader", "create_app", "run_server"]
