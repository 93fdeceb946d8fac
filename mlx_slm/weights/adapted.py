"""The fine-tuning run's two passes: the frozen blocks below the adapted ones, run once per text
(`encode`), and the adapted top blocks (`Top`: copies of the model's top blocks with mlx-lm LoRA
layers, the final norm and the objective's scoring), which every step runs and differentiates.

`s` is the run's `finetune.FinetuneSettings` (its batch sizes, seed, layers, rank, dropout).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import numpy as np
from mlx import nn

from ..models import Model
from ..models.base import NATIVE, Context, Tree
from ..text import batching
from .adapters import LabelTokens, adapter_init, head_scores, linear_dims, lora_layer, module_at, shared_head, swap


class View:
    """What `Context` reads of a model, with the ops replaced (training runs the native ones)."""

    def __init__(self, model: Model, ops: Any):
        self.ops, self.args, self.layers = ops, model.args, model.layers


def layout(b: batching.Batch, lt: LabelTokens | None) -> tuple[mx.array, Tree | None]:
    """(mask, tree) of a batch's rows, with objective (b)'s trie nodes after each
    row's own tokens: a node sees the prefix, the row's real tokens and its own ancestors, at
    RoPE position (row end + depth), as label scoring runs them."""
    T = lt.nodes if lt is not None else 0
    if not T:
        return mx.array(b.mask), None
    assert lt is not None and lt.trie is not None
    B, L = b.ids.shape
    mask = np.concatenate([b.mask, np.ones((B, T), dtype=bool)], axis=1)
    own = b.offsets[:, None].astype(np.int32) + np.arange(L, dtype=np.int32)[None]
    nodes = (b.offsets.astype(np.int32) + L)[:, None] + lt.trie.depth[None]
    tree = np.zeros((L + T, L + T), dtype=bool)
    tree[:L, :L] = np.tril(np.ones((L, L), dtype=bool))
    tree[L:, :L] = True
    tree[L:, L:] = lt.trie.visible
    return mx.array(mask), Tree(mx.array(np.concatenate([own, nodes], axis=1)), mx.array(tree))


@dataclass
class Encoded:
    """The hidden states entering the first adapted block: the shared head's (1, P, D) or None,
    and each text's own tokens (then its trie nodes) (L_i [+ T], D)."""

    prefix: mx.array | None
    rows: list[mx.array]
    own: list[list[int]]  # each text's tokens after the shared head
    P: int


def encode(model: Model, seqs: list[list[int]], start: int, lt: LabelTokens | None, s: Any, tick: Callable) -> Encoded:
    """Run the frozen blocks (0 .. start-1) once: the shared head at batch 1, then every text."""
    P = shared_head(seqs)
    frozen = model.layers[:start]
    prefix, kvs = None, None
    if P:
        h = model.embed(mx.array([seqs[0][:P]], dtype=mx.int32))
        ctx = Context(
            model, mx.ones((1, P), dtype=mx.bool_), None, 0, mx.zeros((1,), dtype=mx.int32), False, n_layers=start
        )
        kvs = []
        for blk in frozen:
            h, kv = blk(h, ctx, None, False)
            kvs.append(kv)
        mx.eval(h, kvs)
        prefix = h
    own = [q[P:] for q in seqs]
    rows: list[mx.array] = [mx.zeros((0,))] * len(seqs)
    T = lt.nodes if lt is not None else 0
    done = 0
    for idx in batching.plan([len(o) for o in own], s.batch_size * 2, s.max_tokens * 2, row_extra=T):
        b = batching.pad(own, idx, 0, P)
        mask, tree = layout(b, lt)
        ids = mx.array(b.ids)
        if T:
            assert lt is not None and lt.trie is not None
            ids = mx.concatenate([ids, mx.broadcast_to(mx.array(lt.trie.tokens)[None], (len(idx), T))], axis=1)
        h = model.embed(ids)
        if start:
            ctx = Context(model, mask, None, P, mx.array(b.offsets), False, tree, n_layers=start)
            for i, blk in enumerate(frozen):
                h, _ = blk(h, ctx, None if kvs is None else kvs[i], False)
        mx.eval(h)
        pads = b.ids.shape[1] - np.array([len(own[i]) for i in idx])
        for r, i in enumerate(idx):
            rows[i] = h[r, int(pads[r]) :]
        done += len(idx)
        tick(done)
    return Encoded(prefix, rows, own, P)


class KeyedDropout(nn.Module):
    """Dropout whose masks come from the trainer's key stream (not MLX's global random state)."""

    def __init__(self, p: float, keys: Keys):
        super().__init__()
        self.p, self.keys = p, keys

    def __call__(self, x: mx.array) -> mx.array:
        if not self.keys.training:
            return x
        keep = mx.random.bernoulli(1 - self.p, x.shape, key=self.keys.next())
        return mx.where(keep, x / (1 - self.p), mx.zeros_like(x))


