"""How the score head starts, before the adapters train: at zero (the default), fitted on the base
model's features (`probe`: linear probing, then fine-tuning), as a nearest-centroid classifier on
them (`centroid`), or as the LM head's rows of each label's words (`words`).

`s` is the run's `finetune.FinetuneSettings`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import mlx.core as mx
import mlx.optimizers as optim
import numpy as np

from ..text import batching
from .adapted import Encoded, Top, cross_entropy
from .adapters import LabelTokens

PROBE_PENALTIES = (1e-3, 1e-2, 1e-1, 1.0)  # L2 on the standardized head, chosen by validation loss


def probe(top: Top, enc: Encoded, y: np.ndarray, split: tuple[np.ndarray, np.ndarray], s: Any):
    """A score head fitted on the base model's features first (linear probing, then fine-tuning:
    LP-FT): multinomial logistic regression without a bias (the score head has none) on the final
    norm's last position, each dimension scaled by its spread for the fit (folded back into the
    weights), its L2 penalty chosen among PROBE_PENALTIES by validation loss (no validation set:
    0.01). Full-batch Adam, fixed iterations: deterministic."""
    tr, va = split
    everything = np.concatenate([tr, va])
    lengths = np.array([len(o) for o in enc.own])
    feats = np.zeros((len(enc.own), top.model.args.hidden_size), dtype=np.float32)
    for b in batching.plan(lengths[everything], s.batch_size * 2, s.max_tokens * 2):
        rows = everything[b]
        last, _ = top.hidden(enc, rows)
        feats[rows] = np.array(last.astype(mx.float32))
    scale = feats[tr].std(axis=0) + 1e-6
    x = mx.array(feats / scale)
    assert top.head is not None
    k = top.head.shape[0]
    best: tuple[float, mx.array] | None = None
    for lam in PROBE_PENALTIES if len(va) else (1e-2,):
        w = mx.zeros((k, x.shape[1]))
        opt = optim.Adam(learning_rate=0.01)

        def loss(w: mx.array, lam: float = lam) -> mx.array:
            return cross_entropy(x[mx.array(tr)] @ w.T, mx.array(y[tr])) + 0.5 * lam * (w * w).sum() / len(tr)

        step = mx.value_and_grad(loss)
        for _ in range(300):
            _, g = step(w)
            w = opt.apply_gradients({"w": g}, {"w": w})["w"]
            mx.eval(w, opt.state)
        vl = cross_entropy(x[mx.array(va)] @ w.T, mx.array(y[va])).item() if len(va) else 0.0
        if best is None or vl < best[0]:
            best = (vl, w)
    assert best is not None
    return best[1] / mx.array(scale)[None]


def features(top: Top, enc: Encoded, rows: np.ndarray, s: Any) -> np.ndarray:
    """(N, D) float32 final-norm states at the last position of the texts `rows`, adapters as they are."""
    lengths = np.array([len(o) for o in enc.own])
    feats = np.zeros((len(rows), top.model.args.hidden_size), dtype=np.float32)
    for b in batching.plan(lengths[rows], s.batch_size * 2, s.max_tokens * 2):
        last, _ = top.hidden(enc, rows[b])
        feats[b] = np.array(last.astype(mx.float32))
    return feats


def temperature(logits_of: Callable[[float], np.ndarray], y: np.ndarray) -> float:
    """The scale a > 0 that minimizes the cross-entropy of logits_of(a) (golden section on log a)."""

    def ce(log_a: float) -> float:
        z = logits_of(math.exp(log_a))
        z = z - z.max(1, keepdims=True)
        return float(-(z[np.arange(len(y)), y] - np.log(np.exp(z).sum(1))).mean())

    lo, hi = -12.0, 8.0
    g = (math.sqrt(5) - 1) / 2
    for _ in range(60):
        a, b = hi - g * (hi - lo), lo + g * (hi - lo)
        if ce(a) < ce(b):
            hi = b
        else:
            lo = a
    return math.exp((lo + hi) / 2)


def centroid(top: Top, enc: Encoded, y: np.ndarray, split: tuple[np.ndarray, np.ndarray], s: Any):
    """A score head that starts as a nearest-centroid classifier on the base model's features (a
    diagonal LDA without the per-class bias, which a bias-free head cannot hold): row k is
    a * (c_k - m) / v, c_k the class mean, m their mean, v the pooled within-class variance per
    dimension; the scale a fitted on leave-one-out centroids, so the head starts sure of itself
    only as far as held-out texts justify (a head that already fits the training texts would
    pass the adapters no gradient)."""
    tr = split[0]
    f, yt = features(top, enc, tr, s), y[tr]
    k = top.head.shape[0] if top.head is not None else int(y.max()) + 1
    n = np.bincount(yt, minlength=k).astype(np.float64)
    sums = np.zeros((k, f.shape[1]))
    np.add.at(sums, yt, f)
    c = sums / n[:, None]
    v = ((f - c[yt]) ** 2).sum(0) / max(1, len(yt) - k) + 1e-6
    m = c.mean(0)
    base = (f / v) @ (c - m).T  # (N, K)
    # leave one out: each text's own class mean without it
    own = (n[yt][:, None] * c[yt] - f) / np.maximum(n[yt] - 1, 1)[:, None] - m
    loo = base.copy()
    loo[np.arange(len(yt)), yt] = ((f / v) * own).sum(1)
    a = temperature(lambda a: a * loo, yt)
    return mx.array((a * (c - m) / v).astype(np.float32))


def words(top: Top, lt: LabelTokens) -> mx.array:
    """A score head that starts as the LM head's rows of each label's tokens (their mean), minus
    their mean over the labels: the model's own reading of the label words at step 0."""
    table = top.model.head_weight()
    w = mx.stack(
        [mx.take(table, mx.array(list(ids), dtype=mx.int32), axis=0).astype(mx.float32).mean(0) for ids in lt.token_ids]
    )
    return w - w.mean(0, keepdims=True)
