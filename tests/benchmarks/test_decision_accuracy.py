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
    *(f"fit-prior ({w})" for w, (_, n) in bench.WAYS.items() if n == 1),
    "trained head",
    "trained head (question prompt)",
    "fine-tuned (LoRA)",
]
CLASSIFY = [
    "classify: labels raw",
    "classify: labels + batch prior",
    "classify: learned head",
    "classify: fine-tuned (LoRA)",
]
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


def _rows(gold, **answers):
    """Rows of methods with these answers (option indices), scored against gold."""
    k = 1 + max(max(gold), *(max(a) for a in answers.values()))
    eye = np.eye(k)
    return [bench.row(m, "classify" if m.startswith("classify") else "decide", eye[a], np.asarray(gold))
            for m, a in answers.items()]  # fmt: skip


def test_a_goal_is_read_against_classify_of_the_same_tier_on_the_same_rows():
    rng = np.random.default_rng(3)
    gold = rng.integers(0, 3, 200).tolist()
    right = list(gold)
    some = [g if rng.random() < 0.8 else (g + 1) % 3 for g in gold]  # 80 % right
    near = [a if i != 7 or a != g else (g + 1) % 3 for i, (a, g) in enumerate(zip(some, gold))]  # one answer worse
    rows = _rows(gold, **{"trained head": near, "fine-tuned (LoRA)": some, "classify: learned head": right,
                          "classify: fine-tuned (LoRA)": near, "names: batch prior": near,
                          "classify: labels + batch prior": some})  # fmt: skip
    s = {"methods": rows, "gold": gold, "labels": ["a", "b", "c"]}
    got = {g["goal"]: g for g in bench.goals({"posts": s}) if g["set"] == "posts"}
    untrained, trained = got.values()
    # trained: the best decision (LoRA, 80 %) against classify's best of its tier (the head, 100 %): far below
    assert (trained["by"], trained["classify_by"]) == ("fine-tuned (LoRA)", "classify: learned head")
    assert trained["gap"] < 0 and trained["interval"][1] < 0 and trained["verdict"] == "below classify"
    # untrained: one row worse than classify's batch prior, on 200 rows: within noise, the interval says so
    assert untrained["classify_by"] == "classify: labels + batch prior" and untrained["gap"] < 0
    assert untrained["interval"][0] < 0 <= untrained["interval"][1]
    assert untrained["verdict"] == "below classify, within noise"
    # the same answers: no gap at all; rows without their answers (an older file): the gap without an interval
    same = {"methods": _rows(gold, **{"trained head": some, "classify: learned head": some}), "gold": gold,
            "labels": ["a", "b", "c"]}  # fmt: skip
    (g,) = [g for g in bench.goals({"posts": same}) if g["set"] == "posts" and g["status"] != "not run"]
    assert (g["gap"], g["interval"], g["verdict"]) == (0.0, [0.0, 0.0], "at least classify")
    assert g["classify_not_run"] == ["fine-tuned (LoRA)"]  # classify's fine-tune was not in that run: said
    assert bench._versus(g).endswith("at least classify (fine-tuned (LoRA): not run on these rows)")
    assert trained["classify_not_run"] == []
    old = {"methods": [{k: v for k, v in r.items() if k != "answers"} for r in rows], "labels": ["a", "b", "c"]}
    (g,) = [g for g in bench.goals({"posts": old}) if g["goal"] == trained["goal"] and g["set"] == "posts"]
    assert g["interval"] is None and g["verdict"] == "below classify (no interval)"
    cells = bench._versus(trained).split(" | ")
    assert cells[0] == "1.000 (learned head)" and cells[2] == "below classify"
    assert cells[1] == f"{trained['gap']:+.3f} ({trained['interval'][0]:+.3f} to {trained['interval'][1]:+.3f})"


class _Passes:
    """Fixed passes over TRAIN and TEST per way (what `Passes.get` returns), no model."""

    def __init__(self, probs):
        self.probs = probs

    def get(self, ds, q, way, split):
        p = np.asarray(self.probs[way][split], dtype=np.float64)
        return {"probs": p, "tokens": np.full(len(p), 10.0 if way[0] == "letters" else 20.0), "seconds": 1.0}


