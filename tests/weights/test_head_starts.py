"""How the score head starts before the adapters train (`weights/head_starts.py`): fitted on the base
features (probe), the class centroids, or the label words' LM-head rows."""

from __future__ import annotations

import numpy as np

import mlx_slm  # noqa: F401  (BLAS before mlx)
from mlx_slm.weights.finetune import FinetuneSettings, validation_split
from tests.weights.finetuning import FAST, LABELS, _top_probs


def test_probe_initialized_head_starts_ahead(qwen):
    """head_init="probe": the head is fitted on the base features before the first step (its
    training loss is below a zero head's log 3 at once), and the first epoch ends lower too."""
    import mlx.core as mx

    from mlx_slm.weights import adapted as F
    from mlx_slm.weights import head_starts as H

    s = FinetuneSettings(**{**FAST, "val_fraction": 0.2, "head_init": "probe"})
    _, top, enc = _top_probs(qwen, s)
    split = validation_split(qwen.y, LABELS, 0.2, 0)
    top.head = H.probe(top, enc, qwen.y, split, s)
    tr = split[0]
    assert F.cross_entropy(top.scores(enc, tr), mx.array(qwen.y[tr])).item() < 0.5 * np.log(3)
    zero = qwen.train(epochs=1, val_fraction=0.2)
    probe = qwen.train(epochs=1, val_fraction=0.2, head_init="probe")
    assert probe.history[0].train_loss < zero.history[0].train_loss


def test_centroid_and_words_heads_start_from_something(qwen):
    """A head that starts as the base features' class centroids (or the label words' LM-head rows)
    scores the training texts better than the zero head's chance at step 0."""
    import mlx.core as mx

    from mlx_slm.weights import adapted as F
    from mlx_slm.weights import head_starts as H

    s = FinetuneSettings(**{**FAST, "val_fraction": 0.0})
    _, top, enc = _top_probs(qwen, s)
    everything = np.arange(len(qwen.y))
    top.head = H.centroid(top, enc, qwen.y, (everything, everything[:0]), s)
    assert F.cross_entropy(top.scores(enc, everything), mx.array(qwen.y)).item() < np.log(3)
    from mlx_slm.weights.adapters import LabelTokens

    w = H.words(top, LabelTokens(tuple(tuple(t) for t in qwen.label_tokens)))
    assert w.shape == (3, qwen.model.args.hidden_size) and np.abs(np.array(w).sum(0)).max() < 1e-4  # centred
