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

from .models import KV, Model


class PrefixCache:
    def __init__(self, model: Model, tokens: Sequence[int]):
        if not tokens:
            raise ValueError("an empty prefix has nothing to cache")
        self.tokens: tuple[int, ...] = tuple(int(t) for t in tokens)
        _, kv = model(mx.array([self.tokens], dtype=mx.int32), last_only=True)
        mx.eval(kv)
        self.kv: list[KV] = kv

    def __len__(self) -> int:
        return len(self.tokens)
