"""benchmarks/finetune.py: its data splits, the folds' means, reusing a row, and a run end to end
on a tiny model (the head and objective (a) on two ticket folds)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from benchmarks import finetune as bench
from benchmarks.accuracy import TICKET_LABELS


def test_ticket_folds_train_on_other_folds_per_label_and_cover_every_ticket_once():
    labels, splits = bench.load_tickets(5, 10, seed=0)
    assert labels == list(TICKET_LABELS) and len(splits) == 5
    from benchmarks.accuracy import DATA, _jsonl

    tested = sorted(t for _, _, xte, _ in splits for t in xte)
    assert tested == sorted(r["text"] for r in _jsonl(DATA / "support_tickets.jsonl"))
    for xtr, ytr, xte, _ in splits:
        assert np.bincount(ytr, minlength=6).tolist() == [10] * 6
        assert not set(xtr) & set(xte)
    again = bench.load_tickets(5, 10, seed=0)[1]
    assert [s[0] for s in again] == [s[0] for s in splits]
    assert [s[0] for s in bench.load_tickets(5, 10, seed=1)[1]] != [s[0] for s in splits]


def test_the_folds_mean_keeps_each_fold():
    runs = [
        {"n": 10, "accuracy": 0.5, "macro_f1": 0.4, "train_seconds": 10.0, "seconds_per_epoch": 2.0,
         "peak_memory_mb": 100.0, "test_items_per_s": 3.0, "best_epoch": 2, "epochs_run": 3, "stopped": "finished"},
        {"n": 12, "accuracy": 1.0, "macro_f1": 0.8, "train_seconds": 20.0, "seconds_per_epoch": None,
         "peak_memory_mb": 300.0, "test_items_per_s": 5.0, "best_epoch": 1, "epochs_run": 1, "stopped": "max_minutes"},
    ]  # fmt: skip
    m = bench.mean_of(runs)
    assert (m["n"], m["accuracy"], m["macro_f1"], m["train_seconds"]) == (22, 0.75, 0.6, 15.0)
    assert m["seconds_per_epoch"] == 2.0 and m["peak_memory_mb"] == 300.0
    assert m["best_epoch"] == "2/1" and m["stopped"] == "finished/max_minutes" and len(m["splits"]) == 2
    assert bench.mean_of(runs[:1]) is runs[0]


@pytest.mark.slow
def test_a_tickets_run_end_to_end_and_a_row_reused_only_on_the_same_data(tmp_path):
    from tests.conftest import make_tiny

    model = make_tiny(tmp_path / "hf", "qwen2", words=TICKET_LABELS)
    out = tmp_path / "results"
    common = ["--model", str(model), "--dataset", "tickets", "--per-intent", "5", "--fold-limit", "2", "--out",
              str(out), "--layers", "2", "--epochs", "2", "--val-fraction", "0", "--speed-n", "0"]  # fmt: skip
    assert bench.main([*common, "--methods", "head,score", "--tag", "t1"]) == 0
    r = json.loads((out / "t1.json").read_text())
    assert r["data"]["splits"] == 2 and set(r["methods"]) == {"head", "score"}
    for m in r["methods"].values():
        assert 0 <= m["accuracy"] <= 1 and len(m["splits"]) == 2 and m["n"] == r["data"]["test"]
    assert "the 355 labelled tickets" in (out / "t1.md").read_text() and (out / "t1.png").exists()
    trials = json.loads((out / "finetune-trials.json").read_text())
    assert [t["method"] for t in trials] == ["head", "score"]

    assert bench.main([*common, "--methods", "score", "--reuse", "t1:score", "--tag", "t2"]) == 0
    r2 = json.loads((out / "t2.json").read_text())
    assert r2["methods"]["score"]["accuracy"] == r["methods"]["score"]["accuracy"]
    assert r2["methods"]["score"]["from"] == "t1"
    assert len(json.loads((out / "finetune-trials.json").read_text())) == 2  # a reused row is not listed again
    for bad, says in (("t1score", "TAG:METHOD"), ("nope:score", "no earlier run")):
        with pytest.raises(SystemExit, match=says):
            bench.main([*common, "--methods", "score", "--reuse", bad])
    with pytest.raises(SystemExit, match="same data"):
        bench.main([*common, "--per-intent", "6", "--methods", "score", "--reuse", "t1:score"])


def test_clinc_none_of_these_figures_follow_the_products_rule():
    """The benchmark's CLINC150 out-of-scope figures: a threshold chosen on val + oos_val (the
    product's `choose_threshold`), scored on test + oos_test; out-of-scope texts the methods are
    unsure of are caught, sure in-scope ones kept."""
    from benchmarks.finetune import oos_figures

    def lp(rows):
        return np.log(np.array(rows, dtype=np.float64))

    sure, unsure = [0.9, 0.05, 0.05], [0.4, 0.3, 0.3]
    lps = {"val": lp([sure, [0.05, 0.9, 0.05]]), "oos_val": lp([unsure, unsure]),
           "test": lp([sure, [0.05, 0.05, 0.9], [0.2, 0.5, 0.3]]), "oos_test": lp([unsure, sure])}  # fmt: skip
    out = oos_figures(lps, np.array([0, 1]), np.array([0, 2, 0]), ["a", "b", "c"], 0.02)
    assert 0.4 < out["threshold"] <= 0.9  # above the unsure out-of-scope texts, not above the sure in-scope ones
    assert out["in_scope"] == 3 and out["out_of_scope"] == 2
    assert out["oos_recall"] == 0.5 and out["oos_precision"] == 0.5  # the unsure oos caught; the wrong in-scope one too
    assert out["in_scope_accuracy"] == round(2 / 3, 4) and out["without"]["oos_recall"] == 0.0


def test_clinc_out_of_scope_learned_as_a_class_answers_none_when_it_wins():
    """--oos-train: the out-of-scope class is the last label; a text whose likeliest label it is
    is answered none even under no threshold."""
    from benchmarks.finetune import oos_figures

    lp = lambda rows: np.log(np.array(rows, dtype=np.float64))  # noqa: E731
    lps = {"val": lp([[0.8, 0.1, 0.1]]), "oos_val": lp([[0.1, 0.1, 0.8]]),
           "test": lp([[0.8, 0.1, 0.1], [0.1, 0.8, 0.1]]), "oos_test": lp([[0.2, 0.1, 0.7], [0.5, 0.2, 0.3]])}  # fmt: skip
    out = oos_figures(lps, np.array([0]), np.array([0, 1]), ["a", "b", "oos"], 0.02)
    assert out["without"]["oos_recall"] == 0.5 and out["in_scope_accuracy"] == 1.0
