"""Decisions through the scheduler: what the worker runs for a decision request, and how the
front prepares it.

A decision request (`text.decisions.questions.DecisionRequest`: a state and its questions) is ONE item of
the scheduler's bounded queue, under the task key `DECIDE_KEY`. So decision requests share
admission (429 beyond --max-queue-items), deadlines, cancellation (a client gone: its item is
dropped before it runs) and the drain with every other route, and the worker gathers several
decision requests into one micro-batch, which runs as ONE `Decider.decide` call: the states of
every request and each question as a branch after its state, in one batch.

Two `Decider`s share the engine's weights: the *front* one, on the front tokenizer, prepares a
request off the worker thread (its tokens, its cost in the batch budget, and whether it fits the
model's context); the *back* one, which only the worker uses, runs it and keeps the bounded cache
of recent states' keys and values (`--state-cache`), so a state asked again (the same tokens, or
the same OpenAI `prompt_cache_key`) runs only its questions.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..text.decisions.errors import DecisionError
from ..text.predictions import Stats


@dataclass
class QueuedDecision:
    """One decision request as the queue holds it: the request, what the front prepared of it
    (`prepared`: the `Decider`'s own item: its tokens, variants and cost), its cost in tokens
    and its index within a micro-batch."""

    request: Any
    prepared: Any
    cost: int = 1
    index: int = 0
    error: str | None = None
    longest: int | None = None  # its longest row (the state and one question), for the time estimate


@dataclass
class Decided:
    """A decision item's answer: its `DecisionResult` (or the exception it alone raised), at
    its index in the micro-batch."""

    index: int
    result: Any


@dataclass
class DecisionRun:
    """One micro-batch of decision requests, run in one `Decider` call when first iterated."""

    decider: Any
    items: Sequence[QueuedDecision]
    stats: Stats = field(default_factory=Stats)  # a classifier run's figures, as the scheduler and /metrics read them

    def __iter__(self) -> Iterator[Decided]:
        try:
            results: list[Any] = list(self._run(self.items))
        except Exception as e:
            # One request the Decider refuses (found only here), or one that hits a bug, must not
            # fail the others of the micro-batch: each runs alone, and the one at fault gets its
            # error as its answer (a DecisionError its 4xx; another its 500, logged by the route).
            if len(self.items) == 1 and not isinstance(e, DecisionError):
                raise  # the scheduler's failure of the batch, as a classifier's
            results = [e] if len(self.items) == 1 else [self._alone(it) for it in self.items]
        for it, r in zip(self.items, results):
            if not isinstance(r, Exception):
                self.stats.processed_tokens += max(0, int(r.input_tokens) - int(r.cached_tokens))
                self.stats.prefix_saved_tokens += int(r.cached_tokens)
            yield Decided(it.index, r)

    def _run(self, items: Sequence[QueuedDecision]) -> Sequence[Any]:
        return self.decider.run_items([it.prepared for it in items])

    def _alone(self, item: QueuedDecision) -> Any:
        try:
            return self._run([item])[0]
        except Exception as e:  # noqa: BLE001 - this request's answer (see __iter__)
            return e


class DecisionTask:
    """What `TaskCache` holds for `DECIDE_KEY`: a `Decider` and the two calls the service makes,
    `prepare` (front) and `run_items` (the worker's, as a classifier's)."""

    def __init__(self, decider: Any):
        self.decider = decider

    def prepare(self, request: Any) -> QueuedDecision:
        """The request's queue item on the front: the `Decider`'s own prepared item (its tokens
        and cost; a `DecisionError` when over the context)."""
        (prepared,) = self.decider.prepare([request])
        cost = max(1, int(prepared.cost))
        longest = len(prepared.ids) + max((len(c) for c in prepared.chains if c is not None), default=0)
        return QueuedDecision(request, prepared, cost, longest=min(cost, longest) or None)

    def run_items(self, items: Sequence[QueuedDecision], ordered: bool = False) -> DecisionRun:
        return DecisionRun(self.decider, items)

    def work(self, item: QueuedDecision) -> int:
        """The tokens `item` will run on this (the worker's) `Decider`: its cost less the start of
        its state that the state cache holds now (the same state, or one sharing its longest start:
        jevcompat's 255-option choice shares 2,751 of its 5,642 tokens with the 128-option one asked
        before it). What the time estimate prices, as the run's processed tokens are measured."""
        d, p = self.decider, item.prepared
        states = d.states
        if states is None or states.entries <= 0:
            return item.cost
        _, held = states.get(p.ids, item.request.cache_key, len(d.planner.head))
        return max(1, item.cost - int(held))


def decision_budget(tasks: Any, budget: int, time_budget: int | None) -> int:
    """The token budget of a micro-batch of decision requests (`DECIDE_KEY`): the worker's
    `Decider`'s own (it packs their states and questions, and cuts them into its own batches),
    within the scheduler's time budget (`time_budget`; None: none); `budget`, the classifier's,
    when `tasks` (the `TaskCache`) has no `Decider` to give."""
    try:
        own = int(tasks.decider(False).decider.call_tokens)
    except Exception:  # noqa: BLE001 - none (a request builds it before admission, so it is rare): the classifier's
        return budget
    return min(own, time_budget) if time_budget is not None else own
