"""The scheduler: the bounded queue, admission, micro-batching and deadlines.

    front (the caller's event loop)                        model worker (one thread)
    the task's front classifier: tokenize  --> bounded queue --> gather (max items, token budget,
    once, into items; their costs (suffix      of items          max wait) -> group by task ->
    + the kind's extra tokens per row)         (QueueFull)       Classifier.run_items -> answer each job

One worker thread owns the `Engine` and runs every forward pass through `Classifier.run_items`,
the pipeline `mlx-slm classify` runs (`pipeline.run_items`), on the very token ids the front
tokenized (each text is tokenized once), so an answer holds the same labels and probabilities.
Results go back to each request's event loop (`Job`); the scheduler knows no HTTP.

Deadlines: one worker runs every forward pass, and a forward pass cannot be stopped
once started, so a request that times out must not leave long work behind that the
next request then waits for. Six rules keep the queue moving:

1. Every job carries its deadline (arrival + --request-timeout). Before each micro-batch
   the worker drops the waiting items of jobs that are past it or cancelled (client gone,
   timed out): they are never computed (counted as `dropped` in the metrics).
2. A micro-batch is bounded in time, not only in items and tokens: its estimated time (a
   fixed cost plus its padded tokens at the cost per token) stays under
   `BATCH_TIME_FRACTION` (1/4) of the request timeout (at least one item). So after a
   timeout, the work still running for it ends within about a quarter of a timeout, and
   the next request is computed then.
3. An item whose own estimated compute time is more than its request has left is never
   started: the request gets its `TimedOut` at once, naming the item, instead of a forward
   pass that would outlive the request and block the worker.
4. The estimate (`RateTracker`: a fixed cost per micro-batch and a cost per processed
   token, fitted by least squares) is measured on the warm-up (a short and a longer item)
   and on every micro-batch, so it follows the machine and the model. A per-token rate
   alone would charge the fixed cost to the tokens and refuse long items that fit. Tokens
   are weighed by their attention (quadratic in a row's length, scaled by the model's
   shape), so an item far longer than any measured is not priced as a short one.
5. A micro-batch's batches are taken as each finishes: once no request waits for the items
   still to run, the rest is abandoned between batches (`run_batch`); so is it once the
   server stops (`stop`: after SIGTERM's drain, nobody waits for it).
6. An item is priced with all it runs (`row_work`: every chunk of a label trie, not only the
   largest one the batch plan holds at once) and admitted by `admission` (`submit`), before it
   takes a place in the queue. An item cannot be split, so it holds the worker to its end:
   priced up to the whole timeout, one heavy chat of 300 long choices (15 s on a loaded
   2-core CPU, a 20 s timeout) left the requests queued behind it without the time to run
   (the 30-minute soak's 504s). So an item estimated over `ITEM_TIME_FRACTION` (1/2) of the
   request timeout is admitted only when nothing else is queued or running (it delays no one;
   refused 504 otherwise, worth a retry), and one estimated over the whole timeout is refused
   `TooSlow` (413: it cannot finish even alone, and a 504 would be retried in vain).
   The request's own steps before admission (its task built and its choices tokenized, its
   texts tokenized: `Service.classify`) run off the worker, under the request's deadline.

While a micro-batch runs, `running` holds its items and `batch_started` its start: the
metrics show the work in flight (`mlx_slm_running_items`, `mlx_slm_worker_busy_seconds`)
and /health answers 503 once one micro-batch has run past the request timeout (`stalled`).

With the default timeout (60 s) rule 2 never binds on the usual budgets (512 tokens on the
CPU, 4,096 on a GPU); it matters when --request-timeout is short next to a batch's time.
A single item is the unit that cannot be split: its forward, once started, runs to the end.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from .api import ServeOptions
from .decide import decision_budget
from .errors import Aborted, Draining, Failed, QueueFull, ServiceError, TimedOut, TooSlow
from .keys import DECIDE_KEY, TaskKey
from .metrics import Metrics, RateTracker
from .tasks import TaskCache

LOOKAHEAD = 1024  # waiting items the gatherer looks through for ones of similar length
BATCH_TIME_FRACTION = 0.25  # a micro-batch's estimated compute time stays under this share of the request timeout
ITEM_TIME_FRACTION = 0.5  # one item (it cannot be split) may hold the worker for at most this share of it


class Job:
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


def post_to(job: Job, fn: Callable[..., None], *args: Any) -> None:
    """Hand a result to the request's event loop (gone at shutdown: nobody is waiting then)."""
    try:
        job.loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:
        pass


def _longest(it: WorkItem) -> int:
    """An item's longest row, for its attention's cost: the item itself (a text), or what it says
    (a decision request: its state and its longest question, not all of them in one row)."""
    return getattr(it.item, "longest", None) or it.cost


