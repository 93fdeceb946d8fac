"""`train --finetune auto` (issue 42, item 2): the head and a fine-tune measured on the user's own
held-out texts, the winner trained again on every text and saved, both figures printed; the
choice rule itself; and the data it refuses (exit 2 naming the fix, nothing written)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from mlx_slm.classifier.task import Task
from mlx_slm.jobs.choose import HOLDOUT, Trial, Verdict, held_out_split, winner
from mlx_slm.text.workload import tickets
from tests.train_cli import run

ROWS = tickets(45)  # 15 tickets of each of billing, technical, account
TUNE = ["--adapt-layers", "2", "--epochs", "2", "--lr", "1e-3", "--head-lr", "1e-2", "--layers", "1,2"]


def _jsonl(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps({"text": t, "label": g}) + "\n" for t, g in rows))
    return path


# --------------------------------------------------------------------------- the rule
@pytest.mark.parametrize(
    "head, tuned, kept",
    [
        ((0.8, 0.7), (0.9, 0.6), "finetune"),
        ((0.9, 0.5), (0.8, 0.9), "head"),
        ((0.8, 0.7), (0.8, 0.75), "finetune"),
        ((0.8, 0.7), (0.8, 0.7), "head"),
    ],  # fmt: skip
    ids=["accuracy", "accuracy-first", "macro-f1-breaks-a-tie", "a-tie-goes-to-the-head"],
)
def test_the_winner_is_the_more_accurate_then_macro_f1_then_the_head(head, tuned, kept):
    assert winner([Trial("head", *head, 1.0), Trial("finetune", *tuned, 100.0)]) == kept


def test_the_held_out_share_is_stratified_and_seeded():
    gold = np.repeat(np.arange(3), [10, 5, 3])
    tr, te = held_out_split(gold, ["a", "b", "c"], seed=0)
    assert sorted(np.concatenate([tr, te]).tolist()) == list(range(len(gold)))  # every text, once
    assert np.bincount(gold[te]).tolist() == [round(10 * HOLDOUT), 1, 1]  # each label's share, at least one
    assert np.array_equal(te, held_out_split(gold, ["a", "b", "c"], seed=0)[1])
    assert not np.array_equal(te, held_out_split(gold, ["a", "b", "c"], seed=1)[1])


def test_the_table_names_both_and_marks_the_kept_one():
    c = Verdict((Trial("head", 0.5, 0.4, 2.0), Trial("finetune", 0.75, 0.7, 30.0)), "finetune", 9, 36)
    lines = c.table().splitlines()
    assert "held out 9 texts" in lines[0] and "36" in lines[0]
    assert lines[2].startswith("head") and "<- kept" not in lines[2]
    assert lines[3].startswith("finetune") and lines[3].endswith("<- kept") and "0.750" in lines[3]
    assert c.record()["kept"] == "finetune" and c.record()["head"]["accuracy"] == 0.5


# --------------------------------------------------------------------------- the command
@pytest.fixture(scope="module")
def auto(tmp_path_factory, tiny_qwen_mlx):
    d = tmp_path_factory.mktemp("auto")
    data = _jsonl(d / "train.jsonl", ROWS)
    task = d / "task.json"
    r = run(["train", data, "--finetune", "auto", "--model", tiny_qwen_mlx, "--save-task", task, *TUNE])
    assert r.exit_code == 0, r.output
    return d, data, task, r, str(tiny_qwen_mlx)


def test_auto_prints_both_methods_and_keeps_the_better_one(auto):
    d, data, task, r, model = auto
    rows = {line.split()[0]: line for line in r.stdout.splitlines() if line.split()[:1] in (["head"], ["finetune"])}
    assert set(rows) == {"head", "finetune"}, r.stdout
    acc = {k: float(v.split()[1]) for k, v in rows.items()}
    f1 = {k: float(v.split()[2]) for k, v in rows.items()}
    kept = next(k for k, v in rows.items() if v.endswith("<- kept"))
    assert kept == winner([Trial(k, acc[k], f1[k], 0.0) for k in ("head", "finetune")])
    assert "held out 9 texts (trained on the other 36)" in r.stdout  # a fifth of each label's 15
    saved = Task.load(task)
    assert saved.trained == ("fine-tuned adapters" if kept == "finetune" else "learned head")
    record = saved.head.info["compared"] if kept == "head" else _adapters(task).settings["compared"]
    assert record["kept"] == kept and record["held_out"] == 9 and record["head"]["accuracy"] == acc["head"]
    assert f"kept the {kept}" in r.stderr


def _adapters(task: Path):
    from mlx_slm.weights.adapters import FineTuned

    return FineTuned.load(task.parent / json.loads(task.read_text())["finetune"]["adapters"])


def test_the_kept_task_classifies_every_text(auto):
    d, data, task, r, model = auto
    out = d / "preds.jsonl"
    c = run(["classify", data, "--task", task, "-o", out, "-q"])
    assert c.exit_code == 0, c.output
    preds = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(preds) == len(ROWS) and all(p["label"] in {"billing", "technical", "account"} for p in preds)


def test_auto_refuses_too_few_examples_of_a_label_naming_the_fix(tmp_path, tiny_qwen_mlx):
    data = _jsonl(tmp_path / "train.jsonl", [*ROWS[:30], ("a rare one", "rare"), ("another rare one", "rare")])
    r = run(["train", data, "--finetune", "auto", "--model", tiny_qwen_mlx, "--save-task", tmp_path / "t.json"])
    assert r.exit_code == 2, r.output
    assert "'rare'" in r.output and "each label needs 3" in r.output and "--finetune lora" in r.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.jsonl"]  # nothing written


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--keep", "best"], "--keep best keeps the epoch with the lowest validation loss"),
        (["--patience", "3"], "--patience stops on the validation loss"),
    ],  # fmt: skip
)
def test_options_that_contradict_the_recipe_exit_2_naming_the_fix(tmp_path, tiny_qwen_mlx, extra, message):
    data = _jsonl(tmp_path / "train.jsonl", ROWS)
    for method in ("lora", "auto"):
        r = run(["train", data, "--finetune", method, "--model", tiny_qwen_mlx, "--save-task", tmp_path / "t.json",
                 *extra])  # fmt: skip
        assert r.exit_code == 2, r.output
        assert message in r.output and "--val-fraction" in r.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.jsonl"]
