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

from . import batching
from .errors import ModelError
from .labels import TrieChunk
from .models import KV, Model, load_model
from .prefix_cache import PrefixCache

PREFIX_SLOTS = 8  # prompt heads kept (a head is ~26-500 tokens of KV: small next to the weights)
LOGIT_ROWS = 256  # trie positions projected onto the vocabulary at once (256 x 151,936 floats: 156 MB)


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
    def load(cls, model: str | Path, dtype: str | None = None, dequantize: bool | None = None) -> Engine:
        """A built-in name, converted dir, HF dir, `.gguf` or hub id: resolved, fetched and converted
        once into the cache by `sources.materialise`, then loaded by `models.load_model`.

        dequantize: for an MLX-quantized model, see `models.load_model` (None: on the CPU only)."""
        from transformers import AutoTokenizer

        from .sources import materialise

        # Converted once in the asked dtype (float16 by default), so float32 compute asked for
        # explicitly gets the source's float32 values, not float16 ones cast back up.
        path = materialise(model, dtype=dtype or "float16")
        m = load_model(path, dtype=getattr(mx, dtype) if dtype else None, dequantize=dequantize)
        return cls(m, AutoTokenizer.from_pretrained(str(path)), path)

    @cached_property
    def weights_sha256(self) -> str | None:
        """sha256 of the loaded weights (from the conversion record, hashed once if it has none);
        None for a model built in memory. What saved tasks, priors, heads and Ray workers check."""
        if self.path is None:
            return None
        from .convert import weights_sha256

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
            hidden, kv = self.model(
                mx.array(batch.ids),
                mx.array(batch.mask),
                mx.array(batch.offsets),
                cache=prefix.kv if prefix else None,
                last_only=True,
            )
            if keep_logits:
                full = self.model.logits(hidden)
                first = mx.take(full, rows, axis=1)
            else:
                full = None
                first = self.model.logits(hidden, rows)  # label rows only, never the whole head
            first = first.astype(mx.float32)
            mx.eval(first, *([] if full is None else [full]))
            return first, (np.array(full.astype(mx.float32)) if full is not None else None), kv

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

    def trie_logprobs(
        self, kv: list[KV], batch: batching.Batch, prefix_len: int, chunks: Sequence[TrieChunk], n_labels: int
    ) -> tuple[np.ndarray, int]:
        """Per label, the sum of log p(label token k | prompt, earlier label tokens) for k >= 1,
        all labels at once: the labels' token trie runs as one extra sequence per row.

        Each trie node sees the shared prefix, its row's own prompt (through the row's KV)
        and its own ancestors, never a sibling (`tree` mask), at RoPE position prompt end +
        depth: exactly the context it has when its label alone follows the prompt. One pass
        per trie chunk (one in all unless the trie has over `labels.MAX_TRIE_NODES` nodes).
        Returns (B, n_labels) (0 for one-token labels) and the tokens run.
        """
        B, L = batch.ids.shape
        cache_mask = _cache_mask(batch, prefix_len)
        end = batch.offsets.astype(np.int32) + L  # each row's position after its last prompt token
        out = np.zeros((B, n_labels), dtype=np.float64)
        ran = 0
        with self.lock:
            for c in chunks:
                T = len(c)
                ids = mx.broadcast_to(mx.array(c.tokens)[None], (B, T))
                positions = mx.array(end[:, None] + c.depth[None, :])
                h, _ = self.model(
                    ids, None, None, cache=kv, cache_mask=cache_mask, last_only=False, positions=positions,
                    tree=mx.array(c.visible),
                )  # fmt: skip
                lp = self._edge_logprobs(h.reshape(B * T, -1), c, T)  # (B, E)
                out[:, c.labels] += lp @ c.paths
                ran += B * T
        return out, ran

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

    def branch_scores(
        self,
        kv: list[KV],
        batch: batching.Batch,
        prefix_len: int,
        pack: Any,
        blocks: Sequence[Any],
        text_sums: dict[int, np.ndarray] | None = None,
        text_counts: np.ndarray | None = None,
    ) -> list[np.ndarray]:
        """Each block's option scores (B, options) from one pass over a pack of branches
        (`branches.Pack`) after the rows' KV: an option's first-token logit (label rows only:
        the normalizer is one per block and row, and cancels in its softmax) plus the exact
        log-probabilities of its later tokens from its trie nodes, as `score_batch` does for
        one prompt. `blocks[k]` is the `branches.Block` of the pack's k-th block. A block with a
        learned head reads its branch's hidden states instead (the last position, and for a
        mean the text part's `text_sums` / `text_counts` from `encode` joined with the branch's
        own tokens): the head's log-probabilities."""
        if not getattr(self.model, "supports_tree", False):
            raise ModelError(f"several questions per text need one of our architectures; {self.path} has no tree masks")
        B, L = batch.ids.shape
        cache_mask = _cache_mask(batch, prefix_len)
        end = batch.offsets.astype(np.int32) + L  # each row's position after its text part
        firsts = [np.asarray(b.options.first_ids if b.head is None else [], dtype=np.int64) for b in blocks]
        rows = np.unique(np.concatenate(firsts))
        layers = sorted({x for b in blocks if b.head is not None for x in b.head.layers})
        collect: dict[int, Any] | None = dict.fromkeys(layers) if layers else None
        with self.lock:
            h, _ = self.model(
                mx.array(pack.ids), None, None, cache=kv, cache_mask=cache_mask, last_only=False,
                positions=mx.array(end[:, None] + pack.positions), tree=mx.array(pack.visible), collect=collect,
            )  # fmt: skip
            D = h.shape[-1]
            out: list[np.ndarray] = [np.zeros((B, 0))] * len(blocks)
            if len(rows):
                at = mx.array(pack.answer_at.astype(np.int32))  # (B, K)
                ans = mx.take_along_axis(h, at[..., None], axis=1).reshape(-1, D)
                first = np.array(self.model.logits(ans, mx.array(rows)).astype(mx.float32), dtype=np.float64)
                first = first.reshape(B, len(blocks), len(rows))
                out = [first[:, k, np.searchsorted(rows, f)] for k, f in enumerate(firsts)]
            if pack.node_at.shape[1]:
                nodes = mx.take_along_axis(h, mx.array(pack.node_at.astype(np.int32))[..., None], axis=1)
                self._add_trie_scores(nodes.reshape(-1, D), B, blocks, out)
            if collect:
                hidden = {layer: np.array(v.astype(mx.float32)) for layer, v in collect.items()}
                for k, b in enumerate(blocks):
                    if b.head is not None:
                        out[k] = _head_scores(b.head, hidden, pack, k, text_sums, text_counts)
        return out

    def _add_trie_scores(self, nodes: mx.array, B: int, blocks: Sequence[Any], out: list[np.ndarray]) -> None:
        """Adds each option's later-token log-probabilities (its trie edges) to `out` in place;
        `nodes` (B * N, D) are the pack's trie nodes, block by block, chunk by chunk."""
        N = nodes.shape[0] // B
        tokens = np.unique(np.concatenate([c.edge_token for b in blocks for c in b.options.trie]))
        lse_parts, picked = [], []
        for lo in range(0, nodes.shape[0], LOGIT_ROWS):
            logits = self.model.logits(nodes[lo : lo + LOGIT_ROWS]).astype(mx.float32)
            lse_parts.append(mx.logsumexp(logits, axis=-1))
            picked.append(mx.take(logits, mx.array(tokens), axis=1))
            mx.eval(lse_parts[-1], picked[-1])
        lse = np.array(mx.concatenate(lse_parts), dtype=np.float64).reshape(B, N)
        got = np.array(mx.concatenate(picked), dtype=np.float64).reshape(B, N, len(tokens))
        base = 0
        for k, b in enumerate(blocks):
            for c in b.options.trie:
                node = base + c.edge_node
                lp = got[:, node, np.searchsorted(tokens, c.edge_token)] - lse[:, node]  # (B, E)
                out[k][:, c.labels] += lp @ c.paths
                base += len(c)

    def _edge_logprobs(self, hidden: mx.array, c: TrieChunk, T: int) -> np.ndarray:
        """log p(edge token | node) for every edge of a chunk, rows (B, E), from the nodes'
        hidden states (B*T, D). The vocabulary's log-sum-exp is taken LOGIT_ROWS node
        positions at a time, so the (positions, V) logits never all exist at once."""
        n = hidden.shape[0]
        lse_parts, picked = [], []
        rows = mx.array(np.unique(c.edge_token))
        for lo in range(0, n, LOGIT_ROWS):
            logits = self.model.logits(hidden[lo : lo + LOGIT_ROWS]).astype(mx.float32)
            lse_parts.append(mx.logsumexp(logits, axis=-1))
            picked.append(mx.take(logits, rows, axis=1))
            mx.eval(lse_parts[-1], picked[-1])
        lse = np.array(mx.concatenate(lse_parts), dtype=np.float64).reshape(-1, T)  # (B, T)
        got = np.array(mx.concatenate(picked), dtype=np.float64).reshape(-1, T, rows.shape[0])  # (B, T, R)
        col = np.searchsorted(np.unique(c.edge_token), c.edge_token)
        return got[:, c.edge_node, col] - lse[:, c.edge_node]  # (B, E)

    def continuation_logprobs(
        self, kv: list[KV], batch: batching.Batch, prefix_len: int, token_ids: Sequence[Sequence[int]]
    ) -> tuple[mx.array, int]:
        """Per label, the sum of log p(label token k | prompt, earlier label tokens) for k >= 1.

        Extends each row's own KV (prefix + suffix) with the label's tokens in one batched
        pass per label; the prompt is never run again. Returns (B, k) and the tokens run.
        The path for a model without tree masks (the mlx-lm fallback), and the "before" row
        of benchmarks/many_labels.py; `trie_logprobs` is the packed pass.
        """
        B, L = batch.ids.shape
        cache_mask = _cache_mask(batch, prefix_len)
        offsets = mx.array(batch.offsets + L)
        cols, ran = [], 0
        with self.lock:
            for toks in token_ids:
                if len(toks) == 1:
                    cols.append(mx.zeros((B,), dtype=mx.float32))
                    continue
                inp = mx.broadcast_to(mx.array(toks[:-1], dtype=mx.int32)[None], (B, len(toks) - 1))
                h, _ = self.model(inp, None, offsets, cache=kv, cache_mask=cache_mask, last_only=False)
                logits = self.model.logits(h).astype(mx.float32)  # (B, n-1, V): context differs per label
                lp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
                tgt = mx.broadcast_to(mx.array(toks[1:], dtype=mx.int32)[None, :, None], (B, len(toks) - 1, 1))
                cols.append(mx.take_along_axis(lp, tgt, axis=-1)[..., 0].sum(axis=1))
                ran += B * (len(toks) - 1)
            out = mx.stack(cols, axis=1)
            mx.eval(out)
        return out, ran


