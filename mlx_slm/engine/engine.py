"""The engine: loaded weights, the prompt-prefix KV caches, and the batched forward.

Immutable after load and shareable: a service's worker, several `Classifier`s with
different tasks, or several threads can hold one engine. Everything a run counts lives
on that run (`classifier.Run`), never here. MLX evaluation is serialized by one lock,
so two threads never drive the same weights at once.

Prefix KV caches are built lazily, once per distinct shared prompt head (system message,
few-shot examples, template head: the head's token ids are the key), and kept in a small
LRU, so one loaded model can serve several tasks without recomputing their heads.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from functools import cached_property
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np

from ..ground.errors import ModelError
from ..models import KV, Model, Tree, load_model, sequence_logits
from ..text import batching
from ..weights.convert import weights_sha256
from ..weights.modelfiles import load_tokenizer
from ..weights.registry import ModelRef
from ..weights.sources import materialise
from .prefix_cache import PrefixCache

PREFIX_SLOTS = 8  # prompt heads kept (a head is ~26-500 tokens of KV: small next to the weights)


class Engine:
    def __init__(self, model: Model, tokenizer: Any, path: Path | None = None, prefix_slots: int = PREFIX_SLOTS):
        self.model, self.tokenizer, self.path = model, tokenizer, path
        self.pad_id = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0)
        self.max_length = int(model.args.max_position_embeddings)
        self._prefixes: OrderedDict[tuple[int, ...], PrefixCache] = OrderedDict()
        self._slots = prefix_slots
        # One lock for the weights and the tokenizer (a Rust tokenizer object is not safe to share
        # across threads mid-call); held per batch, so concurrent runs interleave batch by batch.
        self.lock = threading.RLock()

    @classmethod
    def load(cls, model: str | Path | ModelRef, dtype: str | None = None, keep_quantized: bool | None = None) -> Engine:
        """A built-in name, converted dir, HF dir, `.gguf` or hub id (or a `ModelRef`, the one
        value the plan carries): resolved, fetched and converted once into the cache by
        `sources.materialise`, then loaded by `models.load_model`.

        keep_quantized: for an MLX-quantized model, see `models.load_model` (None: on a GPU only)."""
        ref = ModelRef.of(model, dtype, keep_quantized)
        # Converted once in the asked dtype (float16 by default), so float32 compute asked for
        # explicitly gets the source's float32 values, not float16 ones cast back up.
        path = materialise(ref.name, dtype=ref.dtype or "float16")
        m = load_model(path, dtype=getattr(mx, ref.dtype) if ref.dtype else None, keep_quantized=ref.keep_quantized)
        return cls(m, load_tokenizer(path), path)

    @cached_property
    def weights_sha256(self) -> str | None:
        """sha256 of the loaded weights (from the conversion record, hashed once if it has none);
        None for a model built in memory. What saved tasks, priors, heads and Ray workers check."""
        if self.path is None:
            return None

        return weights_sha256(self.path)

    @property
    def compute_dtype(self) -> str:
        return str(self.model.compute_dtype).replace("mlx.core.", "")

    def prefix(self, tokens: Sequence[int]) -> tuple[PrefixCache, bool]:
        """The KV of a shared prompt head, and whether this call computed it (LRU per head)."""
        key = tuple(int(t) for t in tokens)
        with self.lock:
            hit = self._prefixes.get(key)
            if hit is not None:
                self._prefixes.move_to_end(key)
                return hit, False
            cache = PrefixCache(self.model, key)
            self._prefixes[key] = cache
            while len(self._prefixes) > self._slots:
                self._prefixes.popitem(last=False)
            return cache, True

    def forward(
        self, batch: batching.Batch, prefix: PrefixCache | None, rows: mx.array, keep_logits: bool = False
    ) -> tuple[mx.array, np.ndarray | None, list[KV]]:
        """Label-row logits at each row's last position (B, k), the full last logits if asked,
        and the per-layer KV (prefix + batch) for scoring label continuations."""
        with self.lock:
            hidden, kv = self._last(batch, prefix)
            if keep_logits:
                full = self.model.logits(hidden)
                first = mx.take(full, rows, axis=1)
            else:
                full = None
                first = self.model.logits(hidden, rows)  # label rows only, never the whole head
            first = first.astype(mx.float32)
            mx.eval(first, *([] if full is None else [full]))
            return first, (np.array(full.astype(mx.float32)) if full is not None else None), kv

    def _last(self, batch: batching.Batch, prefix: Any) -> tuple[mx.array, list[KV]]:
        """The batch's forward after its prefix KV (shared, or stacked per row with its mask):
        the final-norm hidden state at each row's last position (B, D), and the per-layer KV."""
        return self.model(
            mx.array(batch.ids),
            mx.array(batch.mask),
            mx.array(batch.offsets),
            cache=prefix.kv if prefix else None,
            cache_mask=prefix.mask if prefix else None,
            last_only=True,
        )

    def last_hidden(self, batch: batching.Batch, prefix: Any = None) -> mx.array:
        """Each row's final-norm hidden state at its last position (B, D), evaluated: what a
        score head of a kind's own (a fine-tuned head) reads."""
        with self.lock:
            hidden, _ = self._last(batch, prefix)
            mx.eval(hidden)
            return hidden

    def weighted_sum(self, batch: batching.Batch, prefix: Any, weights: np.ndarray) -> np.ndarray:
        """Each row's final-norm hidden states weighted by `weights` (B, L) and summed, in float32
        (B, D): a mean over the positions marked 1 (their count divides it), or one position picked
        (one-hot weights). The forward runs every position to the end, after the prefix KV (shared,
        or stacked per row with its mask). What mean and first-token embeddings read."""
        with self.lock:
            h, _ = self.model(
                mx.array(batch.ids),
                mx.array(batch.mask),
                mx.array(batch.offsets),
                cache=prefix.kv if prefix else None,
                cache_mask=prefix.mask if prefix else None,
                last_only=False,
            )
            total = (h.astype(mx.float32) * mx.array(weights.astype(np.float32))[..., None]).sum(axis=1)
            mx.eval(total)
            return np.array(total)

    def prefix_states(self, cache: PrefixCache) -> tuple[np.ndarray, bool]:
        """The final-norm hidden states of a cached prompt head's tokens (P, D) float32, and whether
        this call computed them: once per head (kept on the cache), for embeddings whose pooling
        reads the head's positions too (a mean over the prompt, its first token)."""
        with self.lock:
            if cache.states is not None:
                return cache.states, False
            h, _ = self.model(mx.array([cache.tokens], dtype=mx.int32), last_only=False)
            cache.states = np.array(h[0].astype(mx.float32))
            return cache.states, True

    def sequence_logits(self, batch: batching.Batch, prefix: PrefixCache | None = None) -> np.ndarray:
        """A sequence classifier's score-head logits at each row's last position (B, num_labels)
        float32 (`models.sequence_logits`; rows hold `model.seqcls.prompt_ids`). A causal LM:
        a ModelError (it has no score head)."""
        with self.lock:
            logits = sequence_logits(
                self.model,
                mx.array(batch.ids),
                mx.array(batch.mask),
                mx.array(batch.offsets),
                cache=prefix.kv if prefix else None,
                cache_mask=prefix.mask if prefix else None,
            )
            mx.eval(logits)
            return np.array(logits)

    def features(
        self,
        batch: batching.Batch,
        prefix: PrefixCache | None,
        layers: list[int],
        poolings: Sequence[str] = ("last",),
        skip: np.ndarray | None = None,
    ) -> dict[str, np.ndarray]:
        """Hidden states after `layers` (Transformers' `hidden_states[l]` numbering), pooled:
        {pooling: (B, len(layers), D) float32}, a learned head's input. The forward stops at
        the deepest layer asked for: no later layers, no vocabulary projection.

        "mean" averages each row's real tokens after its first `skip[r]` ones (the rows that
        did not continue the shared prefix skip its length themselves, so every row's mean
        covers the same part of its prompt)."""
        if not hasattr(self.model, "features"):
            raise ModelError(f"learned heads need one of our architectures; {self.path} runs through mlx-lm's class")
        pool = None
        if "mean" in poolings:
            real = batch.mask.astype(bool)
            rank = np.cumsum(real, axis=1) - 1  # each real token's index among its row's real tokens
            pool = mx.array(real & (rank >= (0 if skip is None else np.asarray(skip)[:, None])))
        with self.lock:
            out = self.model.features(
                mx.array(batch.ids),
                layers,
                mx.array(batch.mask),
                mx.array(batch.offsets),
                prefix.kv if prefix else None,
                poolings,
                pool,
            )
            return {p: np.array(v.astype(mx.float32)) for p, v in out.items()}

    def encode(
        self,
        batch: batching.Batch,
        prefix: PrefixCache | None,
        mean_layers: Sequence[int] = (),
        skip: int = 0,
    ) -> tuple[list[KV], dict[int, np.ndarray], np.ndarray]:
        """The per-layer KV (prefix + batch) of a batch's prompts, for branches to run after,
        and for heads that mean-pool: the float32 sum of each row's hidden states after
        `mean_layers` over its real tokens past the first `skip` ({layer: (B, D)}) and their
        count (B,). The last layer runs its last position only unless a head reads it."""
        n = len(self.model.layers)
        collect: dict[int, Any] | None = dict.fromkeys(mean_layers) if mean_layers else None
        with self.lock:
            _, kv = self.model(
                mx.array(batch.ids),
                mx.array(batch.mask),
                mx.array(batch.offsets),
                cache=prefix.kv if prefix else None,
                cache_mask=getattr(prefix, "mask", None),  # rows continuing heads of their own (`StackedPrefix`)
                last_only=n not in mean_layers,
                collect=collect,
            )
            sums: dict[int, np.ndarray] = {}
            real = batch.mask.astype(bool)
            pool = real & ((np.cumsum(real, axis=1) - 1) >= skip)
            if collect:
                w = mx.array(pool.astype(np.float32))[..., None]
                got = {layer: (h.astype(mx.float32) * w).sum(axis=1) for layer, h in collect.items()}
                mx.eval(kv, *got.values())
                sums = {layer: np.array(v) for layer, v in got.items()}
            else:
                mx.eval(kv)
            return kv, sums, pool.sum(axis=1).astype(np.float32)

    def cache_mask(self, batch: batching.Batch, prefix: Any) -> mx.array:
        """Which cached keys a continuation of the batch's rows sees: the prefix (`prefix`: its
        length for a shared one, or a `StackedPrefix` with each row's real keys), then each row's
        own real prompt tokens (its left padding masked)."""
        B = batch.ids.shape[0]
        if getattr(prefix, "mask", None) is not None:
            return mx.concatenate([prefix.mask, mx.array(batch.mask)], axis=1)
        n = prefix if isinstance(prefix, int) else (len(prefix) if prefix is not None else 0)
        return mx.array(np.concatenate([np.ones((B, n), dtype=bool), batch.mask], axis=1))

    def continue_after(
        self,
        kv: list[KV],
        cache_mask: mx.array,
        ids: Any,
        *,
        positions: np.ndarray | None = None,
        offsets: np.ndarray | None = None,
        tree: np.ndarray | None = None,
        collect: dict[int, Any] | None = None,
        return_kv: bool = False,
    ) -> Any:
        """Hidden states (B, T, D) of tokens `ids` (B, T) run after the rows' KV (prefix + prompt,
        `cache_mask` saying which keys are real): at explicit RoPE `positions` (B, T) under a
        `tree` mask ((T, T) or (B, T, T): which new tokens each sees), or from `offsets` (B,)
        causally. What label tries, per-label passes and question branches run. `return_kv`: also
        the per-layer KV (cache + these tokens), for tokens whose keys later passes continue."""
        # Only what is asked for is passed: the mlx-lm fallback's model takes offsets alone.
        tree_args: dict[str, Any] = {}
        if positions is not None or tree is not None:
            tree_args["tree"] = Tree(
                None if positions is None else mx.array(positions), None if tree is None else mx.array(tree)
            )
        if collect is not None:
            tree_args["collect"] = collect
        with self.lock:
            h, new_kv = self.model(
                ids if isinstance(ids, mx.array) else mx.array(ids),
                None,
                None if offsets is None else mx.array(offsets),
                cache=kv,
                cache_mask=cache_mask,
                last_only=False,
                **tree_args,
            )
            return (h, new_kv) if return_kv else h

    def vocab_logprob_parts(self, hidden: mx.array, rows: np.ndarray, chunk: int) -> tuple[np.ndarray, np.ndarray]:
        """For hidden states (N, D): the vocabulary's log-sum-exp (N,) and the logits of the
        vocabulary `rows` (N, R), float64, `chunk` positions at a time so that the (positions, V)
        logits never all exist at once. log p(row | position) = picked - lse."""
        lse_parts, picked = [], []
        take = mx.array(rows)
        with self.lock:
            for lo in range(0, hidden.shape[0], chunk):
                logits = self.model.logits(hidden[lo : lo + chunk]).astype(mx.float32)
                lse_parts.append(mx.logsumexp(logits, axis=-1))
                picked.append(mx.take(logits, take, axis=1))
                mx.eval(lse_parts[-1], picked[-1])
            lse = np.array(mx.concatenate(lse_parts), dtype=np.float64)
            got = np.array(mx.concatenate(picked), dtype=np.float64)
        return lse, got
