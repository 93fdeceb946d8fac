"""The Decider's methods on a tiny model: each way of answering beyond the raw letters equals the
computation it stands for, and the raw answer stays exact beside it.

* two option orders: the mean of the question asked forward and asked reversed, each alone;
* the names style: our labels path (a `Classifier` scoring the names whole after the same prompt);
* the contextual prior: the mean answer to the content-free fillers, divided out;
* a trained head: the head applied to `Decider.features` (the states it was trained on), in the
  same pass as untrained questions.
"""

from __future__ import annotations

import numpy as np
import pytest

from mlx_slm.classifier.classifier import Classifier
from mlx_slm.classifier.decider import Decider
from mlx_slm.engine import Engine
from mlx_slm.text.decisions.methods import FILLERS, Method, Methods, orders, permuted
from mlx_slm.text.decisions.prompt import render_user_message, styled
from mlx_slm.text.decisions.questions import DecisionRequest
from mlx_slm.text.decisions.settings import DecisionConfig
from mlx_slm.text.decisions.systemone import systemone_questions
from mlx_slm.text.heads import Head

CFG = DecisionConfig()
QS = systemone_questions(
    {
        "team": {"type": "choice", "instructions": "Which team?", "criteria": {"billing": "Payments", "tech": None, "account": None}},
        "urgent": {"type": "noul", "instructions": "Urgent?"},
    },
    CFG,
)  # fmt: skip
STATES = ["I was charged twice for my order.", "The app crashes on start.", {"ticket": "new email please"}]


@pytest.fixture(scope="module")
def engine(tiny_arch):
    return Engine.load(str(tiny_arch.mlx("qwen2")))


def decide(engine, method: Method, qs=QS, **kw):
    d = Decider(engine, CFG, methods=Methods(default=method), state_cache=0, **kw)
    return d, d.decide([DecisionRequest(s, tuple(qs)) for s in STATES])


def test_two_orders_are_the_mean_of_each_order_asked_alone(engine):
    _, raw = decide(engine, Method())
    _, both = decide(engine, Method(permute=2))
    _, rev = decide(engine, Method(), (permuted(QS[0], orders(QS[0], 2)[1], lambda t, n: CFG.labels_for(t, n)),))
    for r, b, v in zip(raw, both, rev):
        back = v.probabilities[0][::-1]  # reversed options back in the question's order
        np.testing.assert_allclose(b.probabilities[0], (r.probabilities[0] + back) / 2, atol=1e-5)
        np.testing.assert_allclose(b.probabilities[1], r.probabilities[1], atol=1e-6)  # a noul: one order
        assert b.applied[0]["permute"] == 2 and b.raw[0] is b.probabilities[0]  # no prior: raw is the answer


def test_the_names_style_equals_our_labels_path(engine):
    """Parity of the names style against the labels kind: a classifier scoring the names whole after
    the very user message the names style renders (no system, the text as the whole user turn)."""
    _, got = decide(engine, Method(style="names"), qs=QS[:1])
    q = styled(QS[0], "names")
    clf = Classifier(engine, list(q.labels), None, "{text}", scoring="sequence")
    want = clf.classify([render_user_message(s, q, "names") for s in STATES])
    for g, w in zip(got, want):
        np.testing.assert_allclose(g.probabilities[0], [w.probs[x] for x in q.labels], atol=1e-5)


def test_the_contextual_prior_is_the_fillers_mean_answer_divided_out(engine):
    d, got = decide(engine, Method(prior="contextual"))
    _, fill = decide(engine, Method())
    cf = Decider(engine, CFG, state_cache=0).decide([DecisionRequest(f, (QS[0],)) for f in FILLERS])
    prior = np.mean([r.probabilities[0] for r in cf], axis=0)
    for g, raw in zip(got, fill):
        want = raw.probabilities[0] / prior
        np.testing.assert_allclose(g.probabilities[0], want / want.sum(), atol=1e-5)
        np.testing.assert_allclose(g.raw[0], raw.probabilities[0], atol=1e-7)  # the raw answer kept beside it
        assert g.applied[0]["calibration"] == "contextual"
    assert len(d._contextual) == 2  # kept per question (and style, orders)


def test_a_trained_head_reads_the_features_it_was_trained_on_in_the_same_pass(engine):
    d = Decider(engine, CFG, state_cache=0)
    layers = (1, len(engine.model.layers))
    feats = np.stack(d.features(STATES, QS[0], layers))  # (n, layers, D)
    rng = np.random.default_rng(0)
    dim = feats.shape[-1] * len(layers)
    head = Head(QS[0].answer_names(), layers, np.zeros(dim), np.ones(dim), rng.normal(0, 0.01, (3, dim)), np.zeros(3))
    trained = Method(head=head, key="team", digest=QS[0].digest)
    hd = Decider(engine, CFG, methods=Methods.of([trained]), state_cache=0)
    got = hd.decide([DecisionRequest(s, tuple(QS)) for s in STATES])
    want = np.exp(head.log_probs(feats.reshape(len(STATES), -1).reshape(len(STATES), len(layers), -1)))
    _, raw = decide(engine, Method())
    for i, g in enumerate(got):
        np.testing.assert_allclose(g.probabilities[0], want[i], atol=1e-5)
        assert g.applied[0]["trained"] == "head" and g.applied[1] == Method().record()
        np.testing.assert_allclose(g.probabilities[1], raw[i].probabilities[1], atol=1e-6)  # the untrained one: raw
