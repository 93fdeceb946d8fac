"""`eval GOLD --decisions Q.json` (`jobs/evaluate_decisions.py`) through the CLI on a tiny random model: how
right and how calibrated each question is, `--fit --save-task` temperatures that reach `decide --task`,
a decide output scored without the model, and what it cannot use refused."""

from __future__ import annotations

import json

import numpy as np
import pytest

from mlx_slm.text.workload import tickets
from tests.decision_cli import QUESTIONS, run
from tests.decision_cli import gold as _gold


def test_eval_decisions_fit_save_task_then_decide_task(tiny, q, tmp_path):
    gold = _gold(tmp_path)
    args = ["eval", str(gold), "--decisions", str(q), "--gold-field", "team", "--gold-field", "urgent",
            "--gold-field", "anger", "--model", tiny]  # fmt: skip
    r = run([*args, "--json", str(tmp_path / "e.json"), "--plots", str(tmp_path / "plots")])
    assert r.exit_code == 0, r.output
    for part in ("== team (choice, gold field 'team')", "Brier", "ECE", "(binary)", "1 row(s) left out"):
        assert part in r.output
    figs = json.loads((tmp_path / "e.json").read_text())["questions"]
    assert set(figs) == {"team", "urgent", "anger"} and figs["urgent"]["n"] == 16
    # a score's table keys its levels by position: their names said beside them
    assert "(levels by position: 0 = 'Calm', 1 = 'Annoyed', 2 = 'Furious')" in r.output
    assert figs["anger"]["level_names"] == ["Calm", "Annoyed", "Furious"] and "level_names" not in figs["team"]
    pytest.importorskip("matplotlib")
    assert (tmp_path / "plots" / "02-team" / "reliability.png").stat().st_size > 1000
    assert "mlx-slm: wrote " in r.output
    r = run([*args, "--plots", str(tmp_path / "quiet"), "-q"])  # -q: the figures only, no notes on stderr
    assert r.exit_code == 0 and "== team" in r.output and "mlx-slm: wrote" not in r.output, r.output
    assert (tmp_path / "quiet" / "02-team" / "reliability.png").is_file()
    r = run([*args, "--fit", "--save-task", str(tmp_path / "t.json")])
    assert r.exit_code == 0, r.output
    assert "fit: chose" in r.output and "cross-validated accuracy" in r.output
    for way in ("letters", "names", "prompt"):  # every style is a way --fit compares
        assert f"fit {way}, 1 order(s)" in r.output and f"fit {way}, 2 order(s)" in r.output, r.output
    t = json.loads((tmp_path / "t.json").read_text())
    kept = {m["key"] for m in t["decisions"]["methods"]}  # a fit no better than the raw answers is not kept
    assert kept <= {"team", "urgent", "anger"} and t["weights_sha256"]
    assert r.output.count("fit: none kept") == 3 - len(kept)
    assert t["decisions"]["questions"] == QUESTIONS
    r = run(["decide", "--task", str(tmp_path / "t.json"), "-q"], input='{"id": 1, "state": "refund please"}\n')
    assert r.exit_code == 0, r.output
    assert set(json.loads(r.stdout)["answers"]) == set(QUESTIONS)
    # serve --task's load path: the task is a classify task too (default labels), and its methods come back
    from mlx_slm.jobs import plan as plans
    from mlx_slm.jobs.plan import DecisionOptions, TaskOptions

    plan = plans.resolve(
        TaskOptions(task_file=str(tmp_path / "t.json"), given=frozenset({"task_file"})),
        lambda m: None,
        decisions_ok=True,
    )
    clf = plans.load(plan)
    opts = DecisionOptions(plan.model.name, task_file=str(tmp_path / "t.json"), given=frozenset({"model"}))
    served = plans.resolve_decisions(opts, need_questions=False, batch_ok=False).loaded(clf.engine)
    assert {m.key for m in served.methods.saved.values()} == kept


