""" "None of these" (issue 42, item 3): out-of-scope examples learned as a class (`train --none-label`),
a threshold chosen on held-out data to a stated target (`--none-threshold auto`), the task recording
both, and the answer (label null, abstained) in classify, eval, serve, Ray and the estimator; the
pure rule and figures (`text.out_of_scope`)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from mlx_slm.classifier.task import Task
from mlx_slm.text.out_of_scope import answers, choose_threshold, figures
from mlx_slm.text.workload import tickets
from tests.train_cli import run, write_rows

LABELS = ["billing", "technical", "account", "oos"]
OOS = ["what is the weather like", "tell me a joke", "how tall is everest", "play some music",
       "who won the game", "translate hello to french"]  # fmt: skip


# --------------------------------------------------------------------------- the pure rule and figures
def test_answers_say_none_for_the_none_class_or_under_the_threshold():
    p = np.array([[0.7, 0.1, 0.1, 0.1], [0.1, 0.1, 0.1, 0.7], [0.3, 0.25, 0.25, 0.2]])
    assert answers(p, LABELS, "oos", None) == ["billing", None, "billing"]
    assert answers(p, LABELS, "oos", 0.5) == ["billing", None, None]  # 0.3 < 0.5: no in-scope label sure enough
    assert answers(p[:, :3], LABELS[:3], None, 0.5) == ["billing", None, None]


def test_figures_count_none_as_wrong_in_scope_and_score_out_of_scope():
    got = figures(["billing", None, None, "account"], ["billing", "oos", "technical", "oos"], "oos")
    assert got["in_scope_accuracy"] == 0.5 and got["in_scope_answered"] == 0.5
    assert got["oos_recall"] == 0.5 and got["oos_precision"] == 0.5


def test_the_threshold_keeps_to_its_target_and_is_the_largest_that_does():
    rng = np.random.default_rng(0)
    n = 400
    gold = [LABELS[i] for i in rng.integers(0, 4, n)]
    p = rng.dirichlet(np.ones(4), n) * 0.5
    for i, g in enumerate(gold):  # a weak signal: the gold label gets extra mass
        p[i, LABELS.index(g)] += 0.5
    t, f = choose_threshold(p, gold, LABELS, "oos", target=0.05)
    base = f["without_threshold"]["in_scope_accuracy"]
    assert t is not None and f["in_scope_accuracy"] >= base - 0.05 - 1e-9
    above = figures(answers(p, LABELS, "oos", t + 1e-6), gold, "oos")  # any higher threshold misses the target
    assert above["in_scope_accuracy"] < base - 0.05 or above == {k: f[k] for k in above}
    assert f["oos_recall"] >= f["without_threshold"]["oos_recall"]
    with pytest.raises(ValueError, match="target"):
        choose_threshold(p, gold, LABELS, "oos", target=1.0)


# --------------------------------------------------------------------------- the CLI, on a tiny model
@pytest.fixture(scope="module")
def work(tmp_path_factory, tiny_qwen_mlx):
    d = tmp_path_factory.mktemp("oos")
    rows = [{"text": t, "label": g} for t, g in tickets(36)] + [{"text": t, "label": "oos"} for t in OOS * 2]
    data = write_rows(d / "train.jsonl", rows)
    held = write_rows(d / "held.jsonl", [{"text": t, "label": g} for t, g in tickets(48)[36:]] +
                  [{"text": t + " please", "label": "oos"} for t in OOS])  # fmt: skip
    task = d / "task.json"
    r = run(["train", data, "--model", tiny_qwen_mlx, "--save-task", task, "--folds", "2", "--layers", "1,2",
             "--none-label", "oos", "--none-threshold", "auto", "--none-data", held, "--none-target", "0.3"])  # fmt: skip
    assert r.exit_code == 0, r.output
    return SimpleNamespace(d=d, data=data, held=held, task=task, model=str(tiny_qwen_mlx), out=r.output)


def test_train_records_the_none_label_and_how_its_threshold_was_chosen(work):
    t = Task.load(work.task)
    assert t.none["label"] == "oos" and "oos" in t.labels
    chosen = t.none["min_confidence"]
    assert chosen["target"] == 0.3 and chosen["n"] == 12 + len(OOS) and chosen["chosen_on"] == str(work.held)
    assert t.min_confidence == chosen["threshold"]
    assert "none of these: min_confidence" in work.out


def test_classify_answers_none_of_these_as_no_label(work):
    inp = write_rows(work.d / "in.jsonl", [{"text": t} for t in OOS + [x for x, _ in tickets(6)]])
    out = work.d / "out.jsonl"
    r = run(["classify", inp, "--task", work.task, "-o", out, "-q"])
    assert r.exit_code == 0, r.output
    recs = [json.loads(x) for x in out.read_text().splitlines()]
    assert any(x.get("abstained") for x in recs)
    for x in recs:
        assert (x["label"] is None) == x.get("abstained", False)  # written when true, as --min-confidence writes it
        assert x["label"] != "oos"  # the none label is never an answer
    assert set(x["probs"]) == set(LABELS)


def test_eval_reports_in_scope_accuracy_and_out_of_scope_recall(work, tmp_path):
    js = tmp_path / "eval.json"
    r = run(["eval", work.held, "--task", work.task, "--json", js])
    assert r.exit_code == 0, r.output
    assert "out-of-scope recall" in r.stdout and "in-scope accuracy" in r.stdout
    f = json.loads(js.read_text())["out_of_scope"]
    assert f["out_of_scope"] == len(OOS) and f["in_scope"] == 12
    assert 0.0 <= f["oos_recall"] <= 1.0


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (["--none-threshold", "auto"], "--none-data"),
        (["--none-threshold", "1.5"], "probability"),
        (["--none-threshold", "nan"], "probability"),
        (["--none-target", "0.1"], "--none-threshold auto"),
        (["--none-threshold", "auto", "--none-data", "{held}", "--none-target", "0"], "--none-target"),
        (["--none-threshold", "auto", "--none-data", "{held}", "--none-target", "inf"], "--none-target"),
        (["--none-label", "nope"], "no row of DATA is labelled 'nope'"),
    ],
)
def test_bad_none_options_exit_2_naming_the_option(work, tmp_path, extra, words):
    task = tmp_path / "t.json"
    extra = [str(work.held) if x == "{held}" else x for x in extra]
    r = run(["train", work.data, "--model", work.model, "--save-task", task, "--folds", "2", "--layers", "1",
             *extra])  # fmt: skip
    assert r.exit_code == 2 and words in r.output, r.output
    assert not task.exists()


def test_out_of_scope_texts_only_in_the_held_out_data_give_a_threshold_alone(work, tmp_path):
    """The other way: no out-of-scope example to learn from, only held-out ones that --none-label marks;
    the threshold, chosen on them, is what answers "none of these" (no none class in the task)."""
    data = write_rows(tmp_path / "in-scope.jsonl", [{"text": t, "label": g} for t, g in tickets(36)])
    task = tmp_path / "t.json"
    r = run(["train", data, "--model", work.model, "--save-task", task, "--folds", "2", "--layers", "1,2",
             "--none-label", "oos", "--none-threshold", "auto", "--none-data", work.held, "--none-target", "0.3"])  # fmt: skip
    assert r.exit_code == 0, r.output
    t = Task.load(task)
    assert "oos" not in t.labels and t.none["label"] is None
    chosen = t.none["min_confidence"]
    assert chosen["out_of_scope_label"] == "oos" and chosen["out_of_scope"] == len(OOS) and chosen["in_scope"] == 12
    assert t.min_confidence == chosen["threshold"] and "oos_recall" in chosen
    e = run(["eval", work.held, "--task", task, "--json", tmp_path / "e.json"])
    assert e.exit_code == 0, e.output
    f = json.loads((tmp_path / "e.json").read_text())
    assert f["out_of_scope"]["out_of_scope"] == len(OOS) and f["out_of_scope"]["in_scope"] == 12
    assert f["errors"] == 0 and "out-of-scope recall" in e.stdout


def test_a_row_without_a_label_names_the_none_label_fix(work, tmp_path):
    data = write_rows(
        tmp_path / "d.jsonl", [{"text": t, "label": g} for t, g in tickets(12)] + [{"text": "x", "label": None}]
    )
    r = run(["train", data, "--model", work.model, "--save-task", tmp_path / "t.json", "--folds", "2"])
    assert r.exit_code == 2 and "line 13" in r.output and "--none-label" in r.output


# --------------------------------------------------------------------------- a fine-tuned task, everywhere
@pytest.fixture(scope="module")
def tuned(work, tmp_path_factory):
    d = tmp_path_factory.mktemp("oos-ft")
    task = d / "ft.json"
    r = run(["train", work.data, "--finetune", "lora", "--model", work.model, "--save-task", task,
             "--adapt-layers", "2", "--epochs", "2", "--lr", "1e-3", "--head-lr", "1e-2", "--val-fraction", "0",
             "--none-label", "oos", "--none-threshold", "0.4", "-q"])  # fmt: skip
    assert r.exit_code == 0, r.output
    return SimpleNamespace(d=d, task=task)


def test_a_fine_tuned_task_records_its_none_and_answers_it(work, tuned):
    t = Task.load(tuned.task)
    assert t.none == {"label": "oos", "min_confidence": None} and t.min_confidence == 0.4
    out = tuned.d / "out.jsonl"
    r = run(["classify", work.held, "--task", tuned.task, "-o", out, "-q"])
    assert r.exit_code == 0, r.output
    recs = [json.loads(x) for x in out.read_text().splitlines()]
    for x in recs:
        inside = max(v for k, v in x["probs"].items() if k != "oos")
        none = x["probs"]["oos"] == max(x["probs"].values()) or inside < 0.4
        assert (x["label"] is None) == none == x.get("abstained", False)


def test_serve_answers_none_of_these_as_abstained(work, tuned):
    pytest.importorskip("starlette")
    httpx = pytest.importorskip("httpx")
    from mlx_slm.jobs import plan as plans
    from mlx_slm.jobs.plan import TaskOptions
    from mlx_slm.server import Loaded, ServeOptions, Service
    from tests.server.test_app import ThreadServer

    plan = plans.resolve(TaskOptions(task_file=str(tuned.task), given=frozenset({"task_file"})), lambda _m: None)

    def load():  # as `mlx-slm serve --task` loads
        p, clf = plans.load_fitted(plan, lambda _m: None)
        return Loaded(clf, p.calibration, p.min_confidence, p.warmup, model=p.model.name,
                      weights_sha256=clf.engine.weights_sha256)  # fmt: skip

    srv = ThreadServer(Service(load, ServeOptions(max_wait_ms=5))).start()
    try:
        got = httpx.post(srv.url + "/v1/classify", json={"texts": OOS + ["my card was charged twice"]}, timeout=60)
        assert got.status_code == 200, got.text
        for x in got.json()["results"]:
            assert (x["label"] is None) == bool(x.get("abstained"))
            assert x["label"] != "oos"
    finally:
        srv.stop()


def test_export_says_how_it_answers_none_of_these(work, tuned, tmp_path):
    out = tmp_path / "exported"
    r = run(["export", tuned.task, "-o", out, "-q"])
    assert r.exit_code == 0, r.output
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["mlx_slm"]["none"] == {"label": "oos", "min_confidence": 0.4}
    assert "None of these" in (out / "README.md").read_text()
    from mlx_slm.classifier.classifier import Classifier

    clf = Classifier.load(str(out))
    assert clf.spec.none_label == "oos"  # --model DIR answers it as the task did


def test_the_estimator_learns_none_and_saves_it_in_the_task(work, tmp_path):
    pytest.importorskip("sklearn")
    from mlx_slm.sklearn import SLMClassifier

    rows = [json.loads(x) for x in work.data.read_text().splitlines()]
    X, y = [r["text"] for r in rows], [r["label"] for r in rows]
    est = SLMClassifier(model=work.model, layers=[1], folds=2, none_label="oos").fit(X, y)
    assert "oos" in list(est.classes_)
    pred = est.predict(OOS)
    assert set(pred) <= set(est.classes_)  # a class: "oos" for a text that fits no other
    est.to_task(tmp_path / "t.json")
    assert Task.load(tmp_path / "t.json").none["label"] == "oos"
    with pytest.raises(ValueError, match="none_label"):
        SLMClassifier(model=work.model, layers=[1], folds=2, none_label="nope").fit(X, y)


def test_a_none_label_no_file_carries_exits_2_naming_both(work, tmp_path):
    data = write_rows(tmp_path / "in-scope.jsonl", [{"text": t, "label": g} for t, g in tickets(36)])
    held = write_rows(tmp_path / "held.jsonl", [{"text": t, "label": g} for t, g in tickets(48)[36:]])
    task = tmp_path / "t.json"
    r = run(["train", data, "--model", work.model, "--save-task", task, "--folds", "2", "--layers", "1",
             "--none-label", "nope", "--none-threshold", "auto", "--none-data", held])  # fmt: skip
    assert r.exit_code == 2 and "no row of DATA or of" in r.output and "'nope'" in r.output, r.output
    assert not task.exists()


# --------------------------------------------------------------------------- eval scores "none of these" as an answer
def _perfect(held: Path, out: Path, labels: list[str], none: str) -> Path:
    """A perfect answer set for `held`: every in-scope text its gold label, every none text none."""
    rows = [json.loads(x) for x in held.read_text().splitlines()]
    recs = []
    for i, r in enumerate(rows):
        probs = {lab: (0.9 if lab == r["label"] else 0.1 / (len(labels) - 1)) for lab in labels}
        if r["label"] == none:
            recs.append({"id": i + 1, "label": None, "probs": probs, "abstained": True})
        else:
            recs.append({"id": i + 1, "label": r["label"], "probs": probs})
    return write_rows(out, recs)


@pytest.mark.parametrize("learned", [True, False], ids=["none-class", "threshold-only"])
def test_eval_of_a_perfect_answer_set_scores_100_with_the_none_label_right(work, tmp_path, learned):
    """Issue 47: a gold none answered none was an abstention (78.95 % accuracy, 'oos' an in-scope label
    with F1 0) while eval's own none section said 100 %: now it is right in every figure."""
    if learned:
        task = work.task
    else:
        data = write_rows(tmp_path / "in-scope.jsonl", [{"text": t, "label": g} for t, g in tickets(36)])
        task = tmp_path / "t.json"
        r = run(["train", data, "--model", work.model, "--save-task", task, "--folds", "2", "--layers", "1",
                 "--none-label", "oos", "--none-threshold", "auto", "--none-data", work.held, "-q"])  # fmt: skip
        assert r.exit_code == 0, r.output
    labels = Task.load(task).labels
    preds = _perfect(work.held, tmp_path / "p.jsonl", labels, "oos")
    js = tmp_path / "e.json"
    r = run(["eval", work.held, "--task", task, "--predictions", preds, "--json", js])
    assert r.exit_code == 0, r.output
    rep = json.loads(js.read_text())
    assert rep["accuracy"] == rep["accuracy_all"] == 1.0 and rep["macro_f1"] == 1.0 and rep["abstained"] == 0
    assert rep["labels"].count("oos") == 1 and rep["per_label"]["oos"] == {
        "precision": 1.0, "recall": 1.0, "f1": 1.0, "support": len(OOS)}  # fmt: skip
    k = rep["labels"].index("oos")
    assert rep["confusion"][k][k] == len(OOS) and sum(map(sum, rep["confusion"])) == rep["n"] == 12 + len(OOS)
    f = rep["out_of_scope"]
    assert f["oos_recall"] == f["oos_precision"] == f["in_scope_accuracy"] == 1.0
    assert "accuracy 100.00 %" in r.stdout and "none of these" in r.stdout


def test_eval_counts_an_in_scope_text_answered_none_in_the_none_column(work, tmp_path):
    labels = Task.load(work.task).labels
    preds = _perfect(work.held, tmp_path / "p.jsonl", labels, "oos")
    recs = [json.loads(x) for x in preds.read_text().splitlines()]
    recs[0] = {**recs[0], "label": None, "abstained": True}  # an in-scope text answered none: wrong
    gold0 = json.loads(work.held.read_text().splitlines()[0])["label"]
    write_rows(preds, recs)
    js = tmp_path / "e.json"
    r = run(["eval", work.held, "--task", work.task, "--predictions", preds, "--json", js])
    assert r.exit_code == 0, r.output
    rep = json.loads(js.read_text())
    n = 12 + len(OOS)
    assert rep["accuracy"] == pytest.approx((n - 1) / n) and rep["per_label"]["oos"]["precision"] < 1.0
    assert rep["confusion"][rep["labels"].index(gold0)][rep["labels"].index("oos")] == 1
    assert rep["out_of_scope"]["in_scope_accuracy"] == round(11 / 12, 4)
