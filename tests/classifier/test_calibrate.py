"""Right labels (issue 12): calibration, abstain, saved tasks, few-shot examples and eval,
on the tiny random models (the accuracy figures themselves are in benchmarks/accuracy.py).

From "right labels" (issue 12); was tests/test_right_labels.py."""

import json

import numpy as np
import pytest
from click.testing import CliRunner

from mlx_slm.cli import main
from mlx_slm.text.calibration import Calibrator, fit_batch
from mlx_slm.text.labels import log_softmax
from mlx_slm.text.workload import tickets
from tests.classify_run import run

LABELS = ["billing", "technical", "account"]
WORK = tickets(30)


def cli(model, *extra):
    return ["--model", str(model), "--labels", ",".join(LABELS), "-q", *extra]


@pytest.fixture()
def labelled(tmp_path):
    p = tmp_path / "gold.jsonl"
    p.write_text("".join(json.dumps({"id": i, "text": t, "label": lab}) + "\n" for i, (t, lab) in enumerate(WORK)))
    return p


def rows(stdout):
    return [json.loads(x) for x in stdout.splitlines()]


def raw_log_probs(model):
    """The model's own label log-probabilities on WORK, from the Python API (unrounded)."""
    from mlx_slm.classifier.classifier import Classifier

    clf = Classifier.load(str(model), LABELS)
    return log_softmax([[p.scores[k] for k in LABELS] for p in clf.classify([t for t, _ in WORK])])


def test_batch_calibration_is_the_input_mean_prior_in_log_space(tiny_qwen_mlx, labelled):
    raw = rows(run(["classify", str(labelled), *cli(tiny_qwen_mlx)]).stdout)
    r = run(["classify", str(labelled), *cli(tiny_qwen_mlx, "--calibrate", "batch")])
    cal = rows(r.stdout)
    assert r.exit_code == 0
    # raw_probs are the uncalibrated run's probs, untouched.
    assert [c["raw_probs"] for c in cal] == [x["probs"] for x in raw]
    lp = raw_log_probs(tiny_qwen_mlx)
    want = np.exp(fit_batch(lp, LABELS).apply(lp))
    got = np.array([[c["probs"][lab] for lab in LABELS] for c in cal])
    assert np.abs(got - want).max() < 1e-5
    assert [c["label"] for c in cal] == [LABELS[i] for i in want.argmax(1)]


def test_warmup_prior_comes_from_the_first_items_only(tiny_qwen_mlx, labelled):
    cal = rows(run(["classify", str(labelled), *cli(tiny_qwen_mlx, "--calibrate", "batch", "--warmup", "8")]).stdout)
    lp = raw_log_probs(tiny_qwen_mlx)
    want = np.exp(fit_batch(lp[:8], LABELS).apply(lp))
    got = np.array([[c["probs"][lab] for lab in LABELS] for c in cal])
    assert np.abs(got - want).max() < 1e-5
    assert np.abs(want - np.exp(fit_batch(lp, LABELS).apply(lp))).max() > 1e-3  # the warm-up prior differs


def test_min_confidence_abstains_and_counts(tiny_qwen_mlx, labelled, tmp_path):
    raw = rows(run(["classify", str(labelled), *cli(tiny_qwen_mlx)]).stdout)
    conf = sorted(max(o["probs"].values()) for o in raw)
    p = (conf[10] + conf[11]) / 2  # 11 items fall under it
    r = CliRunner().invoke(
        main,
        [
            "classify",
            str(labelled),
            "--model",
            str(tiny_qwen_mlx),
            "--labels",
            ",".join(LABELS),
            "--min-confidence",
            str(p),
        ],
    )
    out = rows(r.stdout)
    assert r.exit_code == 0
    for o, x in zip(out, raw):
        low = max(x["probs"].values()) < p
        assert (o["label"] is None) == low and o.get("abstained", False) == low
        assert o["probs"] == x["probs"]
    assert "11 abstained" in r.stderr
    csv_out = tmp_path / "o.csv"
    run(
        [
            "classify",
            str(labelled),
            *cli(tiny_qwen_mlx, "--min-confidence", "0.5", "--calibrate", "batch", "-o", str(csv_out)),
        ]
    )
    header = csv_out.read_text().splitlines()[0].split(",")
    assert "abstained" in header and "raw_p_billing" in header


