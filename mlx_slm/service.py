"""The service core behind `mlx-slm serve`: it knows no HTTP (the router is `server.py`).

    front (the caller's event loop)                        model worker (one thread)
    task classifier from an LRU, tokenize  --> bounded queue --> gather (max items, token budget,
    on a front tokenizer, item checks          (QueueFull)       max wait) -> group by task ->
                                                                 Classifier.run -> answer each job

One worker thread owns the `Engine` (weights, tokenizer, prefix KV LRU) and runs every
forward pass through `Classifier.run`, the code path `mlx-slm classify` uses, so an answer
holds the same labels and probabilities. The front validates and counts tokens with
classifiers built on a *copy* of the tokenizer (its own lock), so admission never waits for
a forward pass. A request with its own `labels`/`system`/`template`/`truncate` gets a
classifier from a small LRU (one per task, all on the one engine); items of the same task
share batches and a prefix KV.

Failures are this module's own exceptions (`ServiceError` and its kinds), each carrying
what a front end needs to answer: the message, the request field at fault, a retry delay.
The HTTP layer maps each kind to a status in one table (`server.http_error`).

A timed-out request never holds up the next one: see `Service` ("Deadlines").
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import math
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

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


@dataclass
class TaskSpec:
    """A request's own task settings; None: the served task's (its labels, prompt, truncation)."""

    labels: list[str] | None = None
    system: str | None = None  # "": no system message
    template: str | None = None
    truncate: str | bool | None = None  # False: no truncation
    min_confidence: float | None = None


# --------------------------------------------------------------------------- errors


class ServiceError(Exception):
    """A request the service cannot answer. `field`: the request field at fault (None: the
    request as a whole); `retry_after`: seconds after which trying again may succeed."""

    def __init__(self, message: str, field: str | None = None, retry_after: int | None = None):
        super().__init__(message)
        self.message, self.field, self.retry_after = message, field, retry_after


class Invalid(ServiceError):
    """The request's task cannot be built, or one of its texts cannot be run (over the context)."""


class NotReady(ServiceError):
    """The model is loading, or failed to load."""


class Draining(ServiceError):
    """Shutting down: new requests are refused."""


class Aborted(ServiceError):
    """Accepted, then dropped uncomputed: the drain timed out."""


class QueueFull(ServiceError):
    """The request's items would take the queue past `max_queue_items`."""


class TimedOut(ServiceError):
    """Not answered within the request timeout, or could not be within what it had left."""


class ClientGone(ServiceError):
    """The caller went away while its request waited (its queued items are dropped)."""


class Failed(ServiceError):
    """The forward pass raised: a bug or the machine, never the request."""


# --------------------------------------------------------------------------- metrics

