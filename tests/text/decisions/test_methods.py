"""How a question is answered beyond its raw letters (`Method`), and the one rule that binds a
saved method to its question (`Methods.for_question`: by digest, a note for a changed question)."""

from __future__ import annotations

import numpy as np
import pytest

from mlx_slm.text.calibration import Calibrator
from mlx_slm.text.decisions.errors import DecisionError
from mlx_slm.text.decisions.methods import Method, Methods, order_back, orders, permuted
from mlx_slm.text.decisions.openai import openai_questions
from mlx_slm.text.decisions.settings import DecisionConfig
from mlx_slm.text.decisions.systemone import systemone_questions

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


def test_a_saved_method_must_be_made_for_the_questions_options():
    q = _q()
    cal = Calibrator("fit", ("a", "b", "c"), (0.0, 0.0, 0.0), 1.0, 3)
    with pytest.raises(DecisionError, match="made for the options"):
        Method(calibrator=cal, key="team", digest=q.digest).check(q)


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
