"""How a question is answered beyond its raw letters (`Method`), and the one rule that binds a
saved method to its question (`Methods.for_question`: by digest, a note for a changed question); and
the methods on a tiny model through the Decider, each equal to the computation it stands for."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mlx_slm.classifier.classifier import Classifier
from mlx_slm.classifier.decider import Decider
from mlx_slm.engine import Engine
from mlx_slm.text.calibration import Calibrator
from mlx_slm.text.decisions.errors import DecisionError
from mlx_slm.text.decisions.methods import (
    FILLERS,
    Method,
    Methods,
    NoneOf,
    order_back,
    orders,
    permuted,
    threshold_text,
    trained_phrase,
    tuned_prompt,
)
from mlx_slm.text.decisions.openai import openai_questions
from mlx_slm.text.decisions.prompt import render_user_message, styled
from mlx_slm.text.decisions.questions import DecisionRequest
from mlx_slm.text.decisions.settings import DecisionConfig
from mlx_slm.text.decisions.systemone import systemone_questions
from mlx_slm.text.heads import Head

CFG = DecisionConfig()
TEAM = {"type": "choice", "instructions": "Which team?", "criteria": {"billing": None, "tech": None, "account": None}}


def _q(criteria=None, instructions="Which team?"):
    return systemone_questions(
        {"team": {**TEAM, "instructions": instructions, **({"criteria": criteria} if criteria else {})}}, CFG
    )[0]


def test_nothing_applied_returns_the_raw_answer_itself():
    raw = np.array([0.2, 0.5, 0.3])
    assert Method().answer(raw) is raw and Method().is_raw


def test_a_prior_divides_and_renormalises():
    raw = np.array([0.2, 0.5, 0.3])
    prior = Calibrator("batch", ("billing", "tech", "account"), tuple(np.log([0.5, 0.25, 0.25])), 1.0, 10)
    got = Method(prior="batch").answer(raw, prior)
    want = raw / np.array([0.5, 0.25, 0.25])
    np.testing.assert_allclose(got, want / want.sum(), rtol=1e-12)
    assert Method(prior="batch").record(prior)["calibration"] == "batch"


def test_a_saved_calibrator_wins_over_a_runs_prior():
    labels = ("billing", "tech", "account")
    fit = Calibrator("fit", labels, (0.0, 0.0, 0.0), 2.0, 5)
    prior = Calibrator("batch", labels, tuple(np.log([0.8, 0.1, 0.1])), 1.0, 10)
    raw = np.array([0.2, 0.5, 0.3])
    got = Method(calibrator=fit).answer(raw, prior)
    want = raw**0.5
    np.testing.assert_allclose(got, want / want.sum(), rtol=1e-12)


def test_a_saved_method_applies_to_its_question_by_digest_whatever_its_id_or_route():
    q = _q()
    saved = Method(style="names", key="team", digest=q.digest)
    ms = Methods.of([saved])
    (oa,) = openai_questions([{"type": "choice", "instructions": "Which team?", "choices": [{"value": "billing"}, {"value": "tech"}, {"value": "account"}]}], CFG)  # fmt: skip
    assert oa.key == "#0" and ms.for_question(oa) == (saved, None)
    changed = _q(instructions="Which team now?")
    got, note = ms.for_question(changed)
    assert got == Method() and "differs from the one fitted" in note
    other = systemone_questions({"other": {**TEAM, "instructions": "Another?"}}, CFG)[0]
    assert ms.for_question(other) == (Method(), None)  # another id, another question: no note


def test_saved_methods_round_trip_and_old_temperatures_read_as_fits():
    q = _q()
    cal = Calibrator("fit", q.answer_names(), (0.1, -0.2, 0.1), 1.5, 30)
    m = Method(style="names", permute=2, calibrator=cal, key="team", digest=q.digest, report={"cv_accuracy": 0.9})
    back = Method.from_dict(m.to_dict(), "t")
    assert back == m and back.report == {"cv_accuracy": 0.9}
    old = Methods.from_record(None, {"team": 2.0}, [q], "t")
    (got,) = old.saved.values()
    assert got.calibrator.temperature == 2.0 and got.digest == q.digest and got.key == "team"
    with pytest.raises(DecisionError, match="none of the task's questions"):
        Methods.from_record(None, {"nope": 2.0}, [q], "t")
    with pytest.raises(DecisionError, match="above 0"):
        Methods.from_record(None, {"team": 0}, [q], "t")


def test_one_question_saved_twice_under_two_ids_is_refused_naming_both():
    """A method is bound to the question itself: two for one question (two annotators' fields fitted
    apart) would leave one answering both, silently; a task holding them is refused."""
    q = _q()
    cal = Calibrator("fit", q.answer_names(), (0.0, 0.0, 0.0), 1.0, 3)
    a, b = (Method(calibrator=cal, key=k, digest=q.digest) for k in ("team_a", "team_b"))
    with pytest.raises(DecisionError, match=r"questions 'team_a' and 'team_b' are the same question"):
        Methods.from_record([a.to_dict(), b.to_dict()], {}, [q], "t")
    assert Methods.of([a]).for_question(q) == (a, None)


def test_a_task_saved_before_level_labels_were_in_a_digest_still_binds_its_methods():
    """An OpenAI score whose levels have descriptions: its digest now holds its level labels; a task
    saved before binds its method by the digest of then, to that very question of its own."""
    (q,) = openai_questions(
        [{"type": "score", "name": "urgency", "instructions": "How urgent?",
          "levels": [{"label": "Low", "description": "can wait"}, {"label": "High"}]}], CFG
    )  # fmt: skip
    assert q.digest != q.digest_before
    cal = Calibrator("fit", q.answer_names(), (0.0, 0.0), 2.0, 10)
    then = Method(calibrator=cal, key="urgency", digest=q.digest_before)
    got = Methods.from_record([then.to_dict()], {}, [q], "t")
    assert got.for_question(q) == (replace(then, digest=q.digest), None)


@pytest.mark.parametrize("report", [["hand", "edited"], "text", 3])
def test_a_saved_methods_report_is_an_object(report):
    d = {**Method(key="team", digest=_q().digest).to_dict(), "report": report}
    with pytest.raises(DecisionError, match=r"t: 'report' is an object"):
        Method.from_dict(d, "t")


def test_a_fitted_temperature_is_served_on_the_floor_it_was_fitted_on():
    """Raw answers with exact zeros (a whole name's probability underflowing): the fit reads a 0 at
    the calibrators' one floor, and `Method.answer` serves what the fit scored, not a sharper answer."""
    from mlx_slm.text.calibration import fit_labelled
    from mlx_slm.text.decisions.fitting import apply, log_of

    rng = np.random.default_rng(0)
    gold = np.repeat([0, 1, 2], 20)
    raw = np.zeros((60, 3))
    raw[np.arange(60), rng.integers(0, 3, 60)] = 1.0  # overconfident and often wrong: a large T fitted
    cal = fit_labelled(log_of(raw), gold, ("a", "b", "c"), temperature=True)
    assert cal.temperature > 10
    fitted = np.exp(cal.apply(log_of(raw)))
    np.testing.assert_allclose(Method(calibrator=cal).answer(raw[0]), fitted[0], rtol=1e-12)
    np.testing.assert_allclose(apply(cal, raw), fitted, rtol=1e-12)
    assert fitted[0].max() < 0.9  # softened as the fit learned, not 0.9999 / 0 / 0


def test_a_saved_method_must_be_made_for_the_questions_options():
    q = _q()
    cal = Calibrator("fit", ("a", "b", "c"), (0.0, 0.0, 0.0), 1.0, 3)
    with pytest.raises(DecisionError, match="made for the options"):
        Method(calibrator=cal, key="team", digest=q.digest).check(q)


def test_none_of_these_answers_its_option_when_no_other_reaches_the_threshold():
    """The rule is classify's (`out_of_scope.answers`): the none option where it is the likeliest
    (no change) or where no other option reaches min_confidence; the probabilities are not touched."""
    q = _q({"billing": None, "tech": None, "none of these": None})
    rule = NoneOf("none of these", 0.6)
    assert rule.changes(q, np.array([0.5, 0.3, 0.2]))  # no in-scope option at 0.6
    assert not rule.changes(q, np.array([0.6, 0.3, 0.1]))  # billing reaches it
    assert not rule.changes(q, np.array([0.2, 0.3, 0.5]))  # none is the likeliest anyway: nothing changed
    assert not NoneOf("none of these").changes(q, np.array([0.5, 0.3, 0.2]))  # no threshold: argmax
    m = Method(head=None, key="team", digest=q.digest, none=rule)
    p = np.array([0.5, 0.3, 0.2])
    assert m.answer(p) is p
    rec = m.record(q=q, final=p)
    assert rec["none_of_these"] == {"option": "none of these", "min_confidence": 0.6, "answered_none": True}
    back = Method.from_dict(replace(m, none=NoneOf("none of these", 0.6, {"target": 0.02})).to_dict(), "t")
    assert back.none == rule and back.none.chosen == {"target": 0.02}
    m.check(q)
    with pytest.raises(DecisionError, match="'nope' is none of"):
        replace(m, none=NoneOf("nope", 0.5)).check(q)
    with pytest.raises(DecisionError, match="probability from 0 to 1"):
        NoneOf("none of these", 1.5)
    # a task edited by hand: its none option not the question's, or no probability, named as it is read
    edited = {**m.to_dict(), "none_of_these": {"option": "spam", "min_confidence": 0.5}}
    with pytest.raises(DecisionError, match="'spam' is none of"):
        Methods.from_record([edited], {}, [q], "the task")
    edited = {**m.to_dict(), "none_of_these": {"option": "none of these", "min_confidence": "high"}}
    with pytest.raises(DecisionError, match="the task: method 1: 'none_of_these': min_confidence is a probability"):
        Methods.from_record([edited], {}, [q], "the task")


@pytest.mark.parametrize("bad", [{"style": "emoji"}, {"permute": 3}, {"prior": "em"}])
def test_bad_settings_are_named(bad):
    with pytest.raises(DecisionError):
        Method(**bad)


def test_orders_and_back():
    q = _q()
    fwd, rev = orders(q, 2)
    assert fwd == (0, 1, 2) and rev == (2, 1, 0)
    moved = permuted(q, rev, lambda _t, names: CFG.labels_for("choice", names))
    assert moved.options == ("account", "tech", "billing") and moved.labels == ("A", "B", "C")
    np.testing.assert_array_equal(order_back(np.array([0.6, 0.3, 0.1]), rev), [0.1, 0.3, 0.6])
    assert Method(permute=2).asks(q) == ("letters", 2)
    (noul,) = systemone_questions({"u": {"type": "noul", "instructions": "?"}}, CFG)
    assert Method(style="names", permute=2).asks(noul) == ("letters", 1)  # a noul is Yes/No, in one order


# The Decider's methods on a tiny model: each way of answering beyond the raw letters equals the
# computation it stands for, and the raw answer stays exact beside it.


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


def test_a_batch_prior_not_given_is_said_raw_not_batch(engine):
    """A Decider whose method divides by a run's batch prior, asked without one (the Python API, or a
    run's first states before its prior is found): its answers are the raw ones and say "none"; with
    the prior, divided and said "batch"."""
    d, got = decide(engine, Method(prior="batch"))
    assert all(a["calibration"] == "none" for r in got for a in r.applied)
    assert all(r.probabilities[0] is r.raw[0] for r in got)
    prior = Calibrator("batch", QS[0].answer_names(), tuple(np.log([0.5, 0.25, 0.25])), 1.0, 3)
    again = d.finish(got[0], {QS[0].digest: prior})
    assert again.applied[0]["calibration"] == "batch" and again.applied[1]["calibration"] == "none"
    np.testing.assert_allclose(again.probabilities[0], Method(prior="batch").answer(got[0].raw[0], prior))


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
    # A head is read on the prompt it was trained on (the letters, one order), whatever style or order
    # averaging a method beside it names (a task edited by hand): the same answers, not garbage.
    styled = replace(trained, style="names", permute=2)
    assert styled.asks(QS[0]) == ("letters", 1)
    again = Decider(engine, CFG, methods=Methods.of([styled]), state_cache=0).decide(
        [DecisionRequest(STATES[0], (QS[0],))]
    )
    np.testing.assert_allclose(again[0].probabilities[0], want[0], atol=1e-5)


@pytest.mark.parametrize("n", [3, 77])
def test_a_tuned_classifier_is_told_every_option_by_name(n):
    """The tuned classifier's system message is the names style's question, listing every option
    (77 intents too: as `classify`'s prompt lists its labels), braces doubled for its template."""
    names = [f"intent {{{i}}}" for i in range(n)]
    (q,) = systemone_questions(
        {"i": {"type": "choice", "instructions": "Intent?", "criteria": dict.fromkeys(names)}}, CFG
    )
    message, labels = tuned_prompt(q)
    assert labels == tuple(names)
    assert message.startswith("Intent?") and all(f"- intent {{{{{i}}}}}" in message for i in range(n))


def test_a_trained_method_is_named_for_what_it_is():
    assert [trained_phrase(t) for t in ("head", "fine-tuned", "learned head")] == [
        "trained head",
        "fine-tuned classifier",
        "trained head (the question its own prompt)",
    ]


@given(st.floats(min_value=0.0, max_value=1.0, allow_nan=False))
def test_a_threshold_is_said_apart_from_0_and_1(t):
    """A threshold of 0.9999999999999916 is not "below 1" (which reads as always): as few digits as
    keep it apart from 0 and 1, and close to it."""
    got = float(threshold_text(t))
    assert (got in (0.0, 1.0)) == (t in (0.0, 1.0)) and got == pytest.approx(t, rel=1e-2, abs=1e-12)


def test_a_threshold_is_short_where_it_can_be():
    assert threshold_text(0.5) == "0.5" and threshold_text(0.123456) == "0.123" and threshold_text(1.0) == "1"
    assert threshold_text(0.9999999999999916) == "0.99999999999999"
