"""A learned linear head on hidden states (`kinds/head.py`): the head path runs the layers up to the
head's only, and refuses calibration and other labels."""

from __future__ import annotations

import numpy as np
import pytest

from mlx_slm.text.heads import (
    Head,
    fit_linear,
)
from mlx_slm.text.workload import tickets

pytest.importorskip("sklearn")


# --------------------------------------------------------------------------- the head path
LABELS = ("billing", "technical", "account")


SYSTEM, TEMPLATE = "You classify tickets.", "Ticket: {text}\nCategory:"


def test_head_classifier_stops_at_the_head_layer(tiny_head, monkeypatch):
    """The head path runs the layers up to the head's only (no later block, no vocabulary
    projection, no label tokens) and equals the head applied to each prompt's features alone."""
    from mlx_slm.classifier.classifier import Classifier
    from mlx_slm.jobs.train import head_classifier

    engine = tiny_head[0]
    texts = [t for t, _ in tickets(20)]
    got, errors, _ = head_classifier(engine, LABELS, SYSTEM, TEMPLATE).features(texts, [1])
    f = got["last"]
    assert errors == [None] * len(texts) and f.shape == (len(texts), 1, 64)
    head = Head(LABELS, (1,), *fit_linear(f[:, 0], np.arange(len(texts)) % 3, 3, "logistic", 1.0))
    clf = Classifier(engine, LABELS, SYSTEM, TEMPLATE, head=head)
    assert clf.mode == "head" and clf.labelset.row_tokens == 0 and clf.kind.label_extra == 0
    m = engine.model
    saved_layers = list(m.layers)

    class Boom:
        def __init__(self, layer):
            self.layer_type = layer.layer_type  # read when the forward plans its masks

        def __call__(self, *a, **k):
            raise AssertionError("a layer after the head's ran")

    try:
        m.layers[1:] = [Boom(x) for x in m.layers[1:]]
        monkeypatch.setattr(m, "logits", lambda *a, **k: (_ for _ in ()).throw(AssertionError("vocabulary ran")))
        run = clf.run(texts, window=len(texts))
        preds = list(run)
        feats = [clf.features([t], [1])[0]["last"][0] for t in texts]
    finally:
        m.layers[:] = saved_layers
        monkeypatch.undo()
    assert run.stats.label_tokens == 0 and run.stats.items == len(texts)
    one = Classifier(engine, LABELS, SYSTEM, TEMPLATE, head=head, batch_size=1, use_prefix_cache=False)
    for p, q, f in zip(preds, one.classify(texts), feats):
        lp = head.log_probs(f[None])[0]
        assert p.label == q.label == LABELS[int(lp.argmax())]
        np.testing.assert_allclose([p.scores[lab] for lab in LABELS], lp, atol=1e-4)
        np.testing.assert_allclose([p.probs[lab] for lab in LABELS], [q.probs[lab] for lab in LABELS], atol=1e-4)
        assert abs(sum(p.probs.values()) - 1) < 1e-9


def test_head_refuses_calibration_and_other_labels(tiny_head):
    from mlx_slm.classifier.classifier import Classifier
    from mlx_slm.text.labels import LabelError

    engine, head = tiny_head
    with pytest.raises(LabelError, match="calibration does not apply"):
        Classifier(engine, LABELS, head=head, calibration="batch")
    with pytest.raises(LabelError, match="trained for the labels"):
        Classifier(engine, ("a", "b", "c"), head=head)
    clf = Classifier(engine, LABELS, head=head)
    with pytest.raises(LabelError, match="calibration does not apply"):
        clf.classify(["x"], calibration="batch")
    for setting in ({"scoring": "first"}, {"keep_logits": True}, {"label_pass": "per-label"}):
        with pytest.raises(LabelError, match=f"{next(iter(setting))}=.* is a label-scoring setting"):
            Classifier(engine, LABELS, head=head, **setting)
    d = head.dim
    wide = Head(LABELS, head.layers, *(np.concatenate([a, a], axis=-1) for a in (head.mean, head.scale, head.coef)),
                head.intercept)  # fmt: skip
    deep = Head(LABELS, (99,), head.mean[:d], head.scale[:d], head.coef[:, :d], head.intercept)
    for other in (wide, deep):  # a head trained on another model
        with pytest.raises(LabelError, match="use the model the head was trained on"):
            Classifier(engine, LABELS, head=other)
