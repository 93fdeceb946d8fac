"""The prompt-prefix KV cache: the shared head of every prompt, computed once.

System instructions and the chat-template head are the same for every item, so their
keys and values are computed once (batch 1) and handed to every batch. The model
broadcasts them along the batch axis and concatenates the batch's own keys after
them into *new* arrays, so the shared copy is never written to, and padding or
per-item state can never leak into it.
"""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx
import numpy as np

from ..models import KV, Model


class PrefixCache:
    mask = None  # every cached key is real (see `StackedPrefix` for rows with prefixes of their own)
    states: np.ndarray | None = None  # the head's hidden states (P, D), when an embedding asks (`Engine.prefix_states`)

    def __init__(self, model: Model, tokens: Sequence[int]):
        if not tokens:
            raise ValueError("an empty prefix has nothing to cache")
        self.tokens: tuple[int, ...] = tuple(int(t) for t in tokens)
        _, kv = model(mx.array([self.tokens], dtype=mx.int32), last_only=True)
        mx.eval(kv)
        self.kv: list[KV] = kv

    def __len__(self) -> int:
        return len(self.tokens)


class StackedPrefix:
    """Several prompt heads under one batch: row r continues head `heads[r]` (a reranker's
    query: every document of a query runs after that query's cached KV, several queries per
    batch). Each head's KV is left-padded to the longest (B, H, C, D) per layer, and `mask`
    (B, C) marks each row's real cached keys, so the model attends only to them; a row's
    new tokens start at RoPE position len(its head) (`batching.pad` with per-row lengths).
    New arrays: the heads' own caches are never written."""

    def __init__(self, heads: Sequence[PrefixCache]):
        C = max(len(h) for h in heads)
        self.lengths = np.array([len(h) for h in heads], dtype=np.int32)
        self.mask = mx.array(np.arange(C)[None, :] >= (C - self.lengths)[:, None])  # (B, C) left-padded
        self._len = C
        kv: list[KV] = []
        for layer in range(len(heads[0].kv)):
            ks, vs = [], []
            for h in heads:
                k, v = h.kv[layer]
                pad = C - len(h)
                if pad:
                    zeros = mx.zeros((1, k.shape[1], pad, k.shape[3]), dtype=k.dtype)
                    k, v = mx.concatenate([zeros, k], axis=2), mx.concatenate([zeros.astype(v.dtype), v], axis=2)
                ks.append(k)
                vs.append(v)
            kv.append((mx.concatenate(ks, axis=0), mx.concatenate(vs, axis=0)))
        self.kv = kv

    def __len__(self) -> int:
        return self._len