@pytest.mark.parametrize("informative", [True, False])
def test_the_fitted_row_answers_as_the_saved_task_would(informative):
    """A fit whose cross-validated choice does not beat the raw answers is not kept (`eval --fit
    --save-task` leaves the question raw): the row answers raw and says so; a kept fit answers fitted."""
    from mlx_slm.text.decisions.settings import DecisionConfig
    from mlx_slm.text.decisions.systemone import systemone_questions

    rng = np.random.default_rng(0)
    k, n = 3, 60
    (q,) = systemone_questions(
        {"team": {"type": "choice", "instructions": "Which?", "criteria": dict.fromkeys("abc")}}, DecisionConfig()
    )
    gold_tr, gold_te = np.arange(n) % k, np.arange(n)[::-1] % k

    def probs(gold, strength, bias=(3.0, 0.0, 0.0)):  # a constant bias, and (informative) the gold option lifted
        logits = rng.normal(0, 0.3, (len(gold), k)) + np.array(bias)
        logits[np.arange(len(gold)), gold] += strength
        e = np.exp(logits)
        return e / e.sum(axis=1, keepdims=True)

    strength = 2.5 if informative else 0.0
    letters = {"train": probs(gold_tr, strength), "test": probs(gold_te, strength)}
    noise = {"train": probs(gold_tr, 0.0, (0, 3, 0)), "test": probs(gold_te, 0.0, (0, 3, 0))}  # another bias
    ds = bench.DataSet(
        "t", {}, tuple("abc"), "", "{text}", [("x", g) for g in gold_tr], [("y", g) for g in gold_te], ""
    )
    rows, report = bench.learned_rows(
        ds, q, _Passes({("letters", 1): letters, ("names", 1): noise}), [("letters", 1), ("names", 1)]
    )
    fitted = rows[0]
    assert fitted["method"] == "fitted" and fitted["kept"] == report["kept"] == informative
    assert fitted["cv_accuracy_of_choice"] == report["cv_accuracy_of_choice"]
    raw = letters["test"].argmax(axis=1).tolist()
    if informative:  # the bias toward option 0 divided out: more right than raw
        assert fitted["accuracy"] > np.mean(np.array(raw) == gold_te) and fitted["way"] == report["chosen"]["style"]
    else:  # answered as the letters, one order, raw (not the way the fit chose), and at the letters' cost
        assert fitted["answers"] == raw and fitted["way"] == "letters" and fitted["tokens_per_row"] == 10.0


def test_per_set_sizes_read_over_the_defaults():
    got = bench._per_set("tickets=150,9", bench.N_TEST, "--n-test")
    assert got == dict.fromkeys(bench.SETS, 9)
    assert bench._per_set("banking77=154", bench.N_TEST, "--n-test")["banking77"] == 154
    with pytest.raises(SystemExit):
        bench._per_set("nope=3", bench.N_TEST, "--n-test")


