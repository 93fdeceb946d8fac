"""`mlx-slm train`'s work (`jobs/train.py`): labelled texts in, a task with a learned head out; bad
training data named with the fix before any work."""

from __future__ import annotations

import csv
import json

import pytest

from mlx_slm.text.heads import (
    min_per_label,
)

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
