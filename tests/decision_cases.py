"""The decision questions several of `text/decisions`' test modules read (one copy: the System One
body with every criteria form a client may send), Transformers' own parser of them, and the
temperatures per type of the tiny Yes/No Decider (`yesno_decider` in tests/conftest.py)."""

from __future__ import annotations

TEMPERATURE = {"choice": 1.7, "score": 0.6}

QUESTIONS = {
    "urgent": {"type": "noul", "instructions": "Is it urgent?", "criteria": {"true": "Needs action today"}},
    "both": {"type": "noul", "instructions": {"ask": "spam?"}, "criteria": {"true": "ads", "false": ["real", 1]}},
    "none": {"type": "noul"},
    "team": {"type": "choice", "instructions": "Which team?",
             "criteria": {"billing": "Payments", "sales": None, "ops": {"k": "v"}, "x": ["a", "b"]}},
    "anger": {"type": "score", "instructions": ["How", "angry?"], "criteria": ["Calm", {"lvl": 1}, "Very angry"]},
}  # fmt: skip


def transformers_questions(body: dict, config=None):
    """Transformers' decision path parsing `body["questions"]` (its `DecisionConfig` by default)."""
    from transformers.decision import DecisionConfig as TC
    from transformers.decision import parse_questions

    return parse_questions(body["questions"], config or TC())