def test_eval_decisions_refuses_what_it_cannot_use(tiny, q, tmp_path):
    gold = _gold(tmp_path, 4)
    base = ["eval", str(gold), "--decisions", str(q), "--model", tiny]
    r = run(base)
    assert r.exit_code == 2 and "--gold-field" in r.output
    r = run([*base, "--gold-field", "nope=team"])
    assert r.exit_code == 2 and "not a question key" in r.output
    r = run([*base, "--gold-field", "team", "--labels", "a,b"])
    assert r.exit_code == 2 and "--labels" in r.output
    r = run([*base, "--gold-field", "team", "--save-task", str(tmp_path / "t.json")])
    assert r.exit_code == 2 and "--fit" in r.output
    r = run([*base, "--gold-field", "team", "--gold-field", "urgent=nosuch"])  # refused before the model runs
    assert r.exit_code == 2 and "no row of" in r.output and "'nosuch'" in r.output and "== team" not in r.output


def test_eval_decisions_scores_a_decide_output_without_the_model(tiny, q, tmp_path):
    """eval --decisions --predictions OUT: a decide output (either shape, JSONL or CSV) read back gives
    the figures of the run that made it; another input's output is refused."""
    gold = _gold(tmp_path, 8)
    args = ["--decisions", str(q), "--gold-field", "team", "--gold-field", "urgent", "--gold-field", "anger"]
    live = run(["eval", str(gold), *args, "--model", tiny, "--json", str(tmp_path / "live.json")])
    assert live.exit_code == 0, live.output
    want = json.loads((tmp_path / "live.json").read_text())["questions"]
    for shape, out in (("systemone", "o.jsonl"), ("openai", "o.csv")):
        r = run(["decide", str(gold), "--questions", str(q), "--model", tiny, "-q", "--shape", shape,
                 "-o", str(tmp_path / out), "--on-error", "skip"])  # fmt: skip
        assert r.exit_code == 0, r.output
        r = run(["eval", str(gold), *args, "--predictions", str(tmp_path / out), "--json", str(tmp_path / "p.json")])
        assert r.exit_code == 0, r.output
        got = json.loads((tmp_path / "p.json").read_text())["questions"]
        for key in want:
            assert got[key]["accuracy"] == want[key]["accuracy"]
            assert got[key]["brier"] == pytest.approx(want[key]["brier"], abs=1e-6)  # other batches: float sums
    other = tmp_path / "other.jsonl"
    other.write_text(gold.read_text().replace('"x"', '"y"'))
    r = run(["eval", str(other), *args, "--predictions", str(tmp_path / "o.jsonl")])
    assert r.exit_code == 2 and "not the output for this input" in r.output
    # the same keys, another question (a description added): its answers are not scored as this one's
    changed = json.loads(q.read_text())
    changed["questions"]["team"]["criteria"]["billing"] = "payments"
    q2 = tmp_path / "q2.json"
    q2.write_text(json.dumps(changed))
    r = run(["eval", str(gold), *args[:1], str(q2), *args[2:], "--predictions", str(tmp_path / "o.jsonl")])
    assert r.exit_code == 2 and "question 'team' is not the one its answers were made for" in r.output, r.output


def test_eval_fit_prior_learns_a_prior_from_states_alone(tiny, q, tmp_path):
    gold = _gold(tmp_path, 12)
    task = tmp_path / "prior.json"
    r = run(["eval", str(gold), "--decisions", str(q), "--model", tiny, "--fit-prior", "--save-task", str(task)])
    assert r.exit_code == 0, r.output
    methods = json.loads(task.read_text())["decisions"]["methods"]
    assert {m["key"] for m in methods} == set(QUESTIONS)
    assert all(m["calibrator"]["method"] == "batch" for m in methods)
    r = run(["decide", "--task", str(task), "-q"], input='{"id": 1, "state": "refund please"}\n')
    assert r.exit_code == 0 and json.loads(r.stdout)["answers"]["team"]["x_method"]["calibration"] == "batch"
    # a question scored on its gold still gets its prior (from its states, as the others), unless --fit fits it
    scored = tmp_path / "scored.json"
    r = run(["eval", str(gold), "--decisions", str(q), "--model", tiny, "--gold-field", "team", "--fit-prior",
             "--save-task", str(scored)])  # fmt: skip
    assert r.exit_code == 0, r.output
    assert {m["key"] for m in json.loads(scored.read_text())["decisions"]["methods"]} == set(QUESTIONS)
    two = tmp_path / "two.jsonl"  # a prior from fewer states than options: refused, the task kept
    two.write_text("".join(gold.read_text().splitlines(keepends=True)[:2]))
    before = scored.read_bytes()
    r = run(["eval", str(two), "--decisions", str(q), "--model", tiny, "--gold-field", "team", "--fit-prior",
             "--save-task", str(scored)])  # fmt: skip
    assert r.exit_code == 2 and "needs at least 3 states, got 2" in r.output and scored.read_bytes() == before


