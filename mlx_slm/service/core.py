"""The service core behind `mlx-slm serve`, without HTTP (the router is the `server` package).

`Service` is a thin facade over the parts, each in its own module: the task cache
(`tasks.TaskCache`: classifiers per task, their checks and calibration), the scheduler
(`scheduler.Scheduler`: the bounded queue, admission, micro-batching and deadlines on one
worker thread), and the measures (`metrics.Metrics`, `metrics.RateTracker`). It owns the
lifecycle (load on the worker thread, warm-up, readiness, stop) and one request's path:
task -> tokenize -> submit -> wait -> calibrate. Failures are `errors.ServiceError` kinds.

A timed-out request never holds up the next one: see `Scheduler` ("Deadlines"). The steps before
admission (the task built, its choices and the texts tokenized, the worker's classifier for the
task built) run in threads off the worker, each under the request's deadline (`_in_time`): a
request whose choices take long to tokenize times out there, and the worker never sees it.
"""

from __future__ import annotations

import asyncio
import threading
import time
import traceback
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from ..classifier.pipeline import item_cost, prefix_hit
from ..ground.errors import UserError
from .api import Answer, Call, Loaded, ServeOptions, TaskSpec
from .errors import ClientGone, Draining, Failed, Invalid, NotReady, TimedOut
from .keys import DECIDE_KEY, TaskKey
from .metrics import Metrics, attention_share
from .scheduler import Job, Scheduler, post_to, row_work
from .tasks import TaskCache


async def _in_thread(fn: Callable[..., Any], *args: Any) -> Any:
    return await asyncio.get_running_loop().run_in_executor(None, fn, *args)


async def _in_time(timeout: float, started: float, whole: str, fn: Callable[..., Any], *args: Any) -> Any:
    """`fn(*args)` in a thread, waited for until `started` + `timeout`: then `TimedOut` (the thread
    finishes on its own; its result, a task in a cache, serves the next request of that task)."""
    left = timeout - (time.perf_counter() - started)
    try:
        return await asyncio.wait_for(_in_thread(fn, *args), timeout=max(0.0, left))
    except asyncio.TimeoutError:
        raise TimedOut(
            f"not answered within the request timeout of {timeout:g} s (preparing the request took it all): "
            "retry, or send fewer or shorter texts and choices",
            whole,
        ) from None


