"""The state cache (`engine/state_cache.py`): recent decision states' keys and values in a bounded
LRU, found again by the longest start a new state shares with a kept one (the cache key's last state
first among equals), the questions' answers kept with a state and counted in the byte budget."""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from mlx_slm.engine.state_cache import StateCache, StateKV


def _state(tokens, layers=2, heads=2, dim=4):
    n = len(tokens)
    kv = [(mx.ones((1, heads, n, dim), dtype=mx.float32), mx.zeros((1, heads, n, dim), dtype=mx.float32))] * layers
    return StateKV(tokens, kv)


def test_a_state_is_found_by_itself_or_by_the_longest_shared_start():
    cache = StateCache(entries=4)
    a, b = _state([1, 2, 3, 4, 5]), _state([1, 2, 9, 9])
    cache.put(a)
    cache.put(b)
    assert cache.get([1, 2, 3, 4, 5]) == (a, 5)
    got, n = cache.get([1, 2, 3, 4, 7, 8])
    assert got is a and n == 4  # only the rest runs
    assert cache.get([1, 2, 3, 4]) == (a, 3)  # a token is always left to run
    assert cache.get([7, 8, 9]) == (None, 0)
    assert cache.get([1, 2, 3, 8], floor=3) == (None, 0)  # no more than `floor` shared: not worth it
    assert (cache.hits, cache.misses) == (3, 2)


def test_the_cache_keys_last_state_comes_first_among_equals():
    cache = StateCache(entries=4)
    first, second = _state([1, 2, 3, 4]), _state([1, 2, 3, 5])
    cache.put(first, cache_key="conversation")
    cache.put(second)
    assert cache.get([1, 2, 3, 6])[0] is second  # the most recent, without a key
    assert cache.get([1, 2, 3, 6], cache_key="conversation")[0] is first


def test_the_lru_keeps_its_entries_and_bytes_and_keeps_a_states_answers():
    cache = StateCache(entries=2)
    states = [_state([i, i + 1, i + 2]) for i in (10, 20, 30)]
    for s in states:
        cache.put(s)
    assert len(cache) == 2 and cache.get([10, 11, 12]) == (None, 0)  # the least recently used went
    one = states[1].nbytes
    tight = StateCache(entries=8, max_bytes=2 * one)
    for s in states:
        tight.put(s)
    assert len(tight) == 2
    kept = states[2]
    tight.remember(kept, b"question", np.zeros(3))
    again = StateKV(kept.tokens, kept.kv)
    tight.put(again)  # the same state run again keeps the answers it had
    assert again.scores.keys() == {b"question"} and again.nbytes > one
    assert StateCache(entries=0).get([1, 2]) == (None, 0)  # off