@pytest.mark.parametrize(("style", "permute"), [("prompt", "2"), ("names", "1")])
def test_a_fitted_prior_is_saved_with_the_way_its_answers_were_asked(tiny, q, tmp_path, style, permute):
    """--fit-prior --style S --permute N: the prior is the mean of answers asked so, and the task says so:
    `decide --task` divides it out of answers asked that way (those of --style S --permute N), never the
    letters'. Checked against the same prior divided out by hand."""
    gold = _gold(tmp_path, 12)
    states = "".join(json.dumps({"id": i, "state": json.loads(x)["text"]}) + "\n"
                     for i, x in enumerate(gold.read_text().splitlines()))  # fmt: skip
    task = tmp_path / "prior.json"
    way = ["--style", style, "--permute", permute]
    r = run(["eval", str(gold), "--decisions", str(q), "--model", tiny, "--fit-prior", *way, "--save-task", str(task)])
    assert r.exit_code == 0, r.output
    methods = {m["key"]: m for m in json.loads(task.read_text())["decisions"]["methods"]}
    assert {(m["style"], m["permute"]) for m in methods.values()} == {(style, int(permute))}, methods
    r = run(["decide", "--task", str(task), "-q"], input=states)
    assert r.exit_code == 0, r.output
    got = [json.loads(x)["answers"]["team"] for x in r.stdout.splitlines()]
    assert got[0]["x_method"]["style"] == style and got[0]["x_method"]["calibration"] == "batch"
    r = run(["decide", "--questions", str(q), "--model", tiny, *way, "-q"], input=states)
    raw = np.array([[a["answers"]["team"]["probabilities"][o] for o in ("billing", "technical")]
                    for a in map(json.loads, r.stdout.splitlines())])  # fmt: skip
    assert np.allclose([[a["x_raw_probabilities"][o] for o in ("billing", "technical")] for a in got], raw, atol=1e-6)
    want = raw / raw.mean(axis=0)
    want /= want.sum(axis=1, keepdims=True)
    assert np.allclose([[a["probabilities"][o] for o in ("billing", "technical")] for a in got], want, atol=1e-5)


def test_eval_scores_a_string_and_a_boolean_of_one_text_apart(tiny, tmp_path):
    """An OpenAI choice of "true" and true: eval --decisions takes it (issue 53: "labels must be
    distinct") and a gold value names the right one."""
    q = tmp_path / "typed.json"
    q.write_text(json.dumps([{"type": "choice", "name": "t", "instructions": "?",
                              "choices": [{"value": "true"}, {"value": True}, {"value": "no"}]}]))  # fmt: skip
    gold = tmp_path / "g.jsonl"
    gold.write_text(
        "".join(
            json.dumps({"id": i, "text": t, "t": [True, "true", "no"][i % 3]}) + "\n"
            for i, (t, _) in enumerate(tickets(6))
        )
    )
    r = run(["eval", str(gold), "--decisions", str(q), "--gold-field", "t", "--model", tiny])
    assert r.exit_code == 0, r.output
    assert "n 6" in r.output


