"""The window and batch pipeline: texts -> items -> batches -> `kind.score` -> predictions.

Read top to bottom, one window of texts at a time (memory stays bounded by the window):

1. `kind.items` renders and tokenizes each text, with an error for what cannot run;
2. the good items are split by whether they start with the shared prompt head, whose KV the
   engine keeps (`Engine.prefix`);
3. each group is cut into length-bucketed, left-padded batches (`batching.plan`, `pad`), the
   kind's extra tokens per row counted in the token budget;
4. the kind scores each batch (`Kind.score`); a prediction holding a probability or score that
   is NaN or infinite (weights that overflow, a diverged fine-tune) becomes an error row
   (`finite`), so none is ever written, answered or returned as a number;
5. predictions go back in input order (or as each batch finishes, `ordered=False`).

Everything comes in as arguments (the kind, the batch settings, the run's `Stats`): nothing
here calls back into the classifier. The service's worker enters at step 2 with items its
front end tokenized (`run_items`).
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import mlx.core as mx
import numpy as np

from ..engine.prefix_cache import PrefixCache, StackedPrefix
from ..ground.ranges import check_all
from ..kinds.head import pooled_features
from ..text import batching
from ..text.inputs import progress_bar
from ..text.predictions import Item, Prediction, Stats
from ..text.prompts import starts_with

if TYPE_CHECKING:
    from ..kinds import Kind


# Batch planner defaults. On a 2-core x86 CPU throughput per processed token was flat from
# 256 to 4,096 padded tokens per batch (about 140 tokens/s, Qwen 0.5B, float32), so the CPU
# budget is small, to cut padding (benchmarks/results/budget-curve.md). GPUs want bigger
# batches; 4,096 there is a starting point that has not been measured yet.
DEFAULT_BATCH_SIZE = 32
DEFAULT_MAX_BATCH_TOKENS = 512
GPU_MAX_BATCH_TOKENS = 4096


def default_max_batch_tokens() -> int:
    return GPU_MAX_BATCH_TOKENS if mx.default_device() == mx.gpu else DEFAULT_MAX_BATCH_TOKENS


@dataclass(frozen=True)
class BatchSettings:
    """How a window's items are cut into batches: a row cap, a padded-token budget (None: no
    budget) and whether to sort by length (each can be switched off alone, to measure it); a
    sorted plan also cuts a batch before its padding passes `max_padding` of its tokens."""

    batch_size: int = DEFAULT_BATCH_SIZE
    max_batch_tokens: int | None = DEFAULT_MAX_BATCH_TOKENS
    sort: bool = True
    max_padding: float | None = batching.MAX_PADDING

    @classmethod
    def of(cls, batch_size: int, max_batch_tokens: int | None | str = "auto", sort: bool = True) -> BatchSettings:
        """Settings checked by the one range rule ("auto": the device's default token budget)."""
        if max_batch_tokens == "auto":
            max_batch_tokens = default_max_batch_tokens()
        check_all({"batch_size": batch_size, "max_batch_tokens": max_batch_tokens}, "{name}")
        return cls(batch_size, max_batch_tokens, sort)  # type: ignore[arg-type]


def windows(
    kind: Kind, texts: Iterable[str], window: int, plan: BatchSettings, stats: Stats, ordered: bool = True
) -> Iterator[Prediction]:
    """Raw predictions of `texts`, `window` texts prepared at a time."""
    it = iter(texts)
    start = 0
    while True:
        chunk = list(itertools.islice(it, window))
        if not chunk:
            return
        yield from run_items(kind, kind.items(chunk, start), plan, stats, ordered)
        start += len(chunk)


def count_items(items: Sequence[Item], st: Stats) -> None:
    st.items += len(items)
    st.errors += sum(1 for it in items if it.error)
    st.prompt_tokens += sum(len(it.ids) for it in items if not it.error)


NON_FINITE = (
    "the model gave a non-finite probability (NaN or infinity) for this text: its weights (or the task's adapters "
    "or head) overflow or hold non-finite values; run it in float32 (--dtype float32), or fix or retrain the model"
)


def _finite(x: object) -> bool:
    """Whether every number in `x` (a number, or dicts and lists of them) is finite."""
    if isinstance(x, float):
        return math.isfinite(x)
    if isinstance(x, dict):
        return all(map(_finite, x.values()))
    if isinstance(x, (list, tuple)):
        return all(map(_finite, x))
    return True


def finite(pred: Prediction, st: Stats) -> Prediction:
    """`pred`, or its error row when a probability, score or answer of it is NaN or infinite."""
    if pred.error is None and not (_finite(pred.probs) and _finite(pred.value) and _finite(pred.answers)):
        st.errors += 1
        return Prediction(pred.index, error=NON_FINITE, n_tokens=pred.n_tokens, truncated=pred.truncated)
    return pred


def scored(kind: Kind, batch: batching.Batch, group: list[Item], pre: object, st: Stats) -> list[Prediction]:
    """A batch's predictions (`kind.score`), each checked by `finite`."""
    return [finite(p, st) for p in kind.score(batch, group, pre, st)]


def run_items(
    kind: Kind, items: Sequence[Item], plan: BatchSettings, st: Stats, ordered: bool = True
) -> Iterator[Prediction]:
    """The predictions of prepared items (one window): error items as error predictions, the
    rest scored batch by batch; in input order, or as each batch finishes (errors first)."""
    results: dict[int, Prediction] = {}
    for item in items:
        if item.error:
            results[item.index] = Prediction(item.index, error=item.error, n_tokens=len(item.ids))
    # Counted up front: a consumer that stops at the window's last prediction sees them too.
    count_items(items, st)
    if not ordered:
        yield from (results.pop(it.index) for it in items if it.error)
        for batch, group, pre in batches(kind, items, plan, st):
            yield from scored(kind, batch, group, pre, st)
        return
    next_out = 0
    for batch, group, pre in batches(kind, items, plan, st):
        for pred in scored(kind, batch, group, pre, st):
            results[pred.index] = pred
        # Hand out whatever is now complete in input order.
        while next_out < len(items) and items[next_out].index in results:
            yield results.pop(items[next_out].index)
            next_out += 1
    while next_out < len(items):
        yield results.pop(items[next_out].index)
        next_out += 1


def head_of(kind: Kind, item: Item) -> tuple[int, ...]:
    """The cached head an item runs after: its own (a reranker's query), else the kind's shared
    one; () when it runs whole (the rule for the batch plan and the service's cost estimate alike)."""
    own = item.prefix if item.prefix is not None else kind.prefix_tokens
    return own if own and starts_with(item.ids, own) else ()


def prefix_hit(kind: Kind, item: Item) -> bool:
    """Whether an item runs after a cached head (see `head_of`)."""
    return bool(head_of(kind, item))


def item_cost(kind: Kind, item: Item, hit: bool) -> int:
    """Tokens an item puts in a batch's budget: its suffix after the cached head (when it
    continues it) and the kind's extra tokens per row, as `batching.plan` counts them."""
    return len(item.ids) - (len(head_of(kind, item)) if hit else 0) + kind.row_extra


def batches(
    kind: Kind, items: Sequence[Item], plan: BatchSettings, st: Stats
) -> Iterator[tuple[batching.Batch, list[Item], PrefixCache | StackedPrefix | None]]:
    """The length-bucketed batches of a window's good items: (padded batch, its items, the
    prefix KV it continues, or None). Items starting with a cached head run after it: the
    kind's shared head (one KV broadcast over the batch), or each item's own (a reranker's
    query): rows of several heads share a batch, each after its own KV (`StackedPrefix`)."""
    live = [it for it in items if not it.error]
    heads = [head_of(kind, it) for it in live]
    caches: dict[tuple[int, ...], PrefixCache] = {}
    for h in dict.fromkeys(x for x in heads if x):
        caches[h], computed = kind.engine.prefix(h)
        n = sum(1 for x in heads if x == h)
        # Net of the pass that computed the head, when this run paid for it (a head already in
        # the engine's cache, from an earlier run or task, costs nothing).
        st.processed_tokens += len(h) if computed else 0
        st.prefix_saved_tokens += n * len(h) - (len(h) if computed else 0)
    mixed = len(caches) > 1 and getattr(kind.engine.model, "supports_tree", False)
    if mixed:  # one plan over every head's items: a batch's rows each continue their own head
        groups = [([it for it, h in zip(live, heads) if h], True), ([it for it, h in zip(live, heads) if not h], False)]
    else:  # a plan per head (the model cannot mask a batch of heads), then the items that run whole
        groups = [([it for it, x in zip(live, heads) if x == h], True) for h in caches]
        groups.append(([it for it, h in zip(live, heads) if not h], False))
    for group, cached in groups:
        if not group:
            continue
        own = [head_of(kind, it) if cached else () for it in group]
        suffixes = [it.ids[len(h) :] for it, h in zip(group, own)]
        lengths = [len(s) for s in suffixes]
        cap = plan.max_padding if plan.sort else None  # unsorted (to measure sorting): no cut by padding
        for idx in batching.plan(lengths, plan.batch_size, plan.max_batch_tokens, plan.sort, kind.row_extra, cap):
            rows = [own[i] for i in idx]
            if not cached:
                pre: PrefixCache | StackedPrefix | None = None
                start: int | np.ndarray = 0
            elif all(r == rows[0] for r in rows):
                pre, start = caches[rows[0]], len(rows[0])
            else:
                pre = StackedPrefix([caches[r] for r in rows])
                start = pre.lengths
            yield batching.pad(suffixes, idx, kind.engine.pad_id, cache_len=start), [group[i] for i in idx], pre


def features(
    kind: Kind,
    texts: list[str],
    layers: Sequence[int],
    window: int,
    poolings: tuple[str, ...],
    plan: BatchSettings,
    progress: bool,
) -> tuple[dict[str, np.ndarray], list[str | None], Stats]:
    """Hidden states of every text's prompt (see `Classifier.features`): the kind's items, the
    same batch plan and prefix cache, the forward stopped at the deepest layer."""

    st = Stats()
    t0 = time.perf_counter()
    n, dim = len(texts), int(kind.engine.model.args.hidden_size)
    out = {p: np.full((n, len(layers), dim), np.nan, dtype=np.float32) for p in poolings}
    errors: list[str | None] = [None] * n
    bar = progress_bar(n) if progress else None
    try:
        for start in range(0, n, window):
            items = kind.items(texts[start : start + window], start)
            for it in items:
                errors[it.index] = it.error
            if bar is not None:
                bar.update(sum(1 for it in items if it.error))
            for batch, group, pre in batches(kind, items, plan, st):
                got = pooled_features(kind.engine, batch, pre, list(layers), poolings, kind.pool_from)
                for p in poolings:
                    out[p][[it.index for it in group]] = got[p]
                st.batches += 1
                st.processed_tokens += batch.padded_tokens
                st.padding_tokens += batch.padded_tokens - batch.real_tokens
                if bar is not None:
                    bar.update(len(group))
            count_items(items, st)
    finally:
        if bar is not None:
            bar.close()
    st.seconds = time.perf_counter() - t0
    return out, errors, st