@dataclass
class WorkItem:
    job: Job
    index: int
    item: Any  # the tokenized `predictions.Item` the front prepared (its ids are what runs)
    key: TaskKey
    cost: int  # suffix tokens (after the shared prefix) and the kind's tokens beside the row: the batch budget's
    prefix_hit: bool
    t_enqueued: float
    work: int | None = None  # tokens its forward runs in all (None: `cost`), for the time estimate (`row_work`)

    @property
    def tokens_run(self) -> int:
        """The tokens its forward runs: its cost and a trie's other chunks (`row_work`), or, for a
        decision request, its cost less the start of its state the state cache holds."""
        return self.cost if self.work is None else self.work


def row_work(kind: Any) -> int:
    """Tokens a row of `kind` runs beyond what the batch plan counts (`kind.row_extra`, what is
    held at once): a label trie of several chunks runs every chunk in turn beside the row (the
    plan counts the largest), the per-label passes each label's later tokens. 0 for other kinds.

    The time estimate must price them: a chat request of 1,500 choices (115 trie chunks) was
    priced as one chunk, 1/16 of its 2.4 s on the tiny model, so it was started with its request
    all but timed out and held the worker long after its 504 (issue 47)."""
    ls = getattr(kind, "labelset", None)
    if ls is None or ls.mode != "sequence":
        return 0
    extra = int(getattr(kind, "row_extra", 0))
    if extra > 0:  # the trie: every chunk in turn
        return sum(len(c) for c in ls.trie) - extra
    return sum(len(t) - 1 for t in ls.token_ids)