def test_eval_predictions_of_other_questions_names_the_question_and_option(tiny, q, tmp_path):
    """A decide output of other questions scored with --predictions: the question and the option it
    lacks are named, with the fix (issue 53: `KeyError: 'sales'`)."""
    gold = _gold(tmp_path, 6)
    out = tmp_path / "answers.jsonl"
    assert (
        run(
            ["decide", str(gold), "--questions", str(q), "--model", tiny, "-o", str(out), "-q", "--on-error", "skip"]
        ).exit_code
        == 0
    )
    other = tmp_path / "other.json"
    other.write_text(
        json.dumps({**QUESTIONS, "team": {**QUESTIONS["team"], "criteria": {"billing": None, "sales": None}}})
    )
    r = run(["eval", str(gold), "--decisions", str(other), "--gold-field", "team", "--predictions", str(out)])
    assert r.exit_code == 2 and "question 'team' is not the one its answers were made for" in r.output, r.output
    lines = out.read_text().splitlines()
    first = json.loads(lines[0])
    first["answers"]["team"]["probabilities"]["billing"] = float("nan")  # an output edited by hand
    (tmp_path / "nan.jsonl").write_text("\n".join([json.dumps(first), *lines[1:]]) + "\n")
    r = run(
        ["eval", str(gold), "--decisions", str(q), "--gold-field", "team", "--predictions", str(tmp_path / "nan.jsonl")]
    )
    assert r.exit_code == 2 and "row 1: question 'team': its probabilities [nan," in r.output, r.output
    for m in tmp_path.glob("answers.jsonl.*.json"):  # no manifest: the answers themselves are checked
        m.unlink()
    r = run(["eval", str(gold), "--decisions", str(other), "--gold-field", "team", "--predictions", str(out)])
    assert r.exit_code == 2, r.output
    assert "question 'team' has no answer for 'sales'" in r.output and "KeyError" not in r.output


def test_a_fit_refused_for_missing_options_names_the_rows_left_out(tiny, q, tmp_path):
    """A gold value that is no option leaves its row out; when the fit is then refused (an option
    without a labelled row), the message says which rows were left out and why, not only the count."""
    rows = [("I was charged twice", "billing"), ("app crashes", "sales"), ("refund please", "billing")]
    gold = tmp_path / "gold.jsonl"
    gold.write_text("".join(json.dumps({"id": i, "state": s, "team": t}) + "\n" for i, (s, t) in enumerate(rows)))
    r = run(["eval", str(gold), "--decisions", str(q), "--gold-field", "team", "--model", tiny, "--fit"])
    assert r.exit_code == 2, r.output
    assert "no row's gold answer is 'technical'" in r.output
    assert """1 row(s) left out: line 2: field 'team' is "sales", not an option of 'team'""" in r.output


def test_rows_left_out_are_listed_in_line_order_and_counted_past_the_five_shown(tiny, q, tmp_path):
    """Left-out rows: said in the input's order, their values as JSON writes them (true, null, NaN),
    the five shown followed by how many more, and the --json report listing them."""
    states = [s for s, _ in tickets(12)]
    bad = [True, None, "sales", ["x"], "nope", 1.5, "later", "sales"]  # None: no gold (left out too)
    rows = [{"id": i, "state": states[i], "team": b} for i, b in enumerate(bad)]
    rows += [{"id": 8 + i, "state": states[8 + i], "team": t} for i, t in enumerate(["billing", "technical"] * 2)]
    gold = tmp_path / "gold.jsonl"
    gold.write_text("".join(json.dumps(r) + "\n" for r in rows))
    rep = tmp_path / "r.json"
    r = run(["eval", str(gold), "--decisions", str(q), "--gold-field", "team", "--model", tiny, "--json", str(rep)])
    assert r.exit_code == 0, r.output
    said = r.output.split("8 row(s) left out: ")[1].splitlines()[0]
    lines = [int(x.split(":")[0].removeprefix("line ")) for x in said.split("; ")[:5]]
    assert lines == [1, 2, 3, 4, 5] and "field 'team' is true," in said and 'is ["x"]' in said, said
    assert said.endswith("; and 3 more (the --json report lists up to 100)"), said
    team = json.loads(rep.read_text())["questions"]["team"]
    assert team["left_out"] == 8 and len(team["left_out_examples"]) == 8


def test_a_none_answer_made_by_the_threshold_is_as_sure_as_no_other_option_is():
    """eval's confidence of an answer: its option's probability; for "none of these" chosen by the
    threshold (not the likeliest), 1 - the likeliest other option's, as classify's eval reads it."""
    from mlx_slm.jobs.evaluate_decisions import _confidence
    from mlx_slm.text.decisions.settings import DecisionConfig
    from mlx_slm.text.decisions.systemone import systemone_questions

    crit = {"a": None, "b": None, "none": None}
    (qn,) = systemone_questions({"t": {"type": "choice", "instructions": "?", "criteria": crit}}, DecisionConfig())
    p = np.array([0.55, 0.3, 0.15])
    rule = {"option": "none", "min_confidence": 0.6}
    assert _confidence(qn, p, None, 0) == 0.55
    assert _confidence(qn, p, {"none_of_these": {**rule, "answered_none": False}}, 0) == 0.55
    assert _confidence(qn, p, {"none_of_these": {**rule, "answered_none": True}}, 2) == pytest.approx(0.45)
    p = np.array([0.4, 0.1, 0.5])  # none the likeliest: its own probability
    assert _confidence(qn, p, {"none_of_these": {**rule, "answered_none": False}}, 2) == 0.5