def _head_scores(
    head: Any,
    hidden: dict[int, np.ndarray],
    pack: Any,
    k: int,
    text_sums: dict[int, np.ndarray] | None,
    text_counts: np.ndarray | None,
) -> np.ndarray:
    """A head's log-probabilities for block k of a pack, from the branch's hidden states after
    its layers ({layer: (B, T, D)}): what `Engine.features` gives for the text's own prompt."""
    from .heads import head_input

    layers = sorted(set(head.layers))
    rows = np.arange(pack.answer_at.shape[0])
    last = pack.answer_at[:, k]
    feats: dict[str, np.ndarray] = {}
    if "last" in head.poolings:
        feats["last"] = np.stack([hidden[x][rows, last] for x in layers], axis=1)
    if "mean" in head.poolings:
        assert text_sums is not None and text_counts is not None
        m = pack.chain_len[:, k]
        means = []
        for x in layers:
            own = np.stack([hidden[x][r, last[r] - m[r] + 1 : last[r] + 1].sum(axis=0) for r in rows])
            means.append((text_sums[x] + own) / (text_counts + m)[:, None])
        feats["mean"] = np.stack(means, axis=1).astype(np.float32)
    return head.log_probs(head_input(feats, layers, head))


def _cache_mask(batch: batching.Batch, prefix_len: int) -> mx.array:
    """Which cached keys a continuation of the batch's rows sees: the shared prefix, then each
    row's own real prompt tokens (its left padding masked)."""
    B = batch.ids.shape[0]
    return mx.array(np.concatenate([np.ones((B, prefix_len), dtype=bool), batch.mask], axis=1))
