"""What the decision commands' CLI tests share (`decide`, `eval --decisions`, `train --decisions`):
the three questions, a tiny model whose first tokens include Yes and No, the questions file as a
whole request body, and labelled tickets with one bad row. Import the fixtures by name: pytest
finds a fixture among a test module's globals."""

from __future__ import annotations

import json
import random

import pytest
from click.testing import CliRunner

from mlx_slm.cli import main
from mlx_slm.text.workload import tickets

QUESTIONS = {
    "urgent": {"type": "noul", "instructions": "Does it need an answer today?"},
    "team": {"type": "choice", "instructions": "Which team?", "criteria": {"billing": None, "technical": None}},
    "anger": {"type": "score", "criteria": ["Calm", "Annoyed", "Furious"]},
}


def run(args, input=None):
    return CliRunner().invoke(main, args, input=input, catch_exceptions=False)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from mlx_slm.weights.convert import convert
    from tests.conftest import make_tiny

    hf = make_tiny(tmp_path_factory.mktemp("hf-cli-decide"), "qwen2", words=("Yes", "No"))
    return str(convert(hf, tmp_path_factory.mktemp("mlx-cli-decide") / "m", dtype="float32", progress=None))


@pytest.fixture()
def q(tmp_path):
    p = tmp_path / "q.json"
    p.write_text(json.dumps({"model": "jev-latest", "state": "x", "questions": QUESTIONS}))  # a whole body
    return p


def gold(tmp_path, n=16):
    """`n` tickets with a drawn gold answer per question, and a last row whose answers are no option."""
    rng = random.Random(0)
    rows = [{"id": i, "text": t, "team": rng.choice(["billing", "technical"]), "urgent": rng.random() < 0.5,
             "anger": rng.randint(0, 2)} for i, (t, _) in enumerate(tickets(n))]  # fmt: skip
    rows.append({"id": 99, "text": "x", "team": "sales", "urgent": "maybe", "anger": 9})
    p = tmp_path / "gold.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return p