class Scheduler:
    """The bounded queue, admission (`submit`), the micro-batching worker loop (`loop`) and
    drain. The options are read live (a test or an operator may change them).

    Deadlines and the worker's state: see the module docstring.
    """

    def __init__(self, opts: ServeOptions, metrics: Metrics, tasks: TaskCache):
        self.opts, self.metrics, self.tasks = opts, metrics, tasks
        self.cond = threading.Condition()
        self.queue: deque[WorkItem] = deque()
        self.draining = False
        self.stopping = False
        self.inflight = 0  # accepted requests not yet answered
        self.speed = RateTracker()  # measured compute time per micro-batch: fixed + per token
        self._rate = 0.0  # recent items/s, for Retry-After
        self.running: list[WorkItem] = []  # the micro-batch the worker computes now
        self.batch_started: float | None = None  # its start (time.perf_counter()); None: idle
        self.busy = False  # a micro-batch has left the queue and is not done (admission's "idle")

    @property
    def busy_seconds(self) -> float:
        """How long the worker has been on its current micro-batch (0 when idle)."""
        t0 = self.batch_started
        return 0.0 if t0 is None else max(0.0, time.perf_counter() - t0)

    def stalled(self) -> str | None:
        """Why the worker is not healthy: one micro-batch has run past the request timeout (no
        batch should: each is bounded to a share of it, and an item priced over the time its
        request has left is never started); None when it is healthy."""
        busy = self.busy_seconds
        if busy <= self.opts.request_timeout_s:
            return None
        return (
            f"the model worker has been computing one micro-batch ({len(self.running)} item(s)) for {busy:.0f} s, "
            f"over the request timeout of {self.opts.request_timeout_s:g} s: requests wait behind it"
        )

    def _time_budget(self) -> int | None:
        """Padded tokens one micro-batch may hold so that it takes about `BATCH_TIME_FRACTION`
        of the request timeout (None: no estimate yet)."""
        return self.speed.tokens_within(BATCH_TIME_FRACTION * self.opts.request_timeout_s)

    def stop(self) -> None:
        """Let the worker loop return at its next batch boundary: what is still queued then is
        answered `Aborted`, never computed (the drain before it, SIGTERM's, has answered the rest)."""
        with self.cond:
            self.stopping = True
            self.cond.notify_all()

    # ---------------------------------------------------------------- queue
    @property
    def depth(self) -> int:
        return len(self.queue)

    def submit(
        self,
        job: Job,
        items: Sequence[Any],
        key: TaskKey,
        costs: Sequence[int],
        hits: Sequence[bool],
        works: Sequence[int] | None = None,
    ) -> None:
        """Queue a request's items (`works`: each item's tokens run in all, `row_work`; None:
        its cost), or refuse it whole: `Draining`, `QueueFull`, or by `admission` (rule 6)."""
        now = time.perf_counter()
        works = costs if works is None else works
        new = [WorkItem(job, i, items[i], key, c, hits[i], now, w) for i, (c, w) in enumerate(zip(costs, works))]
        with self.cond:
            if self.draining:
                raise Draining("the server is shutting down: not accepting new requests", retry_after=5)
            idle = not self.queue and not self.busy and not self.running
            for it in new:
                err = admission(it, self.speed.estimate(it.tokens_run, _longest(it)), self.opts.request_timeout_s, idle)
                if err is not None:
                    raise err
            if len(self.queue) + len(items) > self.opts.max_queue_items:
                wait = len(self.queue) / self._rate if self._rate > 0 else 1.0
                raise QueueFull(
                    f"the queue holds {len(self.queue)} items (limit {self.opts.max_queue_items}); retry later",
                    retry_after=max(1, math.ceil(wait)),
                )
            self.queue.extend(new)
            self.inflight += 1
            self.cond.notify_all()

    def cancel(self, job: Job) -> int:
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

    def gather(self) -> list[WorkItem] | None:
        """The next micro-batch: the oldest waiting item (so none starves), and the waiting
        items of the same task closest to it in length, within --max-batch-items and the
        padded-token budget (rows x longest suffix, as the classifier's planner counts);
        waits up to --max-wait-ms for more while the batch is not full."""
        o = self.opts
        budget = o.max_batch_tokens or self.tasks.loaded.clf.batching.max_batch_tokens or (1 << 30)  # type: ignore[union-attr]
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
                b = decision_budget(self.tasks, budget, tb) if self.queue[0].key == DECIDE_KEY else budget
                got, longest = self._select(b)
                full = len(got) >= o.max_batch_items or (len(got) + 1) * longest > b
                left = deadline - time.perf_counter()
                if full or left <= 0 or self.stopping or self.draining:
                    chosen = {id(it) for it in got}
                    self.queue = deque(it for it in self.queue if id(it) not in chosen)
                    self.busy = True
                    return got
                self.cond.wait(left)

    def _select(self, budget: int) -> tuple[list[WorkItem], int]:
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
    def loop(self) -> None:
        while True:
            got = self.gather()
            if got is None:
                return
            if self.stopping:  # shutting down: nothing more is computed (`stop`)
                self._abort(got + self._take_queue())
                return
            groups: OrderedDict[tuple, list[WorkItem]] = OrderedDict()
            for it in got:
                groups.setdefault(it.key, []).append(it)
            try:
                for key, items in groups.items():
                    items = self.runnable(items)
                    if items:
                        self.run_batch(key, items)
            finally:
                with self.cond:
                    self.busy = False

    def runnable(self, items: list[WorkItem]) -> list[WorkItem]:
        """The items still worth computing now (rules 1 and 3 in the class docstring)."""
        now = time.perf_counter()
        out: list[WorkItem] = []
        refused: list[Job] = []
        dropped = 0
        for it in items:
            job = it.job
            if job.cancelled:  # client gone or timed out: never computed (counted where it was cancelled)
                dropped += job in refused
                continue
            if job.deadline <= now:
                dropped += 1
                continue
            est = self.speed.estimate(it.tokens_run, _longest(it))
            if est > job.deadline - now:  # rule 3: answered now and its waiting items dropped, not started
                refused.append(job)
                self.cancel(job)
                post_to(job, job.fail, too_slow(it, est, job.deadline - now, self.opts.request_timeout_s))
                dropped += 1
                continue
            out.append(it)
        dropped += sum(it.job in refused for it in out)
        if dropped:
            self.metrics.count(self.metrics.items, "dropped", dropped)
        return [it for it in out if it.job not in refused]

    def run_batch(self, key: TaskKey, items: list[WorkItem]) -> None:
        with self.cond:
            self.running, self.batch_started = list(items), time.perf_counter()
        try:
            self._run_batch(key, items)
        finally:
            with self.cond:
                self.running, self.batch_started = [], None

    def _run_batch(self, key: TaskKey, items: list[WorkItem]) -> None:
        m = self.metrics
        t0 = time.perf_counter()
        try:
            clf = self.tasks.back(key)
            # Numbered within this micro-batch (items of several requests share it), in queue order;
            # each of the classifier's batches as it finishes: once no request waits for the items
            # still to run (timed out, client gone), the rest is abandoned between batches.
            run = clf.run_items([replace(it.item, index=k) for k, it in enumerate(items)], ordered=False)
            preds: dict[int, Any] = {}
            for p in run:
                preds[p.index] = p
                if len(preds) < len(items) and not self._awaited(items, preds):
                    break
        except Exception as e:  # noqa: BLE001 - answered as a failure to the requests in this batch
            err = Failed(f"inference failed: {type(e).__name__}: {e}")
            for it in items:
                post_to(it.job, it.job.fail, err)
            m.count(m.items, "error", len(items))
            return
        infer = time.perf_counter() - t0
        self.speed.observe(run.stats.processed_tokens, infer, max(_longest(it) for it in items))
        m.record_batch([it for i, it in enumerate(items) if i in preds], run.stats, t0, infer)
        rate = len(preds) / infer if infer > 0 else 0.0
        self._rate = rate if self._rate == 0 else 0.8 * self._rate + 0.2 * rate
        for i, it in enumerate(items):
            if i in preds:
                post_to(it.job, it.job.deliver, it.index, (preds[i], t0 - it.t_enqueued, infer))
        if len(preds) < len(items):
            m.count(m.items, "dropped", len(items) - len(preds))
        late = sum(
            1 for i, it in enumerate(items) if i in preds and (it.job.cancelled or it.job.deadline <= t0 + infer)
        )
        if late:  # computed, but its request had timed out or gone by the time its batch ended
            m.count(m.items, "late", late)

    def _awaited(self, items: list[WorkItem], done: dict[int, Any]) -> bool:
        """Whether a request still waits for an item not yet computed (not cancelled, not past
        its deadline), and the server is not stopping."""
        if self.stopping:
            return False
        now = time.perf_counter()
        return any(not it.job.cancelled and it.job.deadline > now for i, it in enumerate(items) if i not in done)

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
        """The drain timed out: answer what is still waiting with `Aborted` (never computed). The
        micro-batch running now finishes for whoever still waits for it (the "one batch" past the
        drain timeout; no longer than its requests' timeout), unless the server stops first."""
        self._abort(self._take_queue())

    def _take_queue(self) -> list[WorkItem]:
        with self.cond:
            items, self.queue = list(self.queue), deque()
        return items

    def _abort(self, items: list[WorkItem]) -> None:
        """Answer `items` with `Aborted` (never computed: counted dropped)."""
        err = Aborted("the server shut down before this request was computed (drain timeout)")
        for it in items:
            it.job.cancelled = True
            post_to(it.job, it.job.fail, err)
        if items:
            self.metrics.count(self.metrics.items, "dropped", len(items))


