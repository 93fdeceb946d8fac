"""Label scoring: the score of each label for each row of a batch, by the label set's mode.

* first-token: every label is one distinct token, so the label-row logits at the last
  prompt position decide (the vocabulary's normalizer is the same for every label of a
  row, and cancels in the softmax over labels).
* sequence: a label of several tokens, or labels that share a first token: each label's
  score is its first-token logit plus the exact log-probabilities of its later tokens,
  computed by extending the row's own KV with the label (see `labels.py`).

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


def score_batch(
    engine: Engine, batch: batching.Batch, prefix: PrefixCache | None, labelset: LabelSet, keep_logits: bool = False
) -> BatchScores:
    rows = mx.array(labelset.first_ids, dtype=mx.int32)
    first, full, kv = engine.forward(batch, prefix, rows, keep_logits)
    ran = 0
    if labelset.mode == "sequence":
        rest, ran = engine.continuation_logprobs(kv, batch, len(prefix) if prefix else 0, labelset.token_ids)
        first = first + rest
    return BatchScores(np.array(first, dtype=np.float64), full, ran)
