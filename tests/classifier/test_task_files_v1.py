"""Task files written before the house moved (issue 41): the code in its new folders reads every
kind of them (labels with calibration, a learned head, questions, a sequence classifier, a fine-
tune with its adapters) as the same kind, and writes them back with the same fields and values.
The files in tests/data/tasks-v1 were saved by mlx-slm at commit 2505563 (before the move), on a
tiny random model; only their "created" time changes when saved again."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mlx_slm.classifier.task import Task

V1 = Path(__file__).parents[1] / "data" / "tasks-v1"
KINDS = {"labels-batch": ("labels", None), "head": ("head", "learned head"), "questions": ("questions", None),
         "seqcls": ("seqcls", None), "finetune": ("finetune", "fine-tuned adapters")}  # fmt: skip


@pytest.mark.parametrize("name", sorted(KINDS))
def test_an_older_task_file_loads_as_its_kind_and_saves_back_the_same(name, tmp_path):
    path = V1 / f"{name}.json"
    task = Task.load(path)
    kind, trained = KINDS[name]
    assert task.kind.name == kind and task.trained == trained
    task.save(tmp_path / path.name)
    before, after = json.loads(path.read_text()), json.loads((tmp_path / path.name).read_text())
    if name == "finetune":  # saved elsewhere, the task names its adapters where they are
        assert Path(after["finetune"].pop("adapters")) == (V1 / before["finetune"].pop("adapters")).resolve()
    assert {k: v for k, v in after.items() if k != "created"} == {k: v for k, v in before.items() if k != "created"}
    assert Task.load(tmp_path / path.name).kind.name == kind


def test_the_older_fine_tune_reads_its_adapters_checked_by_sha256():
    task = Task.load(V1 / "finetune.json")
    tuned = task.kind.tuned
    assert tuned.labels == tuple(task.labels) and tuned.lora.layers == (2,) and tuned.objective == "score"
