"""The state cache: recent decision states' keys and values, found again by their tokens.

A decision request's *state* (its text, then each question as a branch after it) is often asked
again: the same ticket with other questions, a conversation grown under one OpenAI
`prompt_cache_key`. The state's KV (batch 1, every key real, as `prefix_cache.PrefixCache` holds
the prompt head's) is kept in a bounded LRU (`entries` states, `max_bytes` at most, questions'
answers counted in), found by the longest start a new state shares with a kept one, so only the
rest runs. Thread-safe: a service's worker and its front share it.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from functools import cached_property

import numpy as np

from ..models import KV

STATE_CACHE = 64  # recent states whose keys and values are kept (`--state-cache`'s default)
STATE_CACHE_BYTES = 512 * 2**20  # and at most this much of them
MAX_SCORES_PER_STATE = 1024  # questions' answers kept with a cached state


class StateKV:
    """A state part's keys and values (batch 1, every key real), as a `PrefixCache` holds a
    prompt head's: what rows continue (`StackedPrefix`) and what the state cache keeps."""

    mask = None
    states = None

    def __init__(self, tokens: Sequence[int], kv: list[KV]):
        self.tokens: tuple[int, ...] = tuple(int(t) for t in tokens)
        self.kv = kv
        # Questions answered after this very state: a digest of (their own tokens, their labels'
        # tokens) -> option scores. A question asked again of the same state is the same
        # computation: not run again. Their bytes count in `nbytes` (the state cache's budget).
        self.scores: dict[bytes, np.ndarray] = {}
        self.scores_nbytes = 0

    def __len__(self) -> int:
        return len(self.tokens)

    @cached_property
    def array(self) -> np.ndarray:
        """Its tokens as an array (the state cache compares states by their start)."""
        return np.asarray(self.tokens, dtype=np.int64)

    def head(self, n: int) -> StateKV:
        """Its first `n` tokens' keys and values (a later state that starts the same way)."""
        return StateKV(self.tokens[:n], [(k[:, :, :n], v[:, :, :n]) for k, v in self.kv])

    def add_score(self, key: bytes, score: np.ndarray) -> int:
        """A question's answer kept (`key`: `answer_key`); the bytes it adds (0 if known)."""
        if key in self.scores:
            return 0
        self.scores[key] = score
        n = len(key) + np.asarray(score).nbytes
        self.scores_nbytes += n
        return n

    @property
    def nbytes(self) -> int:
        return sum(k.nbytes + v.nbytes for k, v in self.kv) + self.scores_nbytes


class StateCache:
    """The bounded LRU of recent states' KV, found by their tokens (the longest shared start;
    OpenAI's prompt_cache_key's last state first among equals). Thread-safe; `entries` 0 is off."""

    def __init__(self, entries: int = STATE_CACHE, max_bytes: int = STATE_CACHE_BYTES):
        self.entries, self.max_bytes = int(entries), int(max_bytes)
        self._by_tokens: OrderedDict[tuple[int, ...], StateKV] = OrderedDict()
        self._by_key: OrderedDict[str, tuple[int, ...]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    def __len__(self) -> int:
        return len(self._by_tokens)

    def get(self, tokens: Sequence[int], cache_key: str | None = None, floor: int = 0) -> tuple[StateKV | None, int]:
        """(a cached state, how many of `tokens` it holds): the state itself, else the one that
        shares the longest start with it (more than `floor` tokens; below the whole state, so a
        token is left to run), the cache_key's last state first among equals; (None, 0) if none."""
        if self.entries <= 0:
            return None, 0
        key = tuple(tokens)
        with self._lock:
            hit = self._by_tokens.get(key)
            if hit is not None:
                self._by_tokens.move_to_end(key)
                self.hits += 1
                return hit, len(key)
            first = self._by_key.get(cache_key) if cache_key is not None else None
            order = ([first] if first in self._by_tokens else []) + [k for k in reversed(self._by_tokens) if k != first]
            best, n = None, floor
            want = np.asarray(key, dtype=np.int64)
            for k in order:
                if len(k) <= n or k[: n + 1] != key[: n + 1]:  # cannot beat the best so far
                    continue
                m = min(_shared(self._by_tokens[k].array, want), len(key) - 1)
                if m > n:
                    best, n = k, m
            if best is None:
                self.misses += 1
                return None, 0
            self._by_tokens.move_to_end(best)
            self.hits += 1
            return self._by_tokens[best], n

    def put(self, state: StateKV, cache_key: str | None = None) -> None:
        if self.entries <= 0 or state.nbytes > self.max_bytes:
            return
        with self._lock:
            old = self._by_tokens.get(state.tokens)
            if old is not None:
                self._bytes -= old.nbytes
                if old is not state:  # the same state run again: its questions' answers kept
                    for k, v in old.scores.items():
                        if len(state.scores) < MAX_SCORES_PER_STATE:
                            state.add_score(k, v)
            self._bytes += state.nbytes
            self._by_tokens[state.tokens] = state
            self._by_tokens.move_to_end(state.tokens)
            if cache_key is not None:
                self._by_key[cache_key] = state.tokens
                self._by_key.move_to_end(cache_key)
                while len(self._by_key) > 4 * self.entries:
                    self._by_key.popitem(last=False)
            self._evict()

    def remember(self, state: StateKV, key: bytes, score: np.ndarray) -> None:
        """A question's answer kept with `state`, counted in the budget when the state is cached."""
        with self._lock:
            if len(state.scores) >= MAX_SCORES_PER_STATE:
                return
            n = state.add_score(key, score)
            if self._by_tokens.get(state.tokens) is state:
                self._bytes += n
                self._evict()

    def _evict(self) -> None:
        while len(self._by_tokens) > self.entries or self._bytes > self.max_bytes:
            _, old = self._by_tokens.popitem(last=False)
            self._bytes -= old.nbytes

    def clear(self) -> None:
        with self._lock:
            self._by_tokens.clear()
            self._by_key.clear()
            self._bytes = 0


def _shared(a: np.ndarray, b: np.ndarray) -> int:
    """How many leading tokens two sequences share."""
    m = min(len(a), len(b))
    diff = np.flatnonzero(a[:m] != b[:m])
    return int(diff[0]) if len(diff) else m