def test_eval_and_train_read_a_csv_of_states_as_decide_does(tiny, q, tmp_path):
    """A CSV whose header names a `state` column: decide, eval --decisions and train --decisions
    read it alike (no --text-column needed); a column named on the command line is the one read."""
    import csv

    rows = [{"id": i, "state": t, "team": ["billing", "technical"][i % 2]} for i, (t, _) in enumerate(tickets(12))]
    data = tmp_path / "gold.csv"
    with data.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["id", "state", "team"])
        w.writeheader()
        w.writerows(rows)
    r = run(["eval", str(data), "--decisions", str(q), "--gold-field", "team", "--model", tiny])
    assert r.exit_code == 0, r.output
    assert "n 12" in r.output
    r = run(["train", str(data), "--decisions", str(q), "--gold-field", "team", "--model", tiny,
             "--save-task", str(tmp_path / "t.json"), "--folds", "2", "-q"])  # fmt: skip
    assert r.exit_code == 0, r.output
    r = run(["eval", str(data), "--decisions", str(q), "--gold-field", "team", "--model", tiny, "--text-column", "x"])
    assert r.exit_code == 2 and "'x'" in r.output, r.output


def test_a_save_task_that_would_fit_nothing_is_refused_and_writes_nothing(tiny, q, tmp_path):
    """One labelled row per option: no fit can be cross-validated, so none is kept, and a task that
    changes no answer is not written (an existing file at --save-task stays as it was)."""
    rows = [{"text": t, "team": team} for t, team in (("refund please", "billing"), ("app crashes", "technical"))]
    gold = tmp_path / "g.jsonl"
    gold.write_text("".join(json.dumps(r) + "\n" for r in rows))
    keep = tmp_path / "t.json"
    keep.write_text("before\n")
    r = run(["eval", str(gold), "--decisions", str(q), "--gold-field", "team", "--model", tiny, "--fit",
             "--save-task", str(keep)])  # fmt: skip
    assert r.exit_code == 2, r.output
    assert "could not be cross-validated" in r.output and "fit: none kept" in r.output
    assert "no question was fitted" in r.output and "nothing was saved" in r.output and "Usage:" not in r.output
    assert keep.read_text() == "before\n"


def test_options_apart_only_in_spaces_are_scored_raw_and_a_prior_is_refused_naming_the_question(tiny, tmp_path):
    """Options 'billing' and ' billing': the letters answer them, so eval scores them raw (saying why no
    prior is shown); a prior over them (kept by option name) is refused when decide starts, naming the
    question, not as every row's error."""
    q = tmp_path / "q.json"
    q.write_text(json.dumps({"team": {"type": "choice", "instructions": "Which team?",
                                      "criteria": {"billing": None, " billing": None}}}))  # fmt: skip
    gold = tmp_path / "g.jsonl"
    gold.write_text('{"state": "refund me", "team": "billing"}\n{"state": "a bug", "team": " billing"}\n')
    r = run(["eval", str(gold), "--decisions", str(q), "--gold-field", "team", "--model", tiny])
    assert r.exit_code == 0 and "(no prior: options that differ only in surrounding spaces" in r.output, r.output
    for how in ("batch", "contextual"):
        r = run(["decide", str(gold), "--questions", str(q), "--calibrate", how, "--model", tiny, "-q"])
        assert r.exit_code == 2 and f"--calibrate {how}: question 'team''s options" in r.output, r.output