_BUCKETS = {
    "batch_items": (1, 2, 4, 8, 16, 32, 64, 128),
    "batch_tokens": (16, 32, 64, 128, 256, 512, 1024, 2048, 4096),
    "seconds": (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
}
_COUNTERS = (  # (name, attribute, help)
    ("mlx_slm_batches_total", "batches", "Micro-batches run by the model worker."),
    ("mlx_slm_prefix_cache_hits_total", "prefix_hits", "Items whose prompt starts with the cached prefix."),
    ("mlx_slm_prefix_cache_misses_total", "prefix_misses", "Items run without the prefix cache."),
    ("mlx_slm_prefix_cache_saved_tokens_total", "prefix_saved_tokens", "Prompt tokens the prefix cache saved."),
    ("mlx_slm_processed_tokens_total", "processed_tokens", "Tokens the forward ran (padding included)."),
    ("mlx_slm_padding_tokens_total", "padding_tokens", "Padding tokens among them."),
)
_HISTOGRAMS = {  # name: (buckets, help)
    "mlx_slm_batch_items": ("batch_items", "Items per micro-batch."),
    "mlx_slm_batch_tokens": ("batch_tokens", "Padded suffix tokens per micro-batch."),
    "mlx_slm_queue_seconds": ("seconds", "Time an item waited in the queue."),
    "mlx_slm_inference_seconds": ("seconds", "Compute time of the micro-batch an item ran in."),
    "mlx_slm_request_seconds": ("seconds", "End-to-end time of answered requests."),
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
    """Counters and histograms, thread-safe, written out in Prometheus' text format here: the
    text is a snapshot taken under the one lock, and no client library is needed. It is a
    serialisation, not HTTP, so it lives with the counters (the router only serves it)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests: dict[str, int] = {}
        self.items: dict[str, int] = {}
        self.prefix_hits = self.prefix_misses = self.prefix_saved_tokens = self.batches = 0
        self.processed_tokens = self.padding_tokens = 0
        self.hist = {name: _Histogram(_BUCKETS[b]) for name, (b, _) in _HISTOGRAMS.items()}

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
            for name, attr, help_ in _COUNTERS:
                out += [f"# HELP {name} {help_}", f"# TYPE {name} counter", f"{name} {getattr(self, attr)}"]
            for name, (help_, v) in gauges.items():
                out += [f"# HELP {name} {help_}", f"# TYPE {name} gauge", f"{name} {v:g}"]
            for name, h in self.hist.items():
                out += [f"# HELP {name} {_HISTOGRAMS[name][1]}", f"# TYPE {name} histogram"]
                for b, c in zip(h.buckets, h.counts):
                    out.append(f'{name}_bucket{{le="{b:g}"}} {c}')
                out += [f'{name}_bucket{{le="+Inf"}} {h.n}', f"{name}_sum {h.sum:.6f}", f"{name}_count {h.n}"]
        return "\n".join(out) + "\n"

    def record_batch(self, items: Sequence[_WorkItem], stats: Any, t0: float, seconds: float) -> None:
        """One micro-batch run: its items, the run's token figures and its compute time."""
        with self.lock:
            self.batches += 1
            self.prefix_hits += sum(it.prefix_hit for it in items)
            self.prefix_misses += sum(not it.prefix_hit for it in items)
            self.prefix_saved_tokens += max(0, stats.prefix_saved_tokens)
            self.processed_tokens += stats.processed_tokens
            self.padding_tokens += stats.padding_tokens
            self.hist["mlx_slm_batch_items"].observe(len(items))
            self.hist["mlx_slm_batch_tokens"].observe(len(items) * max(it.cost for it in items))
            self.hist["mlx_slm_inference_seconds"].observe(seconds)
            for it in items:
                self.hist["mlx_slm_queue_seconds"].observe(t0 - it.t_enqueued)
        self.count(self.items, "ok", len(items))


class RateTracker:
    """A micro-batch's compute time as `fixed + per_token * tokens`, fitted on measured batches.

    A cost per token alone (seconds over tokens) charges a batch's fixed cost (dispatch, the
    label pass, Python) to its tokens: after a few one-word requests it priced a 300-word text
    at 13 s when it took 2 s, and the service refused it (504). Here each size class (tokens
    rounded down to a power of two) keeps a moving average of its (tokens, seconds), so a run
    of small batches refreshes the small end without erasing what longer ones showed, and the
    least-squares line through the classes' averages gives both terms. The warm-up measures a
    short and a longer item, so both ends are known from the start. Not thread-safe: only the
    worker thread writes it."""

    ALPHA = 0.3  # weight of a new batch in its size class's moving average

    def __init__(self) -> None:
        self._by_size: dict[int, tuple[float, float]] = {}  # size class: (mean tokens, mean seconds)
        self.fixed = 0.0  # seconds per micro-batch, whatever its size
        self.per_token = 0.0  # seconds per processed token

    @property
    def known(self) -> bool:
        """Whether any batch has been measured (before that, no estimate binds)."""
        return bool(self._by_size)

    def observe(self, tokens: int, seconds: float) -> None:
        """Fold one measured micro-batch (processed tokens, compute seconds) into the fit."""
        if tokens <= 0 or seconds <= 0:
            return
        c, a = int(tokens).bit_length(), self.ALPHA
        old = self._by_size.get(c)
        self._by_size[c] = (
            (float(tokens), seconds)
            if old is None
            else (old[0] + a * (tokens - old[0]), old[1] + a * (seconds - old[1]))
        )
        self.fixed, self.per_token = _fit_line(list(self._by_size.values()))

    def estimate(self, tokens: int) -> float:
        """Seconds a micro-batch of `tokens` processed tokens should take (0 before any measure)."""
        return self.fixed + self.per_token * tokens if self.known else 0.0

    def tokens_within(self, seconds: float) -> int | None:
        """The most tokens a micro-batch may hold to take about `seconds` (at least 1); None
        when the size does not measurably matter (nothing measured, or no per-token cost)."""
        if self.per_token <= 0:
            return None
        return max(1, int((seconds - self.fixed) / self.per_token))


def _fit_line(points: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """(intercept, slope) of the least-squares line through (tokens, seconds) points, both kept
    non-negative: a line that would cost a small batch less than nothing goes through the origin
    instead; points that show no growth with size give a fixed cost only (their mean)."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    vxx = sum((x - mx) ** 2 for x, _ in points)
    if vxx > 0:
        slope = sum((x - mx) * (y - my) for x, y in points) / vxx
        if slope <= 0:
            return my, 0.0
        if my - slope * mx >= 0:
            return my - slope * mx, slope
    return 0.0, sum(x * y for x, y in points) / sum(x * x for x, _ in points)


# --------------------------------------------------------------------------- the task cache

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class LRU(Generic[K, V]):
    """A least-recently-used map of at most `capacity` entries; the pinned key (the served
    task) is never evicted. Not thread-safe: its owner holds the lock that guards it."""

    def __init__(self, capacity: int, pinned: K | None = None):
        self.capacity, self.pinned = max(1, capacity), pinned
        self._d: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K, make: Callable[[], V]) -> V:
        """The value for `key`, made by `make()` (and kept) on a miss; a hit becomes the newest."""
        if key in self._d:
            self._d.move_to_end(key)
            return self._d[key]
        value = self._d[key] = make()
        while len(self._d) > self.capacity:
            k = next(iter(self._d))
            if k == self.pinned:
                self._d.move_to_end(k)
                k = next(iter(self._d))
            self._d.pop(k)
        return value

    def __contains__(self, key: object) -> bool:
        return key in self._d

    def __len__(self) -> int:
        return len(self._d)


# --------------------------------------------------------------------------- jobs


class _Job:
    """One accepted request: its items' results arrive from the worker on the event loop."""

    def __init__(self, n: int, loop: asyncio.AbstractEventLoop, deadline: float = math.inf):
        self.results: list[Any] = [None] * n
        self.remaining = n
        self.loop = loop
        self.deadline = deadline  # time.perf_counter() when the request times out
        self.names: list[str] = []  # the items' field names ("text", "texts[3]"), for messages
        self.done = asyncio.Event()
        self.cancelled = False  # client gone or timed out: its queued items are dropped
        self.error: ServiceError | None = None

    def deliver(self, index: int, value: Any) -> None:  # on the loop
        if self.results[index] is None:
            self.results[index] = value
            self.remaining -= 1
            if self.remaining == 0:
                self.done.set()

    def fail(self, err: ServiceError) -> None:  # on the loop
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


@dataclass
class Answer:
    """One request's outcome: calibrated predictions in input order, each item's (prediction,
    queue s, inference s) from the worker, the run's `Calibration`, the task's front classifier."""

    predictions: list[Any]
    raw: list[Any]
    calibration: Any
    classifier: Any


async def _in_thread(fn: Callable[..., Any], *args: Any) -> Any:
    return await asyncio.get_running_loop().run_in_executor(None, fn, *args)


# --------------------------------------------------------------------------- the service


class Service:
    """Lifecycle, the bounded queue, the micro-batching worker, the task LRU and drain.
    A front end calls `require_ready` and `classify`; the failures are `ServiceError`s.

    Deadlines: one worker runs every forward pass, and a forward pass cannot be stopped
    once started, so a request that times out must not leave long work behind that the
    next request then waits for. Four rules keep the queue moving:

    1. Every job carries its deadline (arrival + --request-timeout). Before each micro-batch
       the worker drops the waiting items of jobs that are past it or cancelled (client gone,
       timed out): they are never computed (counted as `dropped` in the metrics).
    2. A micro-batch is bounded in time, not only in items and tokens: its estimated time (a
       fixed cost plus its padded tokens at the cost per token) stays under
       `BATCH_TIME_FRACTION` (1/4) of the request timeout (at least one item). So after a timeout, the work still running for it ends
       within about a quarter of a timeout, and the next request is computed then.
    3. An item whose own estimated compute time is more than its request has left is never
       started: the request gets its `TimedOut` at once, naming the item, instead of a forward
       pass that would outlive the request and block the worker.
    4. The estimate (`RateTracker`: a fixed cost per micro-batch and a cost per processed
       token, fitted by least squares) is measured on the warm-up (a short and a longer item)
       and on every micro-batch, so it follows the machine and the model. A per-token rate
       alone would charge the fixed cost to the tokens and refuse long items that fit.

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
        self._front: LRU[tuple, Any] = LRU(self.opts.task_cache)  # classifiers on the front tokenizer
        self._front_lock = threading.Lock()
        self._back: LRU[tuple, Any] = LRU(self.opts.task_cache)  # classifiers on the engine (worker only)
        self._rate = 0.0  # recent items/s, for Retry-After
        self.speed = RateTracker()  # measured compute time per micro-batch: fixed + per token
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
        self._front.pinned = self._back.pinned = self.default_key
        self._back.get(self.default_key, lambda: clf)
        # The front: the same model object, a copy of the tokenizer with its own lock, so
        # request handlers tokenize while the worker runs a forward pass.
        front_engine = Engine(clf.engine.model, copy.deepcopy(clf.engine.tokenizer), clf.engine.path)
        self.front_engine = front_engine
        self._front.get(self.default_key, lambda: self._build(front_engine, self.default_key))
        # Warm up: one item through the whole path (computes the default prompt head's KV, a
        # one-off cost not measured), then a short and a longer item measured, so that the
        # time estimate knows both its fixed and its per-token cost from the start.
        list(clf.run(["warm-up"], window=1))
        for text in ("warm-up", " ".join(["warm-up"] * 32)):
            t0 = time.perf_counter()
            run = clf.run([text], window=1)
            list(run)
            self._note_speed(time.perf_counter() - t0, run.stats.processed_tokens)

    def require_loaded(self) -> None:
        """Raise `NotReady` until the model is loaded and warmed (or with why it failed)."""
        if not self.ready:
            raise NotReady(self.load_error or "the model is loading", retry_after=5)

    def require_ready(self) -> None:
        """Raise `Draining` once shutting down, else `NotReady` until loaded: before a request."""
        if self.draining:
            raise Draining("the server is shutting down: not accepting new requests", retry_after=5)
        self.require_loaded()

    def _note_speed(self, seconds: float, tokens: int) -> None:
        """Fold one measured batch into the time estimate (rules 2-4)."""
        self.speed.observe(tokens, seconds)

    def _time_budget(self) -> int | None:
        """Padded tokens one micro-batch may hold so that it takes about `BATCH_TIME_FRACTION`
        of the request timeout (None: no estimate yet)."""
        return self.speed.tokens_within(BATCH_TIME_FRACTION * self.opts.request_timeout_s)

    # ---------------------------------------------------------------- tasks and calibration
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
        return Classifier(engine, labels, system, template, **kw)

    def front_classifier(self, key: tuple) -> Any:
        """The task's classifier on the front tokenizer (validation and token counts); a task
        that cannot be built raises the classifier's `LabelError` / `PromptError`."""
        with self._front_lock, self.front_engine.lock:  # construction tokenizes too
            return self._front.get(key, lambda: self._build(self.front_engine, key))

    def _back_classifier(self, key: tuple) -> Any:
        engine = self.loaded.clf.engine  # type: ignore[union-attr]

        def make() -> Any:
            with engine.lock:
                return self._build(engine, key)

        return self._back.get(key, make)

    def _task_classifier(self, spec: TaskSpec) -> tuple[tuple, Any]:
        """(key, front classifier) of a request's task, or `Invalid` naming the request field at
        fault, taken from the check that failed (`_check_task`; then a `LabelError` from building
        is the labels', a `PromptError` the prompt's: over the context)."""
        from .labels import LabelError

        key = self.task_key(spec.labels, spec.system, spec.template, spec.truncate)
        if key not in self._front:  # a new task: its parts checked one by one first
            self._check_task(key)
        try:
            return key, self.front_classifier(key)
        except LabelError as e:  # tokenizes to nothing, two alike, one too long for the context
            raise Invalid(str(e), "labels") from None
        except ValueError as e:  # PromptError: the fixed prompt is over the context: the part the request set
            fld = "template" if spec.template is not None else "system" if spec.system is not None else "labels"
            raise Invalid(str(e), fld) from None

    def _check_task(self, key: tuple) -> None:
        """The checks a classifier runs on its task's parts, one part at a time, so that a
        failure names its field: the labels alone, the labels against their descriptions,
        then the template."""
        from .labels import LabelError
        from .labels import validate as validate_labels
        from .prompts import PromptError, PromptFormat, fill_labels

        labels, system, template, _ = key
        descriptions = self.loaded.clf_kwargs.get("label_descriptions")  # type: ignore[union-attr]
        for fld, check in (
            ("labels", lambda: validate_labels(labels)),
            ("labels", lambda: fill_labels(system, labels, descriptions)),
            ("template", lambda: PromptFormat(system, template)),
        ):
            try:
                check()
            except (LabelError, PromptError) as e:
                raise Invalid(str(e), fld) from None

    def calibration_for(self, key: tuple) -> tuple[Any, float | None]:
        """(CalibrationSpec, min_confidence) for a task: a fitted prior applies only to the
        default task (other labels or prompt: it means nothing there); 'batch' applies per request."""
        from .calibration import CalibrationSpec

        ld = self.loaded
        spec = CalibrationSpec.of(ld.calibration, warmup=ld.warmup)  # type: ignore[union-attr]
        if key != self.default_key and spec.fitted:
            spec = CalibrationSpec(warmup=spec.warmup)
        return spec, ld.min_confidence  # type: ignore[union-attr]

    def _calibrate(self, key: tuple, spec: TaskSpec, front: Any, raw: list[Any]) -> tuple[list[Any], Any]:
        """A request's predictions through its task's calibration (one `Calibration` per request)."""
        cal, conf = self.calibration_for(key)
        if spec.min_confidence is not None:
            conf = spec.min_confidence
        calib = cal.run(front.labels, conf)
        return list(calib(r[0] for r in raw)), calib

    # ---------------------------------------------------------------- one request
    async def classify(
        self,
        texts: list[str],
        spec: TaskSpec,
        *,
        names: list[str],
        whole: str,
        truncate_hint: str,
        started: float,
        gone: Callable[[], Awaitable[Any]] | None = None,
    ) -> Answer:
        """Run one request's texts on the worker and wait for them (until `started` plus the
        request timeout, or until what `gone()` returns completes: the caller left). `names`: each text's
        field, for errors; `whole`: the field a timeout names; `truncate_hint`: how the caller's
        API asks for truncation (it replaces the CLI's `--truncate ...` in messages)."""
        key, front = await _in_thread(self._task_classifier, spec)
        prepared = await _in_thread(front.prepare, texts)
        for it, name in zip(prepared, names):
            if it.error:
                raise Invalid(f"{name}: {it.error.replace('--truncate head|tail|middle', truncate_hint)}", name)
        p = len(front.prefix_tokens)
        hits = [bool(p) and tuple(it.ids[:p]) == front.prefix_tokens for it in prepared]
        # The label trie runs beside every row's prompt: its nodes count in the micro-batch budget
        # and the time estimate, as in the classifier's own batch plan.
        costs = [len(it.ids) - (p if h else 0) + front.row_extra for it, h in zip(prepared, hits)]
        job = _Job(len(texts), asyncio.get_running_loop(), deadline=started + self.opts.request_timeout_s)
        job.names = names
        self.submit(job, texts, key, costs, hits)
        try:
            await self._wait(job, started, whole, gone)
        finally:
            self.finished()
        preds, calib = self._calibrate(key, spec, front, job.results)
        return Answer(preds, job.results, calib, front)

    async def _wait(self, job: _Job, started: float, whole: str, gone: Callable[[], Awaitable[Any]] | None) -> None:
        """Until the job is answered; its error, `ClientGone` or `TimedOut` (its items dropped)."""
        waiter = asyncio.ensure_future(job.done.wait())
        left_f = asyncio.ensure_future(gone()) if gone is not None else None
        left = self.opts.request_timeout_s - (time.perf_counter() - started)
        futs = {waiter} | ({left_f} if left_f is not None else set())
        await asyncio.wait(futs, timeout=max(0.0, left), return_when=asyncio.FIRST_COMPLETED)
        for f in futs:
            f.cancel()
        if not job.done.is_set():
            self.cancel(job)
            if left_f is not None and left_f.done() and not left_f.cancelled():
                raise ClientGone("the client closed the connection")
            raise TimedOut(
                f"not answered within the request timeout of {self.opts.request_timeout_s:g} s: "
                "retry, or send fewer texts",
                whole,
            )
        if job.error is not None:
            raise job.error

    # ---------------------------------------------------------------- queue
    @property
    def depth(self) -> int:
        return len(self.queue)

    def submit(self, job: _Job, texts: Sequence[str], key: tuple, costs: Sequence[int], hits: Sequence[bool]) -> None:
        now = time.perf_counter()
        with self.cond:
            if self.draining:
                raise Draining("the server is shutting down: not accepting new requests", retry_after=5)
            if len(self.queue) + len(texts) > self.opts.max_queue_items:
                wait = len(self.queue) / self._rate if self._rate > 0 else 1.0
                raise QueueFull(
                    f"the queue holds {len(self.queue)} items (limit {self.opts.max_queue_items}); retry later",
                    retry_after=max(1, math.ceil(wait)),
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

    # ---------------------------------------------------------------- the worker
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
            if job.cancelled:  # client gone or timed out: never computed (counted where it was cancelled)
                dropped += job in refused
                continue
            if job.deadline <= now:
                dropped += 1
                continue
            est = self.speed.estimate(it.cost)
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
        """Rule 3: answer the request `TimedOut` now, and drop its waiting items, rather than
        start a forward pass that would outlive it."""
        job = it.job
        name = job.names[it.index] if job.names else f"texts[{it.index}]"
        err = TimedOut(
            f"{name} would take about {est:.2g} s to compute ({it.cost} tokens at the measured rate), more than "
            f"the {max(0.0, left):.2g} s left of the request timeout of {self.opts.request_timeout_s:g} s: "
            + self._timeout_advice(it, est),
            name,
        )
        self.cancel(job)
        _post_to(job, job.fail, err)

    def _timeout_advice(self, it: _WorkItem, est: float) -> str:
        """What the client can do about a refused item, from what it sent. An item reaching the
        worker is within the model's context already, so truncation would not shorten it:
        either the text alone outlasts the timeout, or it waited behind other work."""
        timeout = self.opts.request_timeout_s
        if est > timeout:
            return f"the text alone takes longer than the server's --request-timeout of {timeout:g} s: shorten it"
        waited = time.perf_counter() - it.t_enqueued
        fewer = ", or send fewer texts per request" if len(it.job.results) > 1 else ""
        return f"it waited {waited:.2g} s in the queue behind other work: retry{fewer}"

    def _run(self, key: tuple, items: list[_WorkItem]) -> None:
        m = self.metrics
        t0 = time.perf_counter()
        try:
            clf = self._back_classifier(key)
            run = clf.run([it.text for it in items], window=len(items))
            preds = list(run)
        except Exception as e:  # noqa: BLE001 - answered as a failure to the requests in this batch
            err = Failed(f"inference failed: {type(e).__name__}: {e}")
            for it in items:
                _post_to(it.job, it.job.fail, err)
            m.count(m.items, "error", len(items))
            return
        infer = time.perf_counter() - t0
        self._note_speed(infer, run.stats.processed_tokens)
        m.record_batch(items, run.stats, t0, infer)
        rate = len(items) / infer if infer > 0 else 0.0
        self._rate = rate if self._rate == 0 else 0.8 * self._rate + 0.2 * rate
        for it, p in zip(items, preds):
            _post_to(it.job, it.job.deliver, it.index, (p, t0 - it.t_enqueued, infer))

    # ---------------------------------------------------------------- metrics and drain
    def metrics_text(self) -> str:
        """The metrics in Prometheus' text format, with the service's gauges."""
        gauges = {
            "mlx_slm_queue_items": ("Items waiting in the queue.", self.depth),
            "mlx_slm_inflight_requests": ("Accepted requests not yet answered.", self.inflight),
            "mlx_slm_ready": ("1 when the model is loaded and warmed.", 1 if self.ready else 0),
            "mlx_slm_draining": ("1 after SIGTERM.", 1 if self.draining else 0),
        }
        return self.metrics.render(gauges)

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
        """The drain timed out: answer what is still waiting with `Aborted` (never computed)."""
        with self.cond:
            items, self.queue = list(self.queue), deque()
        err = Aborted("the server shut down before this request was computed (drain timeout)")
        for it in items:
            it.job.cancelled = True
            _post_to(it.job, it.job.fail, err)
        if items:
            self.metrics.count(self.metrics.items, "dropped", len(items))


__all__ = [
    "Aborted",
    "Answer",
    "ClientGone",
    "Draining",
    "Failed",
    "Invalid",
    "LRU",
    "Loaded",
    "Metrics",
    "NotReady",
    "QueueFull",
    "RateTracker",
    "ServeOptions",
    "Service",
    "ServiceError",
    "TaskSpec",
    "TimedOut",
    "classifier_loader",
]