def test_saved_task_reproduces_the_run(tiny_qwen_mlx, labelled, tmp_path):
    task = tmp_path / "task.json"
    a = run(
        [
            "classify",
            str(labelled),
            *cli(tiny_qwen_mlx, "--calibrate", "batch", "--system", "Sort tickets.", "--save-task", str(task)),
        ]
    )
    t = json.loads(task.read_text())
    assert t["format"] == "mlx-slm.task" and t["labels"] == LABELS and t["system"] == "Sort tickets."
    assert t["calibration"]["method"] == "batch" and len(t["calibration"]["log_prior"]) == 3
    assert len(t["weights_sha256"]) == 64 and "mlx" in t["versions"]
    # The saved prior is applied as is: same rows, though the input is a different order.
    b = run(["classify", str(labelled), "--task", str(task), "-q"])
    assert b.stdout == a.stdout
    from mlx_slm.classifier.classifier import Classifier

    clf = Classifier.from_task(task)
    preds = clf.classify([t for t, _ in WORK[:4]])
    assert [p.label for p in preds] == [r["label"] for r in rows(a.stdout)[:4]]


def test_task_from_other_weights_is_refused(tiny_qwen_mlx, tmp_path):
    from mlx_slm.classifier.task import Task

    task = tmp_path / "t.json"
    prior = Calibrator("batch", tuple(LABELS), (0.1, -0.2, 0.1), n=30)
    Task(str(tiny_qwen_mlx), tuple(LABELS), None, "T: {text}", calibration=prior, weights_sha256="0" * 64).save(task)
    r = CliRunner().invoke(main, ["classify", "--task", str(task)], input="hello\n")
    assert r.exit_code == 2 and "weights sha256" in r.output
    # Without the task's prior the weights do not matter.
    r = CliRunner().invoke(main, ["classify", "--task", str(task), "--calibrate", "none", "-q"], input="hello\n")
    assert r.exit_code == 0, r.output
    # Changing what the prior was fitted for, without recalibrating, is refused.
    r = CliRunner().invoke(main, ["classify", "--task", str(task), "--system", "Other."], input="hello\n")
    assert r.exit_code == 2 and "--system" in r.output and "--calibrate" in r.output


def test_fit_reports_cross_validated_accuracy_and_applies(tiny_qwen_mlx, labelled):
    r = run(
        [
            "classify",
            str(labelled),
            "--model",
            str(tiny_qwen_mlx),
            "--labels",
            ",".join(LABELS),
            "--calibrate",
            "fit",
            "--calibration-data",
            str(labelled),
        ]
    )
    assert r.exit_code == 0
    assert "cross-validated accuracy" in r.stderr and "fit calibration" in r.stderr
    assert all("raw_probs" in o for o in rows(r.stdout))
    r = run(["classify", str(labelled), *cli(tiny_qwen_mlx, "--calibrate", "em", "--calibration-data", str(labelled))])
    assert r.exit_code == 0 and all("raw_probs" in o for o in rows(r.stdout))


@pytest.mark.parametrize(
    "content, msg",
    [
        ("", "empty"),
        (json.dumps({"text": "x", "label": "refund"}) + "\n", "refund"),
        (
            "".join(json.dumps({"text": f"t {i}", "label": ["billing", "technical"][i % 2]}) + "\n" for i in range(6)),
            "no example of label 'account'",
        ),
        (json.dumps({"text": "x"}) + "\n", "gold label"),
    ],
)
def test_bad_calibration_data_is_a_clear_error(tiny_qwen_mlx, tmp_path, content, msg):
    data = tmp_path / "cal.jsonl"
    data.write_text(content)
    r = CliRunner().invoke(
        main, ["classify", *cli(tiny_qwen_mlx, "--calibrate", "fit", "--calibration-data", str(data))], input="hello\n"
    )
    assert r.exit_code == 2, r.output
    assert msg in r.output and "Traceback" not in r.output


def test_fit_without_data_is_a_usage_error(tiny_qwen_mlx):
    r = CliRunner().invoke(main, ["classify", *cli(tiny_qwen_mlx, "--calibrate", "fit")], input="hello\n")
    assert r.exit_code == 2 and "--calibration-data" in r.output


