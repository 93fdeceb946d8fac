"""`mlx-slm train`'s work (`jobs/train.py`): labelled texts in, a task with a learned head out; bad
training data named with the fix before any work; what every way of training reads, as values."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from mlx_slm.classifier.plan import Plan
from mlx_slm.jobs.train import HeadOptions, Trace, TrainingData, TrainRun, labelled_plan
from mlx_slm.text.heads import (
    min_per_label,
)
from mlx_slm.text.prompts import PromptError
from tests.hostile import invoke
from tests.train_cli import FT, ROWS, run

pytest.importorskip("sklearn")


# --------------------------------------------------------------------------- training data
def _write_csv(path, rows, header=("text", "category")):
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)
    return str(path)


def test_training_data_problems_name_the_fix(tmp_path):
    from mlx_slm.files.readers import ReadSpec
    from mlx_slm.jobs.train import TrainError, read_training_data

    good = [(f"text {i}", "ab"[i % 2]) for i in range(10)]
    d = read_training_data(_write_csv(tmp_path / "ok.csv", good), spec=ReadSpec(gold_field="category"))
    assert d.labels == ("a", "b") and list(d.gold[:4]) == [0, 1, 0, 1] and len(d.sha256) == 64
    with pytest.raises(TrainError, match=r"'b' has 4.*at least 5 examples per label"):
        read_training_data(_write_csv(tmp_path / "few.csv", good[:9]), spec=ReadSpec(gold_field="category"))
    with pytest.raises(TrainError, match=r"not in --labels: 'b' \(line 3\)"):
        read_training_data(str(tmp_path / "ok.csv"), ["a", "c"], spec=ReadSpec(gold_field="category"))
    with pytest.raises(TrainError, match=r"'c' has 0"):
        read_training_data(str(tmp_path / "ok.csv"), ["a", "b", "c"], spec=ReadSpec(gold_field="category"))
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(TrainError, match="is empty"):
        read_training_data(str(tmp_path / "empty.jsonl"))
    with pytest.raises(TrainError, match="line 2: no gold label in 'label'"):
        read_training_data(str(tmp_path / "ok.csv"))
    assert min_per_label(3) == 3 and min_per_label(1) == 2


def test_training_gold_labels_with_spaces_around_them(tmp_path):
    """A gold ' billing' beside 'billing' became a label of its own (a head with two billings,
    each with half the examples); it is now named with its line."""
    from mlx_slm.jobs.train import TrainError, read_training_data

    rows = [{"text": f"t{i}", "label": lab} for i, lab in enumerate(["billing", "account"] * 5)]
    rows.append({"text": "charged twice", "label": " billing"})
    p = tmp_path / "train.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    for labels in (None, ["billing", "account"]):
        with pytest.raises(TrainError, match="line 11: gold label ' billing' has spaces around it"):
            read_training_data(str(p), labels, folds=2)


@pytest.mark.parametrize("folds", [1, 0, True, 2.5])
def test_every_training_entry_refuses_too_few_folds_before_any_work(folds, tmp_path):
    """The folds are checked first, by each entry: no data read, no model loaded (neither exists here)."""
    from mlx_slm.classifier.plan import Plan
    from mlx_slm.jobs.train import HeadOptions, TrainError, TrainRun, run_train, run_train_fields
    from mlx_slm.weights.registry import ModelRef

    missing = str(tmp_path / "no-such.jsonl")
    plan = Plan(model=ModelRef("no-such-model"), save_task=str(tmp_path / "t.json"))
    run = TrainRun(missing, plan, head=HeadOptions(folds=folds))
    with pytest.raises(TrainError, match="at least 2 folds"):
        run_train(run)
    with pytest.raises(TrainError, match="at least 2 folds"):
        run_train_fields(run, ["a", "b"])


def test_train_on_four_rows_with_two_folds(tmp_path, tiny_qwen_mlx):
    data = tmp_path / "t.jsonl"
    rows = [
        ("refund please", "billing"),
        ("charged twice", "billing"),
        ("app crashes", "tech"),
        ("login error", "tech"),
    ]
    data.write_text("".join(json.dumps({"text": t, "label": lab}) + "\n" for t, lab in rows))
    r = invoke(["train", data, "--model", tiny_qwen_mlx, "--folds", "2", "--save-task", tmp_path / "task.json", "-q"])
    assert r.exit_code == 0 and (tmp_path / "task.json").exists(), (r.exit_code, r.output, r.exception)


# --------------------------------------------------------------------------- options and messages


@pytest.mark.parametrize("finetune", [False, True], ids=["head", "finetune"])
def test_a_lone_surrogate_in_a_training_label_exits_2_naming_the_row(tmp_path, tiny_qwen_mlx, finetune):
    bad = tmp_path / "bad.jsonl"
    bad.write_text("".join(json.dumps({"text": t, "label": g}) + "\n" for t, g in ROWS[:12])
                   + '{"text": "hi", "label": "bil\\ud800"}\n')  # fmt: skip
    extra = FT if finetune else ["--folds", "2", "-q"]
    r = run(["train", bad, "--model", tiny_qwen_mlx, "--save-task", tmp_path / "t.json", *extra])
    assert r.exit_code == 2, r.output
    assert f"{bad}: line 13: gold label" in r.output and "unpaired surrogate" in r.output


# What every way of training reads, as values (issue 48): `TrainRun` and `HeadOptions` read once.


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


def test_train_heads_options_are_read_once():
    options = {"layers": [1, 2], "folds": 3, "poolings": ["mean"], "source": "f.csv", "lines": [4, 5]}
    options |= {"batch_size": 2, "log": print}
    head, trace = HeadOptions.take(options), Trace.take(options)
    assert head == HeadOptions(layers=[1, 2], folds=3, poolings=("mean",))
    assert trace.where(1) == "f.csv: line 5" and trace.log is print
    assert options == {"batch_size": 2}  # what is left is the classifier's batching
    assert Trace().where(3) == "item 3"
