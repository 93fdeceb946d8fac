"""`train --none-threshold auto` (`jobs/out_of_scope.py`): a task's `min_confidence` chosen on held-out
labelled texts, the rule a value the job applies, bad held-out data refused before any training."""

from __future__ import annotations

from pathlib import Path

import pytest

from mlx_slm.classifier.task import Task
from mlx_slm.ground.errors import UsageError
from mlx_slm.jobs.out_of_scope import NoneRule
from mlx_slm.text.workload import tickets
from tests.train_cli import FT, run, train_file, write_rows


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return train_file(tmp_path_factory)


# --------------------------------------------------------------------------- options and messages


def test_none_data_with_a_bad_row_is_refused_before_the_training(tmp_path, data, tiny_qwen_mlx):
    held = write_rows(tmp_path / "held.jsonl", [{"text": t, "label": g} for t, g in tickets(30)[24:]] +
                  [{"text": "weather", "label": "oos"}, {"text": "no label here"}])  # fmt: skip
    task = tmp_path / "t.json"
    r = run(["train", data, "--model", tiny_qwen_mlx, "--save-task", task, *FT[:-1], "--none-label", "oos",
             "--none-threshold", "auto", "--none-data", held])  # fmt: skip
    assert r.exit_code == 2, r.output
    assert f"{held}: line 8: no gold label" in r.output
    assert "epoch" not in r.output and not task.exists()  # nothing trained first


LABELS = ("billing", "technical")


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