def test_eval_reports_and_scores_an_existing_file_the_same(tiny_qwen_mlx, labelled, tmp_path):
    with labelled.open("a") as f:
        f.write(json.dumps({"id": "x", "text": "a refund please", "label": "refund"}) + "\n")
    js, plots = tmp_path / "e.json", tmp_path / "plots"
    r = run(
        ["eval", str(labelled), *cli(tiny_qwen_mlx, "--calibrate", "batch"), "--json", str(js), "--plots", str(plots)]
    )
    assert r.exit_code == 0, r.output
    rep = json.loads(js.read_text())
    assert {"n", "labels", "accuracy", "macro_f1", "per_label", "confusion", "ece"} <= set(rep)
    assert rep["n"] == len(WORK) and rep["errors"] == 1 and "refund" in r.stdout
    assert sum(map(sum, rep["confusion"])) == len(WORK)
    assert (plots / "confusion.png").stat().st_size > 1000 and (plots / "reliability.png").stat().st_size > 1000
    preds = tmp_path / "p.jsonl"
    run(
        ["classify", str(labelled), *cli(tiny_qwen_mlx, "--calibrate", "batch", "-o", str(preds), "--on-error", "skip")]
    )
    js2 = tmp_path / "e2.json"
    r2 = run(
        ["eval", str(labelled), "--labels", ",".join(LABELS), "--predictions", str(preds), "--json", str(js2), "-q"]
    )
    assert r2.exit_code == 0
    rep2 = json.loads(js2.read_text())
    assert rep2["accuracy"] == rep["accuracy"] and rep2["confusion"] == rep["confusion"]


def test_few_shot_examples_are_in_the_cached_prefix_and_change_nothing_else(tiny_qwen_mlx, tmp_path):
    from mlx_slm.classifier.classifier import Classifier

    ex = [("My invoice is wrong", "billing"), ("The app froze", "technical")]
    texts = [t for t, _ in WORK[:8]]
    plain = Classifier.load(str(tiny_qwen_mlx), LABELS, "Sort.", "T: {text}\nC:")
    few = Classifier.load(str(tiny_qwen_mlx), LABELS, "Sort.", "T: {text}\nC:", examples=ex)
    nocache = Classifier.load(str(tiny_qwen_mlx), LABELS, "Sort.", "T: {text}\nC:", examples=ex, use_prefix_cache=False)
    assert len(few.prefix) > len(plain.prefix) + 10  # the examples are inside the shared prefix
    a, b = few.classify(texts), nocache.classify(texts)
    assert [p.label for p in a] == [p.label for p in b]
    assert max(abs(p.scores[k] - q.scores[k]) for p, q in zip(a, b) for k in LABELS) < 1e-3
    exf = tmp_path / "ex.jsonl"
    exf.write_text("".join(json.dumps({"text": t, "label": lab}) + "\n" for t, lab in ex))
    r = run(
        ["classify", *cli(tiny_qwen_mlx, "--system", "Sort.", "--template", "T: {text}\nC:", "--examples", str(exf))],
        input="\n".join(texts) + "\n",
    )
    assert [o["label"] for o in rows(r.stdout)] == [p.label for p in a]
    exf.write_text(json.dumps({"text": "x", "label": "nope"}) + "\n")
    r = CliRunner().invoke(main, ["classify", *cli(tiny_qwen_mlx, "--examples", str(exf))], input="hi\n")
    assert r.exit_code == 2 and "'nope'" in r.output


@pytest.mark.slow
def test_calibrated_labels_equal_those_from_the_reference_scores(tiny_qwen_mlx):
    """Exactness stays provable: the same prior on Transformers' raw scores gives our labels."""
    from mlx_slm.classifier.classifier import Classifier
    from mlx_slm.parity.reference import score_in_child

    clf = Classifier.load(str(tiny_qwen_mlx), LABELS)
    texts = [t for t, _ in WORK]
    ours = clf.classify(texts, calibration="batch")
    lp_ours = log_softmax([[p.scores[k] for k in LABELS] for p in clf.classify(texts)])
    prior = fit_batch(lp_ours, LABELS)
    ref_scores, _, _ = score_in_child(str(tiny_qwen_mlx), [it.ids for it in clf.prepare(texts)], clf.labelset)
    ref_cal = prior.apply(log_softmax(ref_scores))
    assert [p.label for p in ours] == [LABELS[i] for i in ref_cal.argmax(1)]
    assert isinstance(prior, Calibrator)