def test_a_question_no_row_scores_is_named_after_the_others_figures(tiny, q, tmp_path):
    """Every gold value of one question no option: the others' figures are shown and written (--json),
    then exit 2 naming that question; no task is saved from such a run."""
    rows = [json.loads(x) for x in _gold(tmp_path, 8).read_text().splitlines()][:-1]
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({**r, "anger": "Livid"}) + "\n" for r in rows))
    out, task = tmp_path / "e.json", tmp_path / "t.json"
    r = run(["eval", str(data), "--decisions", str(q), "--gold-field", "team", "--gold-field", "anger",
             "--model", tiny, "--json", str(out), "--fit-prior", "--save-task", str(task)])  # fmt: skip
    assert r.exit_code == 2, r.output
    assert "== team (choice, gold field 'team')" in r.stdout and "accuracy" in r.stdout
    assert "question 'anger': no row has both an answer and a gold option in field 'anger'" in r.output
    assert "field 'anger' is \"Livid\", not an option" in r.output and "no task saved to" in r.output
    figs = json.loads(out.read_text())["questions"]
    assert figs["team"]["n"] == 8 and "question 'anger'" in figs["anger"]["error"] and not task.exists()


@pytest.mark.parametrize("style", ["letters", "prompt"])
def test_a_question_over_the_context_leaves_out_only_its_own_rows(tiny, q, tmp_path, style):
    """A question too long for the model beside a scored one: the scored one is scored on every row
    (the long one refused alone, in either style), not each row an error blamed on it."""
    rows = [json.loads(x) for x in _gold(tmp_path, 8).read_text().splitlines()][:-1]
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    qs = tmp_path / "long.json"
    qs.write_text(json.dumps({"team": QUESTIONS["team"], "p": {"type": "noul", "instructions": "refund " * 1100}}))
    r = run(["eval", str(data), "--decisions", str(qs), "--gold-field", "team", "--model", tiny, "--style", style])
    assert r.exit_code == 0, r.output
    assert "n 8" in r.output and "row(s) left out" not in r.output, r.output
    r = run(["eval", str(data), "--decisions", str(qs), "--gold-field", "p=urgent", "--model", tiny, "--style", style])
    assert r.exit_code == 2 and "question 'p' was refused (over the model's context)" in r.output, r.output


def test_fit_compares_no_names_way_where_the_names_style_does_not_apply(tiny, tmp_path):
    """A noul is asked as the letters ask it in the names style: --fit compares letters and prompt only."""
    rows = [json.loads(x) for x in _gold(tmp_path, 12).read_text().splitlines()][:-1]
    data, qs = tmp_path / "data.jsonl", tmp_path / "noul.json"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    qs.write_text(json.dumps({"urgent": QUESTIONS["urgent"]}))
    r = run(["eval", str(data), "--decisions", str(qs), "--gold-field", "urgent", "--model", tiny, "--fit"])
    assert r.exit_code == 0, r.output
    assert "fit letters, 1 order(s)" in r.output and "fit prompt, 1 order(s)" in r.output
    assert "fit names" not in r.output, r.output


def test_a_question_fitted_again_under_its_task_is_asked_each_way_not_the_tasks(tiny, q, tmp_path):
    """eval --task T --fit: a question T fitted (here a names x2 prior) is asked afresh in each way
    compared, so its figures are the run's own raw answers (not T's) and its new fit is saved under the
    way it was learned on; T's methods of the questions not fitted again are kept as T has them."""
    gold = _gold(tmp_path, 12)
    t1, t2, e = tmp_path / "t1.json", tmp_path / "t2.json", tmp_path / "e.json"
    r = run(["eval", str(gold), "--decisions", str(q), "--model", tiny, "--fit-prior", "--style", "names",
             "--permute", "2", "--save-task", str(t1)])  # fmt: skip
    assert r.exit_code == 0, r.output
    r = run(["eval", str(gold), "--task", str(t1), "--gold-field", "team", "--fit", "--json", str(e),
             "--save-task", str(t2)])  # fmt: skip
    assert r.exit_code == 0, r.output
    team = json.loads(e.read_text())["questions"]["team"]
    assert team["applied"] == {"style": "letters", "permute": 1, "calibration": "none"}, team["applied"]
    before = {m["key"]: m for m in json.loads(t1.read_text())["decisions"]["methods"]}
    after = {m["key"]: m for m in json.loads(t2.read_text())["decisions"]["methods"]}
    assert after["urgent"] == before["urgent"] and after["anger"] == before["anger"]
    if "team" in after:  # kept only where it beat the raw answers
        assert after["team"]["calibrator"]["method"] == "fit"
        chosen = team["fit"]["chosen"]
        assert (after["team"]["style"], after["team"]["permute"]) == (chosen["style"], chosen["permute"])