def test_the_letters_are_needed_only_where_a_set_trains_the_letters_head():
    # an untrained-only (or tuned-only) run may leave out the letters' costly pass; a set that trains may not
    a = bench.parse(["--sets", "clinc150", "--untrained-only", "clinc150", "--ways", "prompt,prompt2"])
    assert a.ways == ["prompt", "prompt2"]
    assert bench.parse(["--sets", "banking77", "--tuned-only", "banking77", "--ways", "prompt"]).ways == ["prompt"]
    with pytest.raises(SystemExit, match="with letters unless"):
        bench.parse(["--sets", "clinc150,posts", "--untrained-only", "clinc150", "--ways", "prompt"])


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
            assert np.bincount(r["answers"], minlength=3).tolist() == r["predicted"]  # each row's, in TEST order
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
    tuned = ["question head/test", "lora/test", "classify lora/test"]
    assert sorted(s["passes"]) == sorted([f"{w}/{sp}" for w in bench.WAYS for sp in ("train", "test")] + own + tuned)
    assert s["tuned"]["trained"] == "fine-tuned" and s["tuned"]["n"] == 12
    own_head = s["head"]["question_prompt"]  # classify's head on the question's own prompt: its parts said
    assert own_head["trained"] == "learned head" and own_head["head"] and own_head["n"] == 12
    assert np.bincount(s["gold"], minlength=3).tolist() == s["test_support"]
    verdicts = ("at least classify", "below classify, within noise", "below classify")
    for g in [g for g in res["goals"] if g["set"] == "tickets"]:  # each against classify's same tier, with its interval
        assert g["verdict"] in verdicts and g["interval"][0] <= g["interval"][1], g
    assert all(not p["cached"] and p["seconds"] >= 0 for p in s["passes"].values())
    assert s["fit"]["chosen"]["style"] in ("letters", "names")
    assert {g["set"] for g in res["goals"]} == {"tickets"}  # the goals of the sets this file holds
    md = (out / "t.md").read_text()
    assert "python -m benchmarks.decision_accuracy" in md
    assert (out / "t.png").stat().st_size > 1000
    # a second run reads every pass back from the cache, and both fine-tunes' answers, and scores the same
    assert bench.main([*argv[:-2], "--tag", "t2", "--cache", str(cache)]) == 0
    again = json.loads((out / "t2.json").read_text())["sets"]["tickets"]
    assert all(again["passes"][f"{w}/{sp}"]["cached"] for w in bench.WAYS for sp in ("train", "test"))
    assert all(again["passes"][t]["cached"] for t in tuned)
    assert [r.get("accuracy") for r in again["methods"][:12]] == [r.get("accuracy") for r in s["methods"][:12]]
    tuned_rows = ("trained head (question prompt)", "fine-tuned (LoRA)", "classify: fine-tuned (LoRA)")
    pick = lambda rows: [(r["answers"], r["train_s"]) for r in rows if r["method"] in tuned_rows]  # noqa: E731
    assert pick(again["methods"]) == pick(s["methods"])
    # --no-fit: no pass over TRAIN but the heads'; fitted and fit-prior said not run (--no-tune: LoRA too)
    assert (
        bench.main([*argv[:-4], "--tag", "t3", "--ways", "letters", "--no-fit", "tickets", "--no-tune", "tickets"]) == 0
    )
    third = json.loads((out / "t3.json").read_text())["sets"]["tickets"]
    assert sorted(third["passes"]) == sorted(["letters/test", *own, "question head/test"])
    skipped = [r for r in third["methods"] if not r["available"]]
    assert [r["method"] for r in skipped] == [*bench.NO_FIT, "fine-tuned (LoRA)", "classify: fine-tuned (LoRA)"]
    assert "| fitted | n/a" in (out / "t3.md").read_text()
    # --tuned-only: the question's own classifiers (head, fine-tune) and classify's only (no pass of the decision prompt); --merge
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
    assert ran == ["trained head (question prompt)", "fine-tuned (LoRA)", *CLASSIFY]
    assert [r["method"] for r in t4["methods"]] == DECIDE + CLASSIFY
    assert "--tuned-only tickets" in t4["run"] and fourth["command"] == t4["run"].split("`")[1]
    by_goal = {g["goal"]: g for g in fourth["goals"] if g["set"] == "tickets"}
    assert [g["status"] for g in by_goal.values()][0] == "not run"  # the prior goal: no prior row ran
    md4 = (out / "t.md").read_text()
    assert "| trained head | n/a" in md4 and md4.count("Run: `python -m benchmarks.decision_accuracy") == 2
    assert "Sets from several runs" in md4
    # --untrained-only: each way over TEST (read back from the cache) and classify's label scoring; nothing from TRAIN
    argv5 = [*argv[:-4], "--tag", "t5", "--ways", "letters", "--untrained-only", "tickets", "--cache", str(cache)]
    assert bench.main(argv5) == 0
    t5 = json.loads((out / "t5.json").read_text())["sets"]["tickets"]
    assert sorted(t5["passes"]) == ["classify labels/test", "letters/test"] and t5["passes"]["letters/test"]["cached"]
    ran = [r["method"] for r in t5["methods"] if r["available"]]
    assert ran == [f"letters: {m}" for m in ("raw", "batch prior", "contextual prior")] + CLASSIFY[:2]
    assert [r.get("accuracy") for r in t5["methods"][:3]] == [r.get("accuracy") for r in s["methods"][:3]]
    assert all("--untrained-only" in r["note"] for r in t5["methods"] if not r["available"])
    with pytest.raises(SystemExit, match="choose one"):
        bench.parse(["--tuned-only", "posts", "--untrained-only", "posts"])
    # --render writes the markdown again from the JSON, with the notes given (kept in the JSON)
    assert bench.main(["--render", "--out", str(out), "--tag", "t", "--note", "a note"]) == 0
    assert "- a note" in (out / "t.md").read_text() and json.loads((out / "t.json").read_text())["notes"] == ["a note"]