def admission(it: WorkItem, est: float, timeout: float, idle: bool) -> ServiceError | None:
    """Rule 6, an item at the door (`est`: its estimated compute time; `idle`: nothing else is
    queued or running): `TooSlow` when it cannot finish within the request `timeout` even alone
    (no retry helps: 413); `TimedOut` (504, worth a retry) when it would hold the worker for over
    `ITEM_TIME_FRACTION` of the timeout while other requests wait or run; None: admitted. So one
    long item runs when it delays no one: jevcompat's 255-option choice, priced at 43 s with
    nothing else queued, was refused 504 against a 30 s share that protected no one."""
    name = _name(it)
    said = f"{name} would take about {est:.2g} s to compute ({_work(it)} at the measured rate)"
    if est > timeout:
        return TooSlow(
            f"{said}, more than the server's --request-timeout of {timeout:g} s even with nothing else to run: "
            f"{_shorter(it)}, or start the server with a larger --request-timeout",
            name,
        )
    if est > ITEM_TIME_FRACTION * timeout and not idle:
        return TimedOut(
            f"{said}, over half the --request-timeout of {timeout:g} s while other requests wait or run: an item "
            f"holds the worker to its end, so one this long runs only when nothing else does: retry later, or "
            f"{_shorter(it)}",
            name,
        )
    return None


def too_slow(it: WorkItem, est: float, left: float, timeout: float) -> ServiceError:
    """Rule 3, at the worker: the error of an item whose estimate is over the `left` seconds its
    request has: `TooSlow` if it is over the whole timeout too (the estimate grew since its
    admission), else `TimedOut`, as it waited behind other work (worth a retry)."""
    if est > timeout:
        return admission(it, est, timeout, True)  # type: ignore[return-value]
    waited = time.perf_counter() - it.t_enqueued
    fewer = ", or send fewer texts per request" if len(it.job.results) > 1 else ""
    return TimedOut(
        f"{_name(it)} would take about {est:.2g} s to compute ({_work(it)} at the measured rate), more than the "
        f"{max(0.0, left):.2g} s left of the request timeout of {timeout:g} s: it waited {waited:.2g} s in the "
        f"queue behind other work: retry{fewer}",
        _name(it),
    )


def _name(it: WorkItem) -> str:
    job = it.job
    return job.names[it.index] if job.names else f"texts[{it.index}]"


def _work(it: WorkItem) -> str:
    """What the item runs, in the words of its request: a decision request's state and questions."""
    asked = len(getattr(getattr(it.item, "request", None), "questions", None) or ())
    if it.key == DECIDE_KEY and asked:
        return f"its state and {asked} question(s), {it.tokens_run} tokens"
    return f"{it.tokens_run} tokens"


def _shorter(it: WorkItem) -> str:
    """What would shorten an item, from what it holds. An item reaching the scheduler is within the
    model's context already, so truncation would not help."""
    if it.key == DECIDE_KEY:
        return "ask fewer questions or options per request, or send a shorter state"
    if it.tokens_run > it.cost:
        return "send fewer choices, or a shorter text"
    return "send a shorter text"