def test_a_decision_task_is_scored_by_its_own_questions(tiny, q, tmp_path):
    """eval GOLD --task T (a decision task) --gold-field K scores T's questions as --decisions would:
    the task holds them (no labels task to classify with)."""
    gold = _gold(tmp_path, 12)
    task = tmp_path / "prior.json"
    r = run(["eval", str(gold), "--decisions", str(q), "--model", tiny, "--fit-prior", "--save-task", str(task)])
    assert r.exit_code == 0, r.output
    r = run(["eval", str(gold), "--task", str(task), "--gold-field", "team", "-q"])
    assert r.exit_code == 0, r.output
    assert "== team (choice, gold field 'team')" in r.output and "batch calibration (fitted)" in r.output


def test_a_tasks_fitted_questions_need_no_batch_prior(tiny, q, tmp_path):
    """decide --task T --calibrate batch: the run's prior is for the questions T does not answer its
    own way; T's fitted ones are never refused for a prior they do not use (2 states, 3 levels)."""
    gold = _gold(tmp_path, 12)
    task, anger = tmp_path / "prior.json", tmp_path / "anger.json"
    anger.write_text(json.dumps({"anger": QUESTIONS["anger"]}))
    r = run(["eval", str(gold), "--decisions", str(anger), "--model", tiny, "--fit-prior", "--save-task", str(task)])
    assert r.exit_code == 0, r.output
    two = '{"id": 1, "state": "refund please"}\n{"id": 2, "state": "the app crashes"}\n'
    r = run(["decide", "--task", str(task), "--questions", str(q), "--calibrate", "batch", "-q"], input=two)
    assert r.exit_code == 0, r.output
    got = [json.loads(x)["answers"] for x in r.stdout.splitlines()]
    assert all(a["anger"]["x_method"]["calibration"] == "batch" and a["anger"]["x_method"]["fitted"] for a in got)
    assert all(a["team"]["x_method"]["calibration"] == "batch" and "fitted" not in a["team"]["x_method"] for a in got)
    r = run(["decide", "--questions", str(q), "--model", tiny, "--calibrate", "batch", "-q"], input=two)
    assert r.exit_code == 2 and "question 'anger': a prior over 3 options needs at least 3 states" in r.output


