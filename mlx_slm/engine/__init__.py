"""The engine: loaded weights and tokenizer, the prompt-head KV caches, and the model primitives.

    engine.py        `Engine`: immutable after load, one lock; the batched forward (last position,
                     label rows), hidden states for heads, KV of a batch, tokens after cached KV
    prefix_cache.py  the shared prompt head's KV, computed once, broadcast to a batch

It knows no scoring kind, file or HTTP: the kinds above ask it for passes.

May import: ground, text, models, weights.
"""

from .engine import Engine

__all__ = ["Engine"]
