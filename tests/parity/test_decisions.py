"""`parity --decisions`: ours against Transformers' own decision path (the reference child), on a
tiny random model; the report's figures from fixed inputs (fast) and a real run (slow)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from mlx_slm.parity.decisions import Sides, as_systemone, compare, format_decision_report
from mlx_slm.text.decisions.files import questions_of
from mlx_slm.text.decisions.settings import DecisionConfig

QUESTIONS = {
    "spam": {"type": "noul", "instructions": "Is it spam?", "criteria": {"false": "A real message"}},
    "team": {"type": "choice", "instructions": {"ask": "Which team?"},
             "criteria": {"billing": "Payments", "technical": None, "account": ["login", "profile"]}},
    "urgency": {"type": "score", "instructions": "How urgent?", "criteria": ["Can wait", {"when": "today"}, "Now"]},
    "many": {"type": "choice", "criteria": {f"o{i}": None for i in range(30)}},
}  # fmt: skip


def test_as_systemone_round_trips_and_names_what_it_cannot_ask():
    qs = questions_of(QUESTIONS, DecisionConfig())
    asked = {q.key: as_systemone(q) for q in qs}
    assert asked["spam"][0]["criteria"] == {"true": None, "false": "A real message"}
    assert asked["team"][0] == {
        "type": "choice",
        "instructions": {"ask": "Which team?"},
        "criteria": QUESTIONS["team"]["criteria"],
    }
    assert asked["urgency"][0]["criteria"] == ["Can wait", {"when": "today"}, "Now"]
    assert asked["many"][0] is None and "at most 26" in asked["many"][1]
    typed = questions_of(
        [{"type": "choice", "instructions": "?", "choices": [{"value": "true"}, {"value": True}]}], DecisionConfig()
    )
    assert as_systemone(typed[0])[0] is None


class _Res:
    def __init__(self, probs):
        self.probabilities = tuple(np.asarray(p) for p in probs)


def test_compare_reports_the_largest_difference_and_disagreements():
    qs = questions_of({k: QUESTIONS[k] for k in ("spam", "team")}, DecisionConfig())
    ours = [_Res([[0.6, 0.4], [0.5, 0.3, 0.2]]), _Res([[0.2, 0.8], [0.1, 0.2, 0.7]])]
    theirs = [
        {"spam": [0.6, 0.4], "team": [0.5, 0.3, 0.2]},
        {"spam": [0.2 + 3e-5, 0.8 - 3e-5], "team": [0.1, 0.7, 0.2]},
    ]
    r = compare(qs, qs, {}, ours, theirs, Sides("m", "ref", "float32", 0.1, 1.0))
    assert r["per_question"]["spam"]["max_abs_dprob"] == pytest.approx(3e-5)
    assert r["per_question"]["team"]["disagreements"] == [1] and not r["ok"]
    assert "DISAGREES" in format_decision_report(r) and "FAIL" in format_decision_report(r)
    theirs[1]["team"] = [0.1, 0.2, 0.7]
    r = compare(qs, qs, {"x": "why"}, ours, theirs, Sides("m", "ref", "float32", 0.1, 1.0))
    assert r["ok"] and r["max_abs_dprob"] == pytest.approx(3e-5)
    assert "x" in format_decision_report(r) and "not compared: why" in format_decision_report(r)


@pytest.mark.slow
def test_parity_against_transformers_decision_path(tmp_path):
    """A tiny qwen2 (Yes and No as tokens): every type, state shapes, descriptions as strings, objects,
    arrays and null, within 1e-4 in float32; the 30-option question left out and named; the CLI's exit 0."""
    from dataclasses import replace

    from mlx_slm.classifier.decision_plan import DecisionPlan
    from mlx_slm.cli import main
    from mlx_slm.engine import Engine
    from mlx_slm.parity.decisions import run_decision_parity
    from mlx_slm.text.decisions.methods import Method, Methods
    from mlx_slm.text.heads import Head
    from mlx_slm.weights.convert import convert
    from mlx_slm.weights.registry import ModelRef
    from tests.conftest import make_tiny

    hf = make_tiny(tmp_path / "hf", "qwen2", words=("Yes", "No"))
    mlx = convert(hf, tmp_path / "mlx", dtype="float32", progress=None)
    qs = questions_of(QUESTIONS, DecisionConfig())
    states = ["I was charged twice", {"subject": "login", "tries": 3}, ["a", {"b": None}], "Ünïcode ✓ <|im_end|>"]
    plan = DecisionPlan(ModelRef(str(mlx), "float32"), questions=qs, raw_questions=QUESTIONS)
    r = run_decision_parity(plan, states, reference=str(hf))
    assert r["ok"], r
    assert r["max_abs_dprob"] < 1e-4 and r["compared"] == ["spam", "team", "urgency"] and "many" in r["skipped"]
    # a trained question (a head on the hidden states where its answer is read) against the head on
    # Transformers' hidden_states at the end of its whole prompt
    team = next(x for x in qs if x.key == "team")
    rng = np.random.default_rng(0)
    n_layers = Engine.load(str(mlx)).model.args.num_hidden_layers
    dim = 2 * 64
    head = Head(
        team.answer_names(), (1, n_layers), np.zeros(dim), np.ones(dim), rng.normal(0, 0.3, (3, dim)), np.zeros(3)
    )
    trained = Methods.of([Method(head=head, key="team", digest=team.digest)])
    r = run_decision_parity(replace(plan, methods=trained), states, reference=str(hf))
    assert r["ok"] and r["per_question"]["team (trained)"]["max_abs_dprob"] < 1e-4, r
    q = tmp_path / "q.json"
    q.write_text(json.dumps({k: QUESTIONS[k] for k in ("spam", "team")}))
    res = CliRunner().invoke(main, ["parity", "--model", str(hf), "--decisions", str(q), "--n", "3", "--json"],
                             catch_exceptions=False)  # fmt: skip
    assert res.exit_code == 0, res.output
    got = json.loads(res.stdout)
    assert got["ok"] and got["states"] == 3 and got["max_abs_dprob"] < 1e-4
