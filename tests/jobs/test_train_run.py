"""What every way of training reads, as values (issue 48): `TrainRun` (DATA, the plan, the labels,
`HeadOptions`, a `NoneRule`), the labels filled into the system message once, by the plan; "none of
these" a value the job applies itself (no callback into the CLI); `train_head`'s keyword arguments
read once into `HeadOptions`, a `Trace` and the classifier's batching."""

from __future__ import annotations

import numpy as np
import pytest

from mlx_slm.classifier.plan import Plan
from mlx_slm.classifier.task import Task
from mlx_slm.ground.errors import UsageError
from mlx_slm.jobs.out_of_scope import NoneRule
from mlx_slm.jobs.train import HeadOptions, Trace, TrainingData, TrainRun, labelled_plan
from mlx_slm.text.prompts import PromptError

LABELS = ("billing", "technical")


def _data() -> TrainingData:
    return TrainingData("d.jsonl", ["a", "b"], np.array([0, 1]), LABELS, [1, 2], "0" * 64)


def test_the_run_fills_the_labels_once_as_typed():
    plan = Plan(system="Route to {labels}. {{not a placeholder}}", template="Ticket {{1}}: {text}")
    run = TrainRun("d.jsonl", plan, descriptions={"billing": "money"})
    filled = run.prompt(_data())
    assert filled.system == "Route to billing, technical. {not a placeholder}"
    assert filled.template == "Ticket {1}: {text}" and filled.labels_filled
    assert run.plan.system == plan.system  # the run's plan is not changed: a new one is returned
    head = labelled_plan(filled, LABELS, features_only=True)
    assert head.labels == LABELS and head.system == filled.system and head.labels_filled
    with pytest.raises(PromptError, match="label_description"):
        TrainRun("d.jsonl", Plan(system="{label_description}")).prompt(_data())


def _task() -> Task:
    return Task(model="m", labels=LABELS + ("oos",), system=None, template="T: {text}")


def test_none_rule_is_a_value_the_job_applies():
    task = _task()
    assert NoneRule().apply(task, engine=None) is task  # nothing asked: the task as it was
    learned = NoneRule(label="oos").apply(task, engine=None)
    assert learned.none == {"label": "oos", "min_confidence": None} and learned.min_confidence is None
    fixed = NoneRule(threshold=0.4).apply(task, engine=None)
    assert fixed.none == {"label": None, "min_confidence": None} and fixed.min_confidence == 0.4
    with pytest.raises(UsageError, match=r"--none-label 'zzz': no row of DATA is labelled 'zzz'"):
        NoneRule(label="zzz").apply(task, engine=None)


def test_train_heads_options_are_read_once():
    options = {"layers": [1, 2], "folds": 3, "poolings": ["mean"], "source": "f.csv", "lines": [4, 5]}
    options |= {"batch_size": 2, "log": print}
    head, trace = HeadOptions.take(options), Trace.take(options)
    assert head == HeadOptions(layers=[1, 2], folds=3, poolings=("mean",))
    assert trace.where(1) == "f.csv: line 5" and trace.log is print
    assert options == {"batch_size": 2}  # what is left is the classifier's batching
    assert Trace().where(3) == "item 3"


def test_no_job_knows_click():
    """The jobs raise `UserError`s the CLI prints; none imports click or takes a front end's callback."""
    import ast
    from pathlib import Path

    import mlx_slm.jobs

    for path in Path(mlx_slm.jobs.__file__).parent.glob("*.py"):
        tree = ast.parse(path.read_text())
        names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        names |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert not {m for m in names if m.split(".")[0] == "click"}, path.name