class Keys:
    def __init__(self, key: mx.array):
        self.key, self.training = key, False

    def next(self) -> mx.array:
        self.key, sub = mx.random.split(self.key)
        return sub


class Top:
    """The adapted blocks (copies of the model's top blocks with mlx-lm LoRA layers), the final
    norm and the objective's scoring: what a step runs and differentiates. Its trainable
    arrays are one flat dict (`params`: the LoRA A and B by their model names, and the score
    head's "score.weight"), assigned into the layers before each forward."""

    def __init__(self, model: Model, s: Any, k: int, lt: LabelTokens | None):
        n = len(model.layers)
        self.model, self.lt, self.start, self.prefix_grad = model, lt, n - s.layers, s.prefix_grad
        self.view = View(model, NATIVE)
        self.keys = Keys(mx.random.key(s.seed))
        self.slots: dict[str, tuple[nn.Module, str]] = {}
        self.params: dict[str, mx.array] = {}
        init = mx.random.key(s.seed + 1)
        blocks = []
        for i in range(self.start, n):
            replace = {}
            for key in s.keys:
                name = f"model.layers.{i}.{key}"
                linear = module_at(model.layers[i], key)
                init, sub = mx.random.split(init)
                a, b = adapter_init(sub, *linear_dims(linear), s.rank)
                layer = lora_layer(linear, a, b, s.scale)
                if s.dropout:
                    layer.dropout = KeyedDropout(s.dropout, self.keys)
                replace[key] = layer
                for leaf in ("lora_a", "lora_b"):
                    self.slots[f"{name}.{leaf}"] = (layer, leaf)
                    self.params[f"{name}.{leaf}"] = layer[leaf]
            blocks.append(swap(model.layers[i], replace))
        self.blocks = blocks
        self.head: mx.array | None = None
        if s.objective == "score":
            self.head = mx.zeros((k, model.args.hidden_size), dtype=mx.float32)
            self.params["score.weight"] = self.head

    def assign(self, params: dict[str, mx.array]) -> None:
        for name, v in params.items():
            if name == "score.weight":
                self.head = v
            else:
                layer, leaf = self.slots[name]
                layer[leaf] = v

    def hidden(self, enc: Encoded, idx: np.ndarray) -> tuple[mx.array, mx.array | None]:
        """Final-norm hidden states of the texts `idx`: at the last position (B, D) and at objective
        (b)'s trie nodes (B, T, D) or None. The shared head, then the batch, through the adapted blocks."""
        P, T = enc.P, (self.lt.nodes if self.lt is not None else 0)
        n = len(self.blocks)
        kvs: list[Any] = [None] * n
        if P:
            hp = enc.prefix
            ctx = Context(self.view, mx.ones((1, P), dtype=mx.bool_), None, 0, mx.zeros((1,), dtype=mx.int32), True)
            for j, blk in enumerate(self.blocks):
                hp, kvs[j] = blk(hp, ctx, None, j == n - 1)
            if not self.prefix_grad:
                kvs = [(mx.stop_gradient(k), mx.stop_gradient(v)) for k, v in kvs]
        b = batching.pad(enc.own, idx, 0, P)
        L = b.ids.shape[1]
        D = self.model.args.hidden_size
        h = mx.stack(
            [mx.concatenate([mx.zeros((L + T - r.shape[0], D), dtype=r.dtype), r]) for r in (enc.rows[i] for i in idx)]
        )
        mask, tree = layout(b, self.lt)
        last_only = not T
        ctx = Context(self.view, mask, None, P, mx.array(b.offsets), last_only, tree)
        for j, blk in enumerate(self.blocks):
            h, _ = blk(h, ctx, kvs[j], last_only and j == n - 1)
        h = self.model.model.norm(h)
        return (h[:, -1], None) if last_only else (h[:, L - 1], h[:, L:] if T else None)

    def scores(self, enc: Encoded, idx: np.ndarray) -> mx.array:
        """(B, K) label logits of the texts `idx`."""
        return self.scored(enc, idx)[0]

    def scored(self, enc: Encoded, idx: np.ndarray) -> tuple[mx.array, mx.array]:
        """((B, K) label logits, (B, D) last-position states) of the texts `idx`."""
        last, nodes = self.hidden(enc, idx)
        if self.head is not None:
            return head_scores(self.head, last), last
        assert self.lt is not None
        return self.lt.scores(self.model, last, nodes), last


def cross_entropy(scores: mx.array, gold: mx.array, smoothing: float = 0.0) -> mx.array:
    """Mean cross-entropy of (B, K) label logits against gold indices (B,), the gold's mass
    spread by `smoothing` over every label (label smoothing)."""
    lp = scores - mx.logsumexp(scores, axis=-1, keepdims=True)
    nll = -mx.take_along_axis(lp, gold[:, None], axis=1).mean()
    return nll if not smoothing else (1 - smoothing) * nll - smoothing * lp.mean()
