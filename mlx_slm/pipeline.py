"""The window and batch pipeline a `Classifier` runs: items to batches to predictions.

A window of texts is prepared at a time (memory stays bounded by the window); its good
items are split by whether they start with the shared prompt head (whose KV the engine
keeps), cut into length-bucketed batches (`batching`), scored by the classifier's scorer
and handed back in input order. The functions go through the classifier's own methods
(`prepare`, `_run_batch`, `_features`) so a caller that wraps one sees every batch.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING

import numpy as np

from . import batching
from .inputs import progress_bar
from .predictions import Item, Prediction, Stats
from .prefix_cache import PrefixCache
from .prompts import starts_with

if TYPE_CHECKING:
    from .classifier import Classifier


def windows(
    clf: Classifier, texts: Iterable[str], window: int, stats: Stats, ordered: bool = True
) -> Iterator[Prediction]:
    it = iter(texts)
    start = 0
    while True:
        chunk = list(itertools.islice(it, window))
        if not chunk:
            return
        yield from run_window(clf, chunk, start, stats, ordered)
        start += len(chunk)


def _count(items: Sequence[Item], st: Stats) -> None:
    st.items += len(items)
    st.errors += sum(1 for it in items if it.error)
    st.prompt_tokens += sum(len(it.ids) for it in items if not it.error)


def run_window(
    clf: Classifier, texts: Sequence[str], start: int, st: Stats, ordered: bool = True
) -> Iterator[Prediction]:
    items = clf.prepare(texts, start)
    results: dict[int, Prediction] = {}
    for item in items:
        if item.error:
            results[item.index] = Prediction(item.index, error=item.error, n_tokens=len(item.ids))
    # Counted up front: a consumer that stops at the window's last prediction sees them too.
    _count(items, st)
    next_out = 0
    if not ordered:  # each batch as it finishes; the error items first
        yield from (results.pop(it.index) for it in items if it.error)
        for batch, group, pre in batches(clf, items, st):
            yield from clf._run_batch(batch, group, pre, st)
        return
    for batch, group, pre in batches(clf, items, st):
        for pred in clf._run_batch(batch, group, pre, st):
            results[pred.index] = pred
        # Hand out whatever is now complete in input order.
        while next_out < len(items) and items[next_out].index in results:
            yield results.pop(items[next_out].index)
            next_out += 1
    while next_out < len(items):
        yield results.pop(items[next_out].index)
        next_out += 1


def batches(
    clf: Classifier, items: Sequence[Item], st: Stats
) -> Iterator[tuple[batching.Batch, list[Item], PrefixCache | None]]:
    """The length-bucketed batches of a window's good items: (padded batch, its items, the
    prefix KV it continues, or None). Items starting with the shared head run after it."""
    live = [it for it in items if not it.error]
    p_len = len(clf.prefix_tokens)
    hit = [bool(p_len) and starts_with(it.ids, clf.prefix_tokens) for it in live]
    cached = [it for it, h in zip(live, hit) if h]
    uncached = [it for it, h in zip(live, hit) if not h]
    prefix = None
    if cached:
        prefix, computed = clf.engine.prefix(clf.prefix_tokens)
        # Net of the pass that computed the prefix, when this run paid for it (a prefix
        # already in the engine's cache, from an earlier run or task, costs nothing).
        st.processed_tokens += p_len if computed else 0
        st.prefix_saved_tokens += len(cached) * p_len - (p_len if computed else 0)
    for group, pre in ((cached, prefix), (uncached, None)):
        if not group:
            continue
        p = len(pre) if pre is not None else 0
        suffixes = [it.ids[p:] for it in group]
        lengths = [len(s) for s in suffixes]
        for idx in batching.plan(lengths, clf.batch_size, clf.max_batch_tokens, clf.sort, clf.row_extra):
            yield batching.pad(suffixes, idx, clf.engine.pad_id, cache_len=p), [group[i] for i in idx], pre


def features(
    clf: Classifier, texts: list[str], layers: Sequence[int], window: int, poolings: tuple[str, ...], progress: bool
) -> tuple[dict[str, np.ndarray], list[str | None], Stats]:
    """`Classifier.features` once its arguments are settled (see there)."""
    st = Stats()
    t0 = time.perf_counter()
    n, dim = len(texts), int(clf.model.args.hidden_size)
    out = {p: np.full((n, len(layers), dim), np.nan, dtype=np.float32) for p in poolings}
    errors: list[str | None] = [None] * n
    bar = progress_bar(n) if progress else None
    try:
        for start in range(0, n, window):
            items = clf.prepare(texts[start : start + window], start)
            for it in items:
                errors[it.index] = it.error
            if bar is not None:
                bar.update(sum(1 for it in items if it.error))
            for batch, group, pre in batches(clf, items, st):
                got = clf._features(batch, pre, list(layers), poolings)
                for p in poolings:
                    out[p][[it.index for it in group]] = got[p]
                st.batches += 1
                st.processed_tokens += batch.padded_tokens
                st.padding_tokens += batch.padded_tokens - batch.real_tokens
                if bar is not None:
                    bar.update(len(group))
            _count(items, st)
    finally:
        if bar is not None:
            bar.close()
    st.seconds = time.perf_counter() - t0
    return out, errors, st
