"""How a batch's prompts become predictions: one scorer object per kind, one interface.

* `LabelScorer`: the labels' tokens after the prompt (first-token logits, or whole label
  sequences through the label trie / per-label passes);
* `HeadScorer`: a learned linear head on hidden states (the forward stops at its layer);
* `QuestionScorer`: several questions per text, each a branch after the text (`branches.py`).

The classifier plans batches and keeps input order; it asks its scorer what a row costs
besides its prompt (`row_extra`, counted in the batch's token budget), what must still fit
after the prompt (`label_extra`), whether label calibration applies (`calibrates`), and for
the predictions of a batch (`run`). A new kind of scoring is one more class here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from . import batching
from .engine import Engine
from .heads import head_input
from .labels import LabelSet, softmax
from .predictions import Item, Prediction, Stats
from .prefix_cache import PrefixCache
from .scoring import score_batch

if TYPE_CHECKING:
    from .branches import QuestionPlan
    from .heads import Head


def _count(st: Stats, batch: batching.Batch, extra: int) -> None:
    st.batches += 1
    st.processed_tokens += batch.padded_tokens + extra
    st.padding_tokens += batch.padded_tokens - batch.real_tokens
    st.label_tokens += extra


def _prediction(item: Item, labels: Sequence[str], scores: np.ndarray, probs: np.ndarray, **kw: object) -> Prediction:
    return Prediction(
        item.index,
        labels[int(np.argmax(scores))],
        {lab: float(x) for lab, x in zip(labels, probs)},
        {lab: float(x) for lab, x in zip(labels, scores)},
        len(item.ids),
        item.truncated,
        **kw,  # type: ignore[arg-type]
    )


def pooled_features(
    engine: Engine,
    batch: batching.Batch,
    prefix: PrefixCache | None,
    layers: list[int],
    poolings: Sequence[str],
    pool_from: int,
) -> dict[str, np.ndarray]:
    """Hidden states after `layers`, pooled; a mean covers the prompt after its shared head
    (`pool_from` tokens): rows after the prefix KV start past it, the others skip it."""
    skip = np.full(len(batch.ids), 0 if prefix is not None else pool_from)
    return engine.features(batch, prefix, layers, poolings, skip)


class LabelScorer:
    """The labels' own tokens after the prompt, exactly (see `scoring.score_batch`)."""

    calibrates = True
    no_calibration = ""

    def __init__(self, engine: Engine, labelset: LabelSet, keep_logits: bool = False, label_pass: str = "trie"):
        self.engine, self.labelset, self.keep_logits, self.label_pass = engine, labelset, keep_logits, label_pass

    @property
    def mode(self) -> str:
        return self.labelset.mode

    @property
    def label_extra(self) -> int:
        return self.labelset.max_len - 1

    @property
    def row_extra(self) -> int:
        """The label trie's (largest chunk's) nodes run beside every row. The per-label passes run
        B x (label length - 1) tokens at a time, so they plan as the prompt alone."""
        trie = self.label_pass == "trie" and getattr(self.engine.model, "supports_tree", False)
        return self.labelset.row_tokens if trie else 0

    def run(self, batch: batching.Batch, items: list[Item], prefix: PrefixCache | None, st: Stats) -> list[Prediction]:
        got = score_batch(self.engine, batch, prefix, self.labelset, self.keep_logits, self.label_pass)
        _count(st, batch, got.label_tokens)
        labels = self.labelset.labels
        return [
            _prediction(item, labels, got.scores[r], softmax(got.scores[r]),
                        logits=None if got.logits is None else got.logits[r])
            for r, item in enumerate(items)
        ]  # fmt: skip


class HeadScorer:
    """A learned head on the hidden states at its layer(s); no label token runs."""

    calibrates = False
    no_calibration = (
        "calibration does not apply to a learned head (its probabilities are fitted on labelled data already): "
        "use calibration='none'"
    )
    mode = "head"
    label_extra = 0
    row_extra = 0

    def __init__(self, engine: Engine, head: Head, pool_from: int):
        self.engine, self.head, self.pool_from = engine, head, pool_from

    def run(self, batch: batching.Batch, items: list[Item], prefix: PrefixCache | None, st: Stats) -> list[Prediction]:
        head = self.head
        layers = sorted(set(head.layers))
        got = pooled_features(self.engine, batch, prefix, layers, sorted(set(head.poolings)), self.pool_from)
        lp = head.log_probs(head_input(got, layers, head))
        _count(st, batch, 0)
        return [_prediction(item, head.labels, lp[r], np.exp(lp[r])) for r, item in enumerate(items)]


class FeaturesOnly:
    """A classifier made for its features (`features_only=True`, the estimator's and `train_head`'s):
    it runs no scoring; asking it for labels is a mistake named."""

    calibrates = False
    no_calibration = "a features-only classifier gives no labels to calibrate"
    mode = "head"
    label_extra = 0
    row_extra = 0

    def run(self, batch: batching.Batch, items: list[Item], prefix: PrefixCache | None, st: Stats) -> list[Prediction]:
        from .labels import LabelError

        raise LabelError(
            "this classifier was made with features_only=True: it gives hidden states (features), not "
            "labels; train a head on them (mlx_slm.train_head) and classify with Classifier(..., head=head)"
        )


class QuestionScorer:
    """Every question of every row: the text part once, then each question as a branch."""

    calibrates = True  # batch, per question (answers.QuestionCalibration)
    no_calibration = ""
    mode = "questions"

    def __init__(self, engine: Engine, plan: QuestionPlan):
        self.engine, self.plan, self.pool_from = engine, plan, len(plan.head)

    @property
    def label_extra(self) -> int:
        return self.plan.label_extra

    @property
    def row_extra(self) -> int:
        return self.plan.row_extra

    def run(self, batch: batching.Batch, items: list[Item], prefix: PrefixCache | None, st: Stats) -> list[Prediction]:
        plan = self.plan
        skip = 0 if prefix is not None else self.pool_from  # a head's mean covers the prompt after its shared head
        kv, sums, counts = self.engine.encode(batch, prefix, plan.head_layers if plan.head_means else (), skip)
        scores: list[np.ndarray] = [np.empty(0)] * len(plan.blocks)
        ran = 0
        p = len(prefix) if prefix is not None else 0
        for pack in plan.packs([it.chains for it in items], self.engine.pad_id):
            got = self.engine.branch_scores(kv, batch, p, pack, [plan.blocks[b] for b in pack.blocks], sums, counts)
            for b, s in zip(pack.blocks, got):
                scores[b] = s
            ran += pack.tokens
        _count(st, batch, ran)
        return [
            Prediction(item.index, n_tokens=len(item.ids) + sum(map(len, item.chains)), truncated=item.truncated,
                       answers=ans)
            for item, ans in zip(items, plan.answers(scores))
        ]  # fmt: skip
