"""Calibration and abstain per question (`text/answers.py`), on fixed answers (no model): each
question's branch read back from its answer, a batch prior per question fitted on the warm-up and
divided out of every answer (raw probabilities kept), a head question left as it is, and
`min_confidence` abstaining on the probabilities as written."""

from __future__ import annotations

import numpy as np
import pytest

from mlx_slm.text.answers import QuestionCalibration, block_log_probs
from mlx_slm.text.calibration import CalibrationError
from mlx_slm.text.predictions import Prediction
from mlx_slm.text.questions import Question

TEAM = Question("team", "Which team?", "choice", ("billing", "technical"))
TAGS = Question("tags", "Mentions {label}?", "multi", ("refund", "crash"), threshold=0.5)


def _pred(i, p_billing, p_refund, p_crash):
    lp = np.log
    return Prediction(
        i,
        answers={
            "team": TEAM.answer([lp([p_billing, 1 - p_billing])]),
            "tags": TAGS.answer([lp([p_refund, 1 - p_refund]), lp([p_crash, 1 - p_crash])]),
        },
    )


def test_a_branch_is_read_back_from_its_answer():
    for q, scores in ((TEAM, [np.log([0.3, 0.7])]), (TAGS, [np.log([0.9, 0.1]), np.log([0.2, 0.8])])):
        back = block_log_probs(q, q.answer(scores))
        assert len(back) == len(scores)
        for got, want in zip(back, scores):
            np.testing.assert_allclose(got - got.max(), want - want.max(), atol=1e-12)
    none = Question("p", "Which?", "choice", ("a", "b"), none="none of these")
    lps = np.log([0.3, 0.1, 0.6])
    (back,) = block_log_probs(none, none.answer([lps]))
    np.testing.assert_allclose(np.exp(back), [0.3, 0.1, 0.6], atol=1e-12)


def test_batch_divides_each_questions_own_prior_out_and_keeps_the_raw_answer():
    # The model says "billing" to everything, and "refund" to most: each question's bias is its own.
    preds = [
        _pred(i, p, r, c)
        for i, (p, r, c) in enumerate([(0.9, 0.8, 0.1), (0.7, 0.9, 0.3), (0.8, 0.6, 0.2), (0.6, 0.7, 0.4)])
    ]
    qc = QuestionCalibration("batch", [TEAM, TAGS])
    out = list(qc(iter(preds)))
    assert qc.fitted_here and qc.n == 4 and set(qc.priors) == {"team", "tags"} and len(qc.priors["tags"]) == 2
    assert [o.answers["team"]["raw_probs"] for o in out] == [p.answers["team"]["probs"] for p in preds]
    # after the prior is divided out, the least "billing" text of the four answers "technical"
    assert out[3].answers["team"]["label"] == "technical" and preds[3].answers["team"]["label"] == "billing"
    assert set(qc.record()) == {"team", "tags"}
    with pytest.raises(RuntimeError, match="one run"):
        list(qc(iter(preds)))


def test_min_confidence_abstains_per_question_and_fit_is_refused():
    qc = QuestionCalibration("none", [TEAM, TAGS], min_confidence=0.75)
    (close, sure) = list(qc(iter([_pred(0, 0.6, 0.5, 0.5), _pred(1, 0.9, 0.5, 0.5)])))
    assert close.answers["team"]["label"] is None and close.answers["team"]["abstained"] is True
    assert sure.answers["team"]["label"] == "billing" and "abstained" not in sure.answers["team"]
    assert "abstained" not in close.answers["tags"]  # a multi question's labels are its own threshold's
    with pytest.raises(CalibrationError, match="not supported yet"):
        QuestionCalibration("fit", [TEAM])
    with pytest.raises(CalibrationError, match="between 0 and 1"):
        QuestionCalibration("none", [TEAM], min_confidence=1.5)
