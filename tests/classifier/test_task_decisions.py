"""A task's `decisions` section (eval --decisions --fit --save-task): saved, read back, checked, and
the per-question temperatures a Decider takes (`decision_temperatures`), pinned to the weights."""

from __future__ import annotations

import json

import pytest

from mlx_slm.classifier.task import Task, decision_temperatures
from mlx_slm.kinds.base import TaskError

SHA = "ab" * 32
QUESTIONS = {"spam": {"type": "noul", "instructions": "Is it spam?"},
             "team": {"type": "choice", "criteria": {"billing": None, "sales": "Buying"}}}  # fmt: skip


def _task(**kw):
    sec = {"questions": QUESTIONS, "temperatures": {"spam": 1.7, "team": 0.8}, "fit": {"spam": {"n": 40}}}
    return Task(model="tiny", labels=(), system=None, template="{text}", weights_sha256=SHA, decisions=sec, **kw)


def test_saved_and_read_back(tmp_path):
    p = tmp_path / "t.json"
    _task().save(p)
    d = json.loads(p.read_text())
    assert d["decisions"]["temperatures"] == {"spam": 1.7, "team": 0.8}
    assert d["decisions"]["questions"] == QUESTIONS and d["weights_sha256"] == SHA
    t = Task.load(p)
    assert t.decisions_only and t.pins_weights and t.trained is None
    assert decision_temperatures(t, SHA) == {"spam": 1.7, "team": 0.8}
    assert decision_temperatures(t) == {"spam": 1.7, "team": 0.8}


def test_no_section_no_temperatures(tmp_path):
    t = Task(model="tiny", labels=("a", "b"), system=None, template="{text}")
    assert decision_temperatures(t) is None and decision_temperatures(None) is None
    assert "decisions" not in t.to_dict()


def test_other_weights_refused():
    with pytest.raises(TaskError, match="decision temperatures were fitted on weights sha256 abab"):
        decision_temperatures(_task(), "cd" * 32)


@pytest.mark.parametrize(
    "section, match",
    [
        ({"questions": {}, "temperatures": {}}, "not empty"),
        ({"questions": QUESTIONS, "temperatures": {"spam": 0}}, "positive number"),
        ({"questions": QUESTIONS, "temperatures": {"spam": True}}, "positive number"),
        ({"questions": QUESTIONS, "temperatures": {"spam": float("inf")}}, "positive number"),
        ({"questions": QUESTIONS, "temperatures": [1.0]}, "decisions"),
        ({"questions": QUESTIONS, "extra": 1}, "decisions"),
        ("spam", "decisions"),
    ],
)
def test_bad_sections_named(section, match):
    d = _task().to_dict()
    d["decisions"] = section
    with pytest.raises(TaskError, match=match):
        Task.from_dict(d, "task file t.json")
