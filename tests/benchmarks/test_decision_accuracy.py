"""The decision accuracy benchmark (benchmarks/decision_accuracy.py): end to end on a tiny random
model and a few tickets, the JSON's shape and every method row checked (no accuracy or timing
thresholds: the model is random)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from benchmarks import decision_accuracy as bench

DECIDE = [
    *(f"{w}: {m}" for w in bench.WAYS for m in ("raw", "batch prior", "contextual prior")),
    "fitted",
    "fit-prior (letters)",
    "fit-prior (names)",
    "trained head",
    "fine-tuned (LoRA)",
]
CLASSIFY = ["classify: labels raw", "classify: labels + batch prior", "classify: learned head"]
FIGURES = ("accuracy", "macro_f1", "ece", "automation_5", "tokens_per_row", "seconds_per_row")


def test_automation_is_the_largest_confident_share_at_95_percent():
    gold = np.zeros(20, dtype=int)
    probs = np.tile([0.6, 0.4], (20, 1))
    probs[:, 0] = np.linspace(0.99, 0.51, 20)  # most confident first
    probs[:, 1] = 1 - probs[:, 0]
    gold[19] = 1  # the least confident is wrong: all 20 are 95 % right
    assert bench.scored(probs, gold)["automation_5"] == 1.0
    gold[18] = 1  # two wrong at the bottom: 18 of 19 is under 95 %, the top 18 are all right
    assert bench.scored(probs, gold)["automation_5"] == 0.9
    gold[0] = 1  # the most confident is wrong: no share is 95 % right
    assert bench.scored(probs, gold)["automation_5"] == 0.0


def test_the_untrained_goal_reads_no_learned_row():
    """A goal without labels is met by a way and a prior only: never by the fit, a head or LoRA."""
    rows = [{"method": m, "family": "decide", "available": True, "macro_f1": f, "accuracy": f}
            for m, f in (("names: batch prior", 0.5), ("fitted", 0.7), ("trained head", 0.8), ("fine-tuned (LoRA)", 0.9))]  # fmt: skip
    got = {g["goal"]: g for g in bench.goals({"posts": {"methods": rows}}) if g["set"] == "posts"}
    assert [(g["by"], g["best"]) for g in got.values()] == [("names: batch prior", 0.5), ("fine-tuned (LoRA)", 0.9)]


def test_per_set_sizes_read_over_the_defaults():
    got = bench._per_set("tickets=150,9", bench.N_TEST, "--n-test")
    assert got == dict.fromkeys(bench.SETS, 9)
    assert bench._per_set("banking77=154", bench.N_TEST, "--n-test")["banking77"] == 154
    with pytest.raises(SystemExit):
        bench._per_set("nope=3", bench.N_TEST, "--n-test")


@pytest.mark.slow
def test_decision_accuracy_end_to_end(tiny_arch, tmp_path, monkeypatch):
    monkeypatch.setenv("MLX_SLM_HOME", str(tmp_path / "home"))
    out, cache = tmp_path / "res", tmp_path / "cache"
    argv = ["--model", str(tiny_arch.mlx("qwen2")), "--sets", "tickets", "--n-train", "tickets=4"]
    argv += ["--n-test", "tickets=9", "--folds", "2", "--out", str(out), "--tag", "t", "--cache", str(cache)]
    assert bench.main(argv) == 0
    res = json.loads((out / "t.json").read_text())
    assert res["command"].startswith("python -m benchmarks.decision_accuracy --model")
    s = res["sets"]["tickets"]
    assert (s["train"], s["test"], s["test_support"]) == (12, 9, [3, 3, 3])
    assert [r["method"] for r in s["methods"]] == DECIDE + CLASSIFY
    for r in s["methods"]:
        if r["available"]:
            assert all(isinstance(r[k], (int, float)) for k in FIGURES), r
            assert 0 <= r["accuracy"] <= 1 and sum(r["predicted"]) == 9
        else:
            raise AssertionError(r)
    # every way ran once over each split, and the fitted way is one of them
    own = [
        "head features/train",
        "head/test",
        "classify labels/test",
        "classify head features/train",
        "classify head/test",
    ]
    tuned = ["lora/test"]
    assert sorted(s["passes"]) == sorted([f"{w}/{sp}" for w in bench.WAYS for sp in ("train", "test")] + own + tuned)
    assert s["tuned"]["trained"] == "fine-tuned" and s["tuned"]["n"] == 12
    assert all(not p["cached"] and p["seconds"] >= 0 for p in s["passes"].values())
    assert s["fit"]["chosen"]["style"] in ("letters", "names")
    assert [g["status"] for g in res["goals"] if g["set"] != "tickets"] == ["not run"] * 3
    md = (out / "t.md").read_text()
    assert "python -m benchmarks.decision_accuracy" in md
    assert (out / "t.png").stat().st_size > 1000
    # a second run reads every pass back from the cache, and scores the same
    assert bench.main([*argv[:-2], "--tag", "t2", "--cache", str(cache), "--no-tune", "tickets"]) == 0
    again = json.loads((out / "t2.json").read_text())["sets"]["tickets"]
    assert all(again["passes"][f"{w}/{sp}"]["cached"] for w in bench.WAYS for sp in ("train", "test"))
    assert [r.get("accuracy") for r in again["methods"][:12]] == [r.get("accuracy") for r in s["methods"][:12]]
    # --no-fit: no pass over TRAIN but the head's; fitted and fit-prior said not run (--no-tune: LoRA too)
    assert (
        bench.main([*argv[:-4], "--tag", "t3", "--ways", "letters", "--no-fit", "tickets", "--no-tune", "tickets"]) == 0
    )
    third = json.loads((out / "t3.json").read_text())["sets"]["tickets"]
    assert sorted(third["passes"]) == sorted(["letters/test", *own])
    skipped = [r for r in third["methods"] if not r["available"]]
    assert [r["method"] for r in skipped] == [*bench.NO_FIT, "fine-tuned (LoRA)"]
    assert "| fitted | n/a" in (out / "t3.md").read_text()
    # --tuned-only: the fine-tuned row and classify's only (no pass of the decision prompt); --merge
    # keeps the sets TAG.json has (here t's tickets are replaced, its goals read again)
    first = json.loads((out / "t.json").read_text())
    first["sets"] = {"posts": {**s, "test": 5}, **first["sets"]}  # a set another run wrote
    (out / "t.json").write_text(json.dumps(first))
    argv4 = [*argv[:-4], "--tag", "t", "--tuned-only", "tickets", "--merge", "--n-test", "tickets=6"]
    assert bench.main(argv4) == 0
    fourth = json.loads((out / "t.json").read_text())
    assert list(fourth["sets"]) == ["tickets", "posts"] and fourth["sets"]["posts"] == {**s, "test": 5}
    t4 = fourth["sets"]["tickets"]
    assert sorted(t4["passes"]) == sorted([*own[2:], *tuned]) and t4["test"] == 6
    ran = [r["method"] for r in t4["methods"] if r["available"]]
    assert ran == ["fine-tuned (LoRA)", *CLASSIFY]
    assert [r["method"] for r in t4["methods"]] == DECIDE + CLASSIFY
    assert "--tuned-only tickets" in t4["run"] and fourth["command"] == t4["run"].split("`")[1]
    by_goal = {g["goal"]: g for g in fourth["goals"] if g["set"] == "tickets"}
    assert [g["status"] for g in by_goal.values()][0] == "not run"  # the prior goal: no prior row ran
    md4 = (out / "t.md").read_text()
    assert "| trained head | n/a" in md4 and md4.count("Run: `python -m benchmarks.decision_accuracy") == 2
    assert "Sets from several runs" in md4
    # --render writes the markdown again from the JSON, with the notes given (kept in the JSON)
    assert bench.main(["--render", "--out", str(out), "--tag", "t", "--note", "a note"]) == 0
    assert "- a note" in (out / "t.md").read_text() and json.loads((out / "t.json").read_text())["notes"] == ["a note"]