class Service:
    """Lifecycle and one request's path over the task cache and the scheduler. A front end
    calls `require_ready` and `classify`; the failures are `ServiceError`s. The queue's state
    (`depth`, `inflight`, `draining`) and drain (`begin_drain`, `wait_idle`, `abort_pending`)
    are the scheduler's, named here for the front ends."""

    def __init__(self, loader: Callable[[], Loaded], options: ServeOptions | None = None):
        self.loader, self.opts = loader, options or ServeOptions()
        self.metrics = Metrics()
        self.tasks = TaskCache(self.opts.task_cache)
        self.tasks.state_cache = self.opts.state_cache
        self.scheduler = Scheduler(self.opts, self.metrics, self.tasks)
        self.ready = False
        self.load_error: str | None = None  # why the service cannot answer (the load failed, or the worker died)
        self.worker_error: str | None = None  # the worker died after loading (a bug: the process exits 70)
        self.thread: threading.Thread | None = None
        self.on_fatal: Callable[[str], None] | None = None
        self._open: set[Job] = set()  # accepted requests not yet answered: failed at once if the worker dies
        self._open_lock = threading.Lock()

    # ---------------------------------------------------------------- lifecycle
    def start(self) -> None:
        self.thread = threading.Thread(target=self._main, name="mlx-slm-worker", daemon=True)
        self.thread.start()

    def stop(self, timeout: float | None = None) -> bool:
        """Stop the worker at its next batch boundary and wait for it (None: the request timeout,
        a micro-batch's bound, plus 10 s); whether it is gone. It must be before the interpreter
        exits: a thread inside MLX then aborts the process ("terminate called without ...")."""
        self.scheduler.stop()
        if self.thread is None:
            return True
        self.thread.join(self.opts.request_timeout_s + 10.0 if timeout is None else timeout)
        return not self.thread.is_alive()

    def _main(self) -> None:
        try:
            self._load()
        except BaseException as e:  # noqa: BLE001 - reported on /health and by the CLI
            # a user's error is its message (no class name: the CLI and /health show it as it is)
            self.load_error = str(e) if isinstance(e, UserError) else f"{type(e).__name__}: {e}"
            if self.on_fatal is not None:
                self.on_fatal(self.load_error)
            return
        self.ready = True
        try:
            self.scheduler.loop()
        except BaseException as e:  # noqa: BLE001 - a dead worker must not sit behind a 200 /health
            self._worker_died(e)

    def _worker_died(self, e: BaseException) -> None:
        """The worker loop raised (a bug): /health turns 503 naming it, every waiting request is
        answered at once, and the front end is told to stop (the CLI exits 70)."""
        traceback.print_exception(e)  # into the server's log
        self.ready = False
        self.worker_error = self.load_error = (
            f"the model worker stopped ({type(e).__name__}: {e}): this is a bug in mlx-slm; restart the server, "
            "and report it with the traceback in the log"
        )
        with self._open_lock:
            jobs = list(self._open)
        err = Failed(self.worker_error)
        for job in jobs:
            job.cancelled = True
            post_to(job, job.fail, err)
        if self.on_fatal is not None:
            self.on_fatal(self.worker_error)

    def _load(self) -> None:
        loaded = self.loader()
        self.tasks.load(loaded)
        # Long items are priced with their attention (quadratic in length), from the model's shape.
        self.scheduler.speed.attention = attention_share(loaded.clf.engine.model.args)
        warm_up(self.tasks, self._note_speed)

    def _note_speed(self, seconds: float, tokens: int) -> None:
        """Fold one measured batch into the scheduler's time estimate."""
        self.scheduler.speed.observe(tokens, seconds)

    def require_loaded(self) -> None:
        """Raise `NotReady` until the model is loaded and warmed (or with why it failed)."""
        if not self.ready:
            raise NotReady(self.load_error or "the model is loading", retry_after=5)

    def require_ready(self) -> None:
        """Raise `Draining` once shutting down, else `NotReady` until loaded: before a request."""
        if self.draining:
            raise Draining("the server is shutting down: not accepting new requests", retry_after=5)
        self.require_loaded()

    # ---------------------------------------------------------------- tasks (the cache's)
    @property
    def loaded(self) -> Loaded | None:
        return self.tasks.loaded

    @property
    def default_key(self) -> TaskKey:
        return self.tasks.default_key

    def task_key(self, labels: Sequence[str] | None, system: Any, template: str | None, truncate: Any) -> TaskKey:
        return self.tasks.key(labels, system, template, truncate)

    def front_classifier(self, key: TaskKey) -> Any:
        return self.tasks.front(key)

    def _back_classifier(self, key: TaskKey) -> Any:
        return self.tasks.back(key)

    def calibration_for(self, key: TaskKey) -> tuple[Any, float | None]:
        return self.tasks.calibration_for(key)

    # ---------------------------------------------------------------- one request
    async def classify(self, texts: list[Any], spec: TaskSpec, call: Call) -> Answer:
        """Run one request's texts (strings, or (text, pair) tuples; a rerank's (query, document))
        on the worker and wait for them (until the call's start plus the request timeout, or until
        `call.gone()` completes: the caller left)."""
        key, front = await self._before(call, self.tasks.for_request, spec)
        # Tokenized once, here: the worker runs these very items (`Classifier.run_items`).
        prepared = await self._before(call, front.prepare, texts)
        # The worker's classifier of a new task (its labels or choices tokenized again, on the
        # engine's tokenizer) is built here too, never on the worker.
        await self._before(call, self.tasks.back, key)
        results = await self._run(key, front.kind, prepared, call)
        preds, calib = self.tasks.calibrate(key, spec, front, results)
        return Answer(preds, results, calib, front)

    def embedder(self, truncate: bool = False) -> Any:
        """The model's embedder on the front tokenizer (its pooling, dimension and limits, for a
        route's checks); `NotSupported` when the model does not embed."""
        return self.tasks.front(self.tasks.embed_key(truncate))

    async def embed(self, inputs: list[Any], call: Call, *, prompt: str, truncate: bool, token_ids: bool) -> list[Any]:
        """One request's texts (or lists of token ids, `token_ids`) embedded on the worker, each
        with `prompt` before it: their `embedder.Embedded` (the pooled vector, full size, not
        normalized) in input order. Errors, limits and timeouts as `classify`'s."""
        key = self.tasks.embed_key(truncate)
        front = await self._before(call, self.tasks.front, key)
        prep = front.prepare_ids if token_ids else lambda x: front.prepare(x, prompt)
        prepared = await self._before(call, prep, inputs)
        await self._before(call, self.tasks.back, key)
        results = await self._run(key, front, prepared, call)
        return [r[0] for r in results]

    async def decide(self, request: Any, *, started: float, gone: Callable[[], Awaitable[Any]] | None = None) -> Any:
        """One decision request (`text.decisions.questions.DecisionRequest`) as one item of the queue
        (`service.decide`): its `DecisionResult` (a probability array per question; None for one
        refused as over the context). Prepared on the front first, so a request that cannot run
        raises the `Decider`'s `DecisionError` (tokens_exceeded) unqueued. Limits as `classify`'s."""
        call = Call(("state",), "state", started, "", gone)
        front = await self._before(call, self.tasks.decider, True)
        item = await self._before(call, front.prepare, request)
        back = await self._before(call, self.tasks.decider, False)  # the worker's, built here, not on it
        got = await self._run(DECIDE_KEY, None, [item], call, [item.cost], [False], [back.work(item)])
        return self.metrics.decided(got[0][0].result)

    async def _before(self, call: Call, fn: Callable[..., Any], *args: Any) -> Any:
        """A step before admission, off the worker, within what the request has left."""
        return await _in_time(self.opts.request_timeout_s, call.started, call.whole, fn, *args)

    async def _run(
        self,
        key: TaskKey,
        kind: Any,
        prepared: Sequence[Any],
        call: Call,
        costs: Sequence[int] | None = None,
        hits: Sequence[bool] | None = None,
        works: Sequence[int] | None = None,
    ) -> list[Any]:
        """Prepared items through the queue and the worker: each item's (result, queue s,
        inference s), in input order; `Invalid` for the first item that cannot run. `costs`,
        `hits` and `works` (the tokens each runs, for the time estimate): given by a caller that
        is no classifier (decisions), else the batch plan's."""
        hint = call.truncate_hint
        for it, name in zip(prepared, call.names):
            if it.error:
                why = it.error.replace("--truncate head|tail|middle", hint).replace("--truncate", hint)
                raise Invalid(f"{name}: {why}", name)
        # Each item's cost in the micro-batch budget and the time estimate, by the batch plan's own rule.
        if hits is None:
            hits = [prefix_hit(kind, it) for it in prepared]
        if costs is None:
            costs = [item_cost(kind, it, h) for it, h in zip(prepared, hits)]
        if works is None:  # what each row runs beyond the plan's count (a label trie's other chunks)
            extra = row_work(kind) if kind is not None else 0
            works = [c + extra for c in costs]
        job = Job(len(prepared), asyncio.get_running_loop(), deadline=call.started + self.opts.request_timeout_s)
        job.names = list(call.names)
        with self._open_lock:
            self._open.add(job)
        try:
            self.submit(job, prepared, key, costs, hits, works)
            try:
                if self.worker_error:  # died between the readiness check and the queue
                    raise Failed(self.worker_error)
                await self._wait(job, call)
            finally:
                self.finished()
        finally:
            with self._open_lock:
                self._open.discard(job)
        return job.results

    async def _wait(self, job: Job, call: Call) -> None:
        """Until the job is answered; its error, `ClientGone` or `TimedOut` (its items dropped)."""
        waiter = asyncio.ensure_future(job.done.wait())
        left_f = asyncio.ensure_future(call.gone()) if call.gone is not None else None
        left = self.opts.request_timeout_s - (time.perf_counter() - call.started)
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
                call.whole,
            )
        if job.error is not None:
            raise job.error

    # ---------------------------------------------------------------- the queue (the scheduler's)
    @property
    def depth(self) -> int:
        return self.scheduler.depth

    @property
    def inflight(self) -> int:
        return self.scheduler.inflight

    @property
    def draining(self) -> bool:
        return self.scheduler.draining

    def stalled(self) -> str | None:
        """Why the worker is unhealthy now (one micro-batch past the request timeout), or None."""
        return self.scheduler.stalled()

    @draining.setter
    def draining(self, value: bool) -> None:
        self.scheduler.draining = value

    def submit(self, job: Job, items: Sequence[Any], key: TaskKey, costs: Sequence[int], *more: Sequence[Any]) -> None:
        """The scheduler's `submit` (its prefix hits and works after the costs)."""
        self.scheduler.submit(job, items, key, costs, *more)

    def cancel(self, job: Job) -> int:
        return self.scheduler.cancel(job)

    def finished(self) -> None:
        self.scheduler.finished()

    # ---------------------------------------------------------------- metrics and drain
    def metrics_text(self) -> str:
        """The metrics in Prometheus' text format, with the service's gauges (`service_gauges`)."""
        return self.metrics.render(service_gauges(self))

    def begin_drain(self) -> None:
        self.scheduler.begin_drain()

    def wait_idle(self, timeout: float) -> bool:
        return self.scheduler.wait_idle(timeout)

    def abort_pending(self) -> None:
        """The drain timed out: answer what is still waiting with `Aborted` (never computed)."""
        self.scheduler.abort_pending()