def test_a_way_that_refuses_rows_the_runs_way_answers_is_left_out_of_the_fit():
    """--fit compares ways on the rows the run's own way answers: a way that refused one of them (a
    longer prompt over the context) or failed on it is left out and said, never a traceback."""
    from types import SimpleNamespace

    from mlx_slm.jobs.evaluate_decisions import DecisionEvalSettings, _question, _Scored
    from mlx_slm.text.decisions.settings import DecisionConfig
    from mlx_slm.text.decisions.systemone import systemone_questions

    (qn,) = systemone_questions({"team": QUESTIONS["team"]}, DecisionConfig())
    rng = np.random.default_rng(0)
    n = 12
    gold = ["billing", "technical"] * (n // 2)
    rows = [SimpleNamespace(line=i + 1, error=None, gold={"team": g}, text=f"s{i}") for i, g in enumerate(gold)]

    def result(p):
        return SimpleNamespace(probabilities=(p,), raw=(p,), applied=(None,))

    ways = [(st, k) for k in (1, 2) for st in ("letters", "names", "prompt")]
    runs = {w: [result(rng.dirichlet([1, 1])) for _ in rows] for w in ways}
    runs[("names", 1)][3] = SimpleNamespace(probabilities=(None,), raw=(None,), applied=(None,))  # refused
    runs[("prompt", 2)][5] = "line 6: the answers are not finite"  # failed in that way only
    s = DecisionEvalSettings(input="g.jsonl", questions_file=None, gold_fields=("team",), fit=True)
    rep = _question(qn, 0, "team", _Scored(s, rows, rows, runs, ("letters", 1), None))
    assert rep["n"] == n
    assert "left out (some of the rows refused or failed): names x1, prompt x2" in rep["fit"]["note"]
    assert {(w["style"], w["permute"]) for w in rep["fit"]["ways"]} == set(ways) - {("names", 1), ("prompt", 2)}


def test_a_prior_from_no_answered_state_is_refused_naming_the_question():
    from types import SimpleNamespace

    from mlx_slm.jobs.evaluate_decisions import _prior_method
    from mlx_slm.text.decisions.fitting import FitError
    from mlx_slm.text.decisions.methods import Method
    from mlx_slm.text.decisions.settings import DecisionConfig
    from mlx_slm.text.decisions.systemone import systemone_questions

    (qn,) = systemone_questions({"team": QUESTIONS["team"]}, DecisionConfig())
    refused = [SimpleNamespace(probabilities=(None,), raw=(None,)) for _ in range(4)] + ["line 5: an error"]
    with pytest.raises(
        FitError, match=r"--fit-prior: question 'team': a prior over 2 options needs at least 2 states, got 0"
    ):
        _prior_method(qn, 0, refused, 512, Method())


def test_a_tasks_method_for_a_question_under_two_ids_is_kept_once(tmp_path):
    """One question asked under two ids has one method: a new task keeps it once, and reads back."""
    from mlx_slm.classifier.decision_plan import DecisionPlan
    from mlx_slm.jobs.evaluate_decisions import _kept_methods
    from mlx_slm.text.calibration import Calibrator
    from mlx_slm.text.decisions.methods import Method, Methods
    from mlx_slm.text.decisions.settings import DecisionConfig
    from mlx_slm.text.decisions.systemone import systemone_questions
    from mlx_slm.weights.registry import ModelRef

    team = QUESTIONS["team"]
    qs = systemone_questions({"team_a": team, "team_b": team, "urgent": QUESTIONS["urgent"]}, DecisionConfig())
    m = Method(
        calibrator=Calibrator("fit", qs[0].answer_names(), (0.0, 0.1), 1.5, 10), key="team_a", digest=qs[0].digest
    )
    plan = DecisionPlan(ModelRef("x"), questions=qs, methods=Methods.of([m]))
    kept = _kept_methods(plan, str(tmp_path / "n.json"))
    assert [k.key for k in kept] == ["team_a"]
    assert Methods.from_record([k.to_dict() for k in kept], {}, qs, "t").for_question(qs[1])[0] == m


def test_an_openai_shape_output_read_by_position_names_its_question(tmp_path):
    """eval --predictions of an OpenAI-shape decide output (answers by position) with the same questions
    in another order: refused naming the answer's question, never one question scored as another."""
    from types import SimpleNamespace

    from mlx_slm.files.output.manifest import write_manifest
    from mlx_slm.ground.errors import UserError
    from mlx_slm.jobs.decide import answers
    from mlx_slm.jobs.evaluate_decisions import read_decisions
    from mlx_slm.text.decisions.settings import DecisionConfig
    from mlx_slm.text.decisions.systemone import systemone_questions

    mood = {"type": "choice", "instructions": "Which mood?", "criteria": {"calm": None, "angry": None}}
    asked = {"team": QUESTIONS["team"], "mood": mood}
    qs = systemone_questions(asked, DecisionConfig())
    out, inp = tmp_path / "o.jsonl", tmp_path / "in.jsonl"
    inp.write_text(json.dumps({"id": 1, "state": "x"}) + "\n")
    rec = {"id": 1, "answers": answers(qs, [np.array([0.9, 0.1]), np.array([0.2, 0.8])], "openai", True)}
    out.write_text(json.dumps(rec) + "\n")
    write_manifest(str(out), {"form": "decisions", "decision_questions": asked}, complete=True, rows=1)
    rows = [SimpleNamespace(id=1, line=1)]
    (w,) = read_decisions(str(out), rows, qs, str(inp))
    assert [p.tolist() for p in w.probabilities] == [[0.9, 0.1], [0.2, 0.8]]
    other = systemone_questions({"mood": mood, "team": QUESTIONS["team"]}, DecisionConfig())
    with pytest.raises(UserError, match=r"row 1: answer 1 is question 'team''s, not 'mood''s"):
        read_decisions(str(out), rows, other, str(inp))
