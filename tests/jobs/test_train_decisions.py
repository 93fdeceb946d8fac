"""`train DATA --decisions Q.json --gold-field KEY=FIELD` (`jobs/train_decisions.py`) through the CLI on a
tiny random model: a learned head (or a fine-tune) per labelled question, saved in a task that `decide
--task` and `eval --decisions --task` answer with."""

from __future__ import annotations

import json

import pytest

from tests.decision_cli import QUESTIONS, run
from tests.decision_cli import gold as _gold


def test_train_decisions_then_decide_and_eval_with_the_task(tiny, q, tmp_path):
    """train --decisions: a head for the labelled question, saved in a task that decide --task
    answers that question with (x_method says "trained"), the others raw; eval --task scores it."""
    gold = _gold(tmp_path, 24)
    rows = [json.loads(x) for x in gold.read_text().splitlines()][:-1]  # the bad last row left out
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    task = tmp_path / "head.json"
    r = run(["train", str(data), "--decisions", str(q), "--gold-field", "team", "--model", tiny,
             "--save-task", str(task), "--folds", "2", "-q"])  # fmt: skip
    assert r.exit_code == 0, r.output
    assert "== team" in r.stdout and "chosen:" in r.stdout
    t = json.loads(task.read_text())
    (m,) = t["decisions"]["methods"]
    assert m["key"] == "team" and "head" in m and t["weights_sha256"]
    r = run(["decide", "--task", str(task), "-q"], input='{"id": 1, "state": "I was charged twice"}\n')
    assert r.exit_code == 0, r.output
    a = json.loads(r.stdout)["answers"]
    assert a["team"]["x_method"]["trained"] == "head" and "x_method" not in a["urgent"]
    r = run(["eval", str(data), "--decisions", str(q), "--gold-field", "team", "--task", str(task)])
    assert r.exit_code == 0, r.output
    assert "trained head" in r.output


@pytest.mark.parametrize(
    "args, words",
    [
        (["--labels", "a,b"], "--labels is for a labels task"),
        (["--pooling", "mean"], "--pooling is for a labels task"),
    ],
)
def test_train_decisions_refuses_what_it_cannot_use(tiny, q, tmp_path, args, words):
    gold = _gold(tmp_path, 8)
    r = run(["train", str(gold), "--decisions", str(q), "--gold-field", "team", "--model", tiny,
             "--save-task", str(tmp_path / "t.json"), *args])  # fmt: skip
    assert r.exit_code == 2 and words in r.output, r.output


def test_train_decisions_names_a_gold_value_that_is_no_option(tiny, q, tmp_path):
    gold = _gold(tmp_path, 8)  # its last row's team is "sales"
    r = run(["train", str(gold), "--decisions", str(q), "--gold-field", "team", "--model", tiny,
             "--save-task", str(tmp_path / "t.json"), "--folds", "2"])  # fmt: skip
    assert r.exit_code == 2 and "line 9: field 'team' is 'sales', not an option of question 'team'" in r.output


@pytest.mark.parametrize("mode", ["lora", "auto"])
def test_train_decisions_finetune_saves_a_classifier_per_question_that_decide_answers_with(tiny, q, tmp_path, mode):
    """--finetune lora|auto with --decisions: classify's own fine-tune (or choice) per labelled question,
    the question as its prompt, saved beside the decision task; decide --task answers that question with
    it (x_method says how it was trained) and the others raw."""
    gold = _gold(tmp_path, 24)
    rows = [json.loads(x) for x in gold.read_text().splitlines()][:-1]
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    task = tmp_path / "tuned.json"
    r = run(["train", str(data), "--decisions", str(q), "--gold-field", "team", "--model", tiny,
             "--save-task", str(task), "--finetune", mode, "--epochs", "1", "--folds", "2", "-q"])  # fmt: skip
    assert r.exit_code == 0, r.output
    (m,) = json.loads(task.read_text())["decisions"]["methods"]
    assert m["tuned"] == "tuned.team.json" and (tmp_path / "tuned.team.json").is_file()
    r = run(["decide", "--task", str(task), "-q"], input='{"id": 1, "state": "I was charged twice"}\n')
    assert r.exit_code == 0, r.output
    a = json.loads(r.stdout)["answers"]
    assert a["team"]["x_method"]["trained"] in ("fine-tuned", "learned head") and "x_method" not in a["urgent"]
    assert sum(a["team"]["probabilities"].values()) == pytest.approx(1.0)
    from mlx_slm.classifier.classifier import Classifier

    clf = Classifier.from_task(str(tmp_path / "tuned.team.json"))
    (p,) = clf.classify(["I was charged twice"])
    assert [a["team"]["probabilities"][k] for k in ("billing", "technical")] == pytest.approx(
        [p.probs["billing"], p.probs["technical"]], abs=1e-6
    )
    # the tuned question asked alone (no branch of the decision prompt at all): answered by its classifier
    alone = tmp_path / "team.json"
    alone.write_text(json.dumps({"team": QUESTIONS["team"]}))
    r = run(
        ["decide", "--task", str(task), "--questions", str(alone), "-q"],
        input='{"id": 1, "state": "I was charged twice"}\n',
    )
    assert r.exit_code == 0, r.output
    solo = json.loads(r.stdout)["answers"]
    assert solo["team"]["probabilities"] == pytest.approx(a["team"]["probabilities"], abs=1e-6)


def test_a_fine_tuning_option_without_finetune_is_refused_with_decisions(tiny, q, tmp_path):
    gold = _gold(tmp_path, 8)
    r = run(["train", str(gold), "--decisions", str(q), "--gold-field", "team", "--model", tiny,
             "--save-task", str(tmp_path / "t.json"), "--lr", "1e-4"])  # fmt: skip
    assert r.exit_code == 2 and "--lr is a fine-tuning option" in r.output