WARM_UP_LONG = 128  # words of the warm-up's long item (about 400 tokens)


def warm_up(tasks: TaskCache, note_speed: Callable[[float, int], None]) -> None:
    """One item through the whole path of the loaded model (`tasks`: it computes the default
    prompt head's KV, a one-off cost not measured), then a short, a longer and a long item
    measured (`note_speed(seconds, tokens)`), so that the time estimate knows both its fixed and
    its per-token cost from the start, the latter as long items pay it (a token of a 100-token
    item costs up to twice one of a 400-token item: small products, per-layer overheads). A
    model that only embeds warms up its embedder."""
    if tasks.classifies:
        clf = tasks.loaded.clf  # type: ignore[union-attr]
        sample = clf.spec.example_input  # a text, or a (query, document) pair for a reranker

        def run(text: str) -> Any:
            return clf.run([sample(text)], window=1)
    else:
        emb = tasks.back(tasks.embed_key(False))

        def run(text: str) -> Any:
            return emb.run_items(emb.prepare([text]))

    list(run("warm-up"))
    for text in ("warm-up", " ".join(["warm-up"] * 32), " ".join(["warm-up"] * WARM_UP_LONG)):
        t0 = time.perf_counter()
        got = run(text)
        list(got)
        note_speed(time.perf_counter() - t0, got.stats.processed_tokens)


def service_gauges(svc: Service) -> dict[str, tuple[str, float]]:
    """The gauges /metrics shows beside the counters: the queue, the requests in flight, the
    micro-batch the worker computes now (a timed-out request's included: in flight 0 and queue 0
    while the worker computed for nobody for 40 s said "idle"), readiness, draining."""
    gauges = {
        "mlx_slm_queue_items": ("Items waiting in the queue.", svc.depth),
        "mlx_slm_inflight_requests": ("Accepted requests not yet answered.", svc.inflight),
        "mlx_slm_running_items": (
            "Items of the micro-batch the model worker computes now (a timed-out request's included).",
            len(svc.scheduler.running),
        ),
        "mlx_slm_worker_busy_seconds": (
            "How long the model worker has been computing its current micro-batch (0: idle).",
            round(svc.scheduler.busy_seconds, 3),
        ),
        "mlx_slm_ready": ("1 when the model is loaded and warmed.", 1 if svc.ready else 0),
        "mlx_slm_draining": ("1 after SIGTERM.", 1 if svc.draining else 0),
    }
    return gauges
