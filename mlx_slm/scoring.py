"""Label scoring: the score of each label for each row of a batch, by the label set's mode.

* first-token: every label is one distinct token, so the label-row logits at the last
  prompt position decide (the vocabulary's normalizer is the same for every label of a
  row, and cancels in the softmax over labels).
* sequence: a label of several tokens, or labels that share a first token: each label's
  score is its first-token logit plus the exact log-probabilities of its later tokens,
  computed by extending the row's own KV with the labels' token trie, all labels in one
  pass (see `labels.build_trie` and `Engine.trie_logprobs`).

Scores are log-probabilities up to one constant per row; `probs` (their softmax) are exact.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from . import batching
from .engine import Engine
from .labels import LabelSet
from .prefix_cache import PrefixCache


@dataclass
class BatchScores:
    scores: np.ndarray  # (B, k) float64
    logits: np.ndarray | None  # (B, V) full last-position logits, when asked for
    label_tokens: int  # label continuation tokens run (sequence mode)


LABEL_PASSES = ("trie", "per-label")


def score_batch(
    engine: Engine,
    batch: batching.Batch,
    prefix: PrefixCache | None,
    labelset: LabelSet,
    keep_logits: bool = False,
    label_pass: str = "trie",
) -> BatchScores:
    """Label scores of one batch. `label_pass`: how sequence mode runs the continuations:
    "trie", every label's later tokens in one packed pass (per trie chunk); "per-label", one
    batched pass per label (the path before the trie: kept for comparison, and the one a
    model without tree masks takes)."""
    rows = mx.array(labelset.first_ids, dtype=mx.int32)
    first, full, kv = engine.forward(batch, prefix, rows, keep_logits)
    scores = np.array(first, dtype=np.float64)
    ran = 0
    if labelset.mode == "sequence":
        p = len(prefix) if prefix else 0
        if label_pass == "trie" and getattr(engine.model, "supports_tree", False):
            rest, ran = engine.trie_logprobs(kv, batch, p, labelset.trie, len(labelset.labels))
        else:
            rest, ran = engine.continuation_logprobs(kv, batch, p, labelset.token_ids)
            rest = np.array(rest, dtype=np.float64)
        scores = scores + rest
    return BatchScores(scores, full, ran)
