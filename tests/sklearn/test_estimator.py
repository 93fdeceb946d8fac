"""The scikit-learn estimator (issue 29) and the Python API under it: `train_head` from
memory, `Classifier.features`, `Classifier.fit_calibration`, and `SLMClassifier` in
fit/predict, pipelines, cross-validation, grid search, pickles and task files.

Fast tests run on the tiny random model of conftest (what matters there is the path and
the equalities, not accuracy); the ones on the real default model are marked slow."""

from __future__ import annotations

import json
import pickle
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from mlx_slm.text.workload import tickets

pytest.importorskip("sklearn")

from tests.sklearn.tickets import LABELS, SYSTEM, TEMPLATE  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def _est(model, **kw):
    from mlx_slm.sklearn import SLMClassifier

    return SLMClassifier(model=str(model), system=SYSTEM, template=TEMPLATE, layers="1,2", folds=3, **kw)


# --------------------------------------------------------------------------- the API underneath
def test_train_head_from_memory_and_its_errors(tiny_qwen_mlx, data):
    import mlx_slm
    from mlx_slm import Classifier, Engine, Head, Task, train_head
    from mlx_slm.jobs.train import TrainError
    from mlx_slm.text.labels import LabelError

    assert {"Task", "Head", "train_head", "CalibrationSpec"} <= set(mlx_slm.__all__)
    assert Task is __import__("mlx_slm.classifier.task", fromlist=["Task"]).Task
    X, y, test = data
    engine = Engine.load(str(tiny_qwen_mlx))
    head = train_head(engine, X, y, system=SYSTEM, template=TEMPLATE, layers=[1, 2], folds=3)
    assert isinstance(head, Head) and head.labels == tuple(sorted(LABELS)) and head.info["n"] == len(X)
    # From a Classifier: its prompt and labels (in its order); the same features give the same head.
    clf = Classifier(engine, sorted(LABELS), SYSTEM, TEMPLATE)
    again = train_head(clf, X, y, layers=[1, 2], folds=3)
    assert again.sha256 == head.sha256
    # Classifier.features defaults to a head's own layers and poolings.
    hclf = Classifier(engine, head.labels, SYSTEM, TEMPLATE, head=head)
    feats, errors, st = hclf.features(test)
    assert errors == [None] * len(test) and st.items == len(test)
    assert set(feats) == set(head.poolings) and feats[head.poolings[0]].shape[1] == len(set(head.layers))
    with pytest.raises(ValueError, match="give the layers"):
        clf.features(test)
    only = Classifier(engine, ["a label", "another"], SYSTEM, TEMPLATE, features_only=True)
    with pytest.raises(LabelError, match="features_only"):
        only.classify(test[:1])
    bad = [
        (dict(texts=X[:3] + [None] + X[4:]), r"item 3: the text is missing"),
        (dict(texts=X[:2] + [b"x"] + X[3:]), r"item 2: the text is bytes"),
        (dict(texts=X[:1] + ["  "] + X[2:]), r"item 1: the text is empty"),
        (dict(labels=y[:-1]), rf"{len(X)} texts but {len(X) - 1} gold labels"),
        (dict(labels=["billing"] * len(X)), "a head needs examples of at least two labels"),
        (dict(labels=y[:5] + ["other"] + y[6:], classes=LABELS), r"item 5: gold label 'other' is not one"),
        (dict(folds=20), "at least 20 examples per label"),
    ]
    for change, msg in bad:
        args = {"texts": X, "labels": y, **change}
        with pytest.raises(TrainError, match=msg):
            train_head(engine, args.pop("texts"), args.pop("labels"), folds=args.pop("folds", 3), **args)


def test_fit_calibration_in_memory_equals_the_cli_fit(tiny_qwen_mlx, data, tmp_path):
    """`Classifier.fit_calibration` is what --calibration-data runs: the same prior."""
    from mlx_slm import Classifier
    from mlx_slm.cli import main
    from mlx_slm.text.calibration import CalibrationError

    X, y, test = data
    clf = Classifier.load(str(tiny_qwen_mlx), list(LABELS), SYSTEM, TEMPLATE)
    spec = clf.fit_calibration(X, y, "fit")
    assert spec.method == "fit" and spec.prior is not None and spec.prior.info["n"] == len(X)
    em = clf.fit_calibration(X, y, "em")
    assert em.method == "em" and em.base is not None and em.base.log_prior == spec.prior.log_prior
    assert clf.calibration.method == "none"  # the classifier itself is unchanged
    with pytest.raises(CalibrationError, match=r"item 2: gold label 'nope'"):
        clf.fit_calibration(X, y[:2] + ["nope"] + y[3:])
    with pytest.raises(CalibrationError, match="not 'batch'"):
        clf.fit_calibration(X, y, "batch")
    labelled = tmp_path / "cal.jsonl"
    labelled.write_text("".join(json.dumps({"text": t, "label": g}) + "\n" for t, g in zip(X, y)))
    task = tmp_path / "t.json"
    args = ["classify", "--model", str(tiny_qwen_mlx), "--labels", ",".join(LABELS), "--system", SYSTEM]
    args += ["--template", TEMPLATE, "--calibrate", "fit", "--calibration-data", str(labelled)]
    args += ["--save-task", str(task), "--quiet", "-o", str(tmp_path / "o.jsonl")]
    r = CliRunner().invoke(main, args, input="hello\n", catch_exceptions=False)
    assert r.exit_code == 0, r.output
    saved = json.loads(task.read_text())["calibration"]
    np.testing.assert_allclose(saved["log_prior"], spec.prior.log_prior, atol=1e-9)


# --------------------------------------------------------------------------- the estimator
def test_estimator_predict_proba_sums_to_one_and_argmax_is_predict(tiny_qwen_mlx, data, fresh):
    X, y, test = data
    est = _est(tiny_qwen_mlx).fit(X, y)
    assert list(est.classes_) == sorted(LABELS) and est.task_.head is not None
    p = est.predict_proba(test)
    assert p.shape == (len(test), 3)
    np.testing.assert_allclose(p.sum(axis=1), 1, atol=1e-9)
    assert (est.predict(test) == est.classes_[p.argmax(axis=1)]).all()
    np.testing.assert_allclose(est.decision_function(test), np.log(p), atol=1e-9)
    np.testing.assert_allclose(est.predict_log_proba(test), np.log(p), atol=1e-9)
    assert 0.0 <= est.score(X, y) <= 1.0
    f = est.transform(test)
    head = est.task_.head
    assert f.dtype == np.float32 and f.shape == (len(test), len(head.layers) * head.dim)
    # the features are what the head reads: its logits from them are the estimator's
    lp = head.log_probs(f.reshape(len(test), len(head.layers), head.dim))
    np.testing.assert_allclose(lp, np.log(p), atol=1e-4)
    assert fresh["loads"] == 1


def test_estimator_head_equals_cli_train_then_classify_task(tiny_qwen_mlx, data, fresh, tmp_path):
    """Done-when: the estimator's head is `mlx-slm train`'s on the same data and prompt (the
    same head, bit for bit), and its probabilities are `classify --task`'s."""
    from mlx_slm.classifier.task import Task
    from mlx_slm.cli import main

    X, y, test = data
    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps({"text": t, "label": g}) + "\n" for t, g in zip(X, y)))
    task = tmp_path / "cli.json"
    args = ["train", str(train), "--model", str(tiny_qwen_mlx), "--system", SYSTEM, "--template", TEMPLATE]
    r = CliRunner().invoke(main, [*args, "--layers", "1,2", "--folds", "3", "--save-task", str(task), "--quiet"])
    assert r.exit_code == 0, r.output
    cli_head = Task.load(task).head
    est = _est(tiny_qwen_mlx).fit(X, y)
    assert est.task_.head.sha256 == cli_head.sha256 and est.task_.head.parts == cli_head.parts
    assert est.task_.system == Task.load(task).system and est.task_.labels == Task.load(task).labels
    inp, out = tmp_path / "test.jsonl", tmp_path / "out.jsonl"
    inp.write_text("".join(json.dumps({"text": t}) + "\n" for t in test))
    r = CliRunner().invoke(main, ["classify", str(inp), "--task", str(task), "-o", str(out), "--quiet"])
    assert r.exit_code == 0, r.output
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    got = est.predict_proba(test)
    np.testing.assert_allclose([[r["probs"][c] for c in est.classes_] for r in rows], got, atol=2e-6)
    assert [r["label"] for r in rows] == list(est.predict(test))
    # and the estimator's own task file runs in classify --task as it stands
    est.to_task(tmp_path / "est.json")
    r = CliRunner().invoke(main, ["classify", str(inp), "--task", str(tmp_path / "est.json"), "-o", str(out), "--quiet"])  # fmt: skip
    assert r.exit_code == 0 and [json.loads(x)["label"] for x in out.read_text().splitlines()] == [r["label"] for r in rows]  # fmt: skip


def test_cross_val_score_loads_once_and_extracts_each_text_once_per_fold(tiny_qwen_mlx, data, fresh):
    from sklearn.model_selection import StratifiedKFold, cross_val_score

    X, y, _ = data
    scores = cross_val_score(_est(tiny_qwen_mlx), X, y, cv=5)
    assert len(scores) == 5 and all(0 <= s <= 1 for s in scores)
    assert fresh["loads"] == 1
    # Without the feature cache each fold would run its training texts once (every candidate
    # layer and pooling from one forward) and its test texts once: 5 x len(X) rows. With it:
    # fold 1 runs its training texts (all parts) and its test texts (the head's parts only);
    # fold 2 runs fold 1's test texts again for the other parts; every later text is cached.
    first_test = next(iter(StratifiedKFold(5).split(X, y)))[1]
    assert fresh["feature_rows"] == len(X) + len(first_test) < 5 * len(X)


def test_grid_search_pipeline_and_clone_share_one_engine(tiny_qwen_mlx, data, fresh):
    import pandas as pd
    from sklearn.base import clone
    from sklearn.compose import ColumnTransformer
    from sklearn.model_selection import GridSearchCV
    from sklearn.pipeline import Pipeline

    X, y, test = data
    est = _est(tiny_qwen_mlx, verbose=0)
    twin = clone(est)
    assert twin.get_params() == est.get_params() and twin is not est
    assert est.set_params(pooling="mean").get_params()["pooling"] == "mean"
    est.set_params(pooling="auto")
    grid = GridSearchCV(est, {"pooling": ["last", "mean"]}, cv=3).fit(X, y)
    assert grid.best_params_["pooling"] in ("last", "mean") and fresh["loads"] == 1
    # 2 candidates x 3 folds and the refit, not 7 x len(X) forwards: each text about once per pooling
    assert fresh["feature_rows"] <= 3 * len(X)
    assert grid.best_estimator_.task_.head.poolings == (grid.best_params_["pooling"],) * len(
        grid.best_estimator_.task_.head.layers
    )
    # a DataFrame column through a ColumnTransformer, inside a Pipeline
    df = pd.DataFrame({"text": X, "n": range(len(X))})
    pipe = Pipeline([("cols", ColumnTransformer([("text", "passthrough", ["text"])])), ("clf", clone(est))])
    pipe.fit(df, pd.Series(y))
    tdf = pd.DataFrame({"text": test, "n": range(len(test))})
    direct = _est(tiny_qwen_mlx).fit(pd.Series(X), np.array(y))
    np.testing.assert_allclose(pipe.predict_proba(tdf), direct.predict_proba(np.array(test, dtype=object)), atol=1e-9)
    assert fresh["loads"] == 1


def test_integer_labels_stay_integers(tiny_qwen_mlx, data, fresh):
    X, y, test = data
    ids = {lab: i for i, lab in enumerate(sorted(LABELS))}
    est = _est(tiny_qwen_mlx).fit(X, [ids[g] * 10 for g in y])
    assert est.classes_.tolist() == [0, 10, 20] and est.task_.labels == ("0", "10", "20")
    pred = est.predict(test)
    assert pred.dtype.kind == "i" and set(pred.tolist()) <= {0, 10, 20}


def test_zero_shot_labels_method_and_its_calibration(tiny_qwen_mlx, data, fresh):
    from mlx_slm import Classifier
    from mlx_slm.sklearn import SLMClassifier
    from mlx_slm.text.prompts import fill_labels

    X, y, test = data
    est = SLMClassifier(str(tiny_qwen_mlx), method="labels", labels=list(LABELS), system=SYSTEM, template=TEMPLATE)
    est.fit(test)  # with labels= given, zero-shot needs no y
    assert list(est.classes_) == list(LABELS) and est.task_.head is None
    engine = est._clf().engine
    clf = Classifier(engine, LABELS, fill_labels(SYSTEM, LABELS), TEMPLATE)
    want = [[p.probs[lab] for lab in LABELS] for p in clf.classify(test)]
    np.testing.assert_allclose(est.predict_proba(test), want, atol=1e-12)
    fit = SLMClassifier(str(tiny_qwen_mlx), method="labels", system=SYSTEM, template=TEMPLATE, calibration="fit")
    fit.fit(X, y)
    assert list(fit.classes_) == sorted(LABELS) and fit.task_.calibration.method == "fit"
    spec = Classifier(engine, sorted(LABELS), fill_labels(SYSTEM, sorted(LABELS)), TEMPLATE).fit_calibration(X, y)
    np.testing.assert_allclose(fit.task_.calibration.prior.log_prior, spec.prior.log_prior, atol=1e-12)
    p = fit.predict_proba(test)
    np.testing.assert_allclose(p.sum(axis=1), 1, atol=1e-9)
    assert (fit.predict(test) == fit.classes_[p.argmax(axis=1)]).all()
    with pytest.raises(ValueError, match="transform gives a learned head's features"):
        est.transform(test)
    # two classes: decision_function is scikit-learn's binary score, the log-odds of classes_[1]
    two = SLMClassifier(str(tiny_qwen_mlx), method="labels", labels=["billing", "technical"], template=TEMPLATE)
    two.fit(test)
    d, p2 = two.decision_function(test), two.predict_proba(test)
    assert d.shape == (len(test),)
    np.testing.assert_allclose(d, np.log(p2[:, 1]) - np.log(p2[:, 0]), atol=1e-9)
    assert ((d > 0) == (two.predict(test) == "technical")).all()
    assert fresh["loads"] == 1


def test_pickle_holds_the_task_and_other_weights_are_refused(tiny_qwen_mlx, tiny_qwen_hf, data, fresh, tmp_path):
    import joblib

    from mlx_slm.kinds.base import TaskError
    from mlx_slm.weights.convert import convert

    X, y, test = data
    est = _est(tiny_qwen_mlx).fit(X, y)
    want = est.predict_proba(test)
    blob = pickle.dumps(est)
    weights = sum(f.stat().st_size for f in Path(tiny_qwen_mlx).glob("*.safetensors"))
    assert len(blob) < weights / 4  # the task only (head, labels, prompt), never the weights
    back = pickle.loads(blob)
    assert back.task_.head.sha256 == est.task_.head.sha256 and list(back.classes_) == list(est.classes_)
    np.testing.assert_allclose(back.predict_proba(test), want, atol=1e-12)
    joblib.dump(est, tmp_path / "est.joblib")
    np.testing.assert_allclose(joblib.load(tmp_path / "est.joblib").predict_proba(test), want, atol=1e-12)
    # the same model converted at another precision: other weights, refused by hash, naming both
    other = convert(tiny_qwen_hf, tmp_path / "f16", dtype="float16", progress=None)
    moved = pickle.loads(blob).set_params(model=str(other))
    from mlx_slm.weights.convert import weights_sha256

    a, b = est.task_.weights_sha256[:12], weights_sha256(other)[:12]
    with pytest.raises(TaskError, match=rf"{a}.*the model loaded \({re.escape(str(other))}\) has {b}"):
        moved.predict(test)


def test_to_task_and_from_task(tiny_qwen_mlx, data, fresh, tmp_path):
    from mlx_slm.classifier.task import Task
    from mlx_slm.sklearn import SLMClassifier

    X, y, test = data
    est = _est(tiny_qwen_mlx).fit(X, y)
    path = est.to_task(tmp_path / "task.json")
    t = Task.load(path)
    assert t.head.sha256 == est.task_.head.sha256 and t.weights_sha256 == est.task_.weights_sha256
    back = SLMClassifier.from_task(path)
    assert back.method == "head" and back.model == str(tiny_qwen_mlx) and list(back.classes_) == list(est.classes_)
    np.testing.assert_allclose(back.predict_proba(test), est.predict_proba(test), atol=1e-12)


def test_bad_input_is_a_clear_error_and_nothing_is_printed(tiny_qwen_mlx, data, fresh, capsys):
    from sklearn.exceptions import NotFittedError

    X, y, test = data
    est = _est(tiny_qwen_mlx)
    with pytest.raises(NotFittedError):
        est.predict(test)
    with pytest.raises(NotFittedError):
        est.predict_proba(test)
    cases = [
        ((X, ["billing"] * len(X)), "y has one class"),
        ((X[:2] + [None] + X[3:], y), r"X row 2: the text is missing"),
        ((X[:4] + [float("nan")] + X[5:], y), r"X row 4: the text is missing"),
        ((X[:1] + [b"bytes"] + X[2:], y), r"X row 1 is bytes"),
        ((X[:3] + [""] + X[4:], y), r"X row 3: the text is empty"),
        ((X, y[:-1]), rf"X has {len(X)} texts but y has {len(X) - 1} labels"),
        ((X, y[:6] + [None] + y[7:]), r"y row 6: the label is missing"),
        ((X[0], y), "X is one str"),
        ((X, [0.5] * len(X)), "Unknown label type"),
        ((X, y[:-1] + [3]), r"y mixes label types \(int, str\)"),
    ]
    for (xx, yy), msg in cases:
        with pytest.raises(ValueError, match=msg):
            est.fit(xx, yy)
    with pytest.raises(ValueError, match=r"y row \d+: label '\w+' is not in labels="):
        _est(tiny_qwen_mlx, labels=["billing", "technical"]).fit(X, y)
    with pytest.raises(ValueError, match="method='nope'"):
        _est(tiny_qwen_mlx, method="nope").fit(X, y)
    with pytest.raises(ValueError, match="calibration applies to method='labels'"):
        _est(tiny_qwen_mlx, calibration="fit").fit(X, y)
    assert fresh["loads"] == 0  # every one refused before the model loads
    est.fit(X, y)
    with pytest.raises(ValueError, match=r"X row 1: the text is missing"):
        est.predict([test[0], None])
    with pytest.raises(ValueError, match="DataFrame of 2 columns"):
        import pandas as pd

        est.predict(pd.DataFrame({"a": test, "b": test}))
    out = capsys.readouterr()
    assert out.out == "" and out.err == ""


def test_verbose_draws_progress_bars_and_is_silent_otherwise(tiny_qwen_mlx, data, fresh, capsys):
    from mlx_slm.sklearn import FEATURES

    X, y, test = data
    est = _est(tiny_qwen_mlx).fit(X, y)
    est.predict(test)
    assert capsys.readouterr().err == ""
    FEATURES.clear()  # the texts run again: their bars show
    est.set_params(verbose=2).fit(X, y)
    err = capsys.readouterr().err
    assert "mlx-slm" in err and "item" in err and "cross-validating" in err
    FEATURES.clear()
    est.set_params(verbose=1).predict(test)
    err = capsys.readouterr().err
    assert f"{len(test)}/{len(test)}" in err and "cross-validating" not in err


def test_scikit_learns_checks_that_apply_to_a_text_classifier():
    """scikit-learn's `check_estimator` feeds numeric matrices: with the tags a text
    classifier must give (input_tags.two_d_array False, string True) it yields no check at
    all. The checks that do not need numeric X run here by name. The others do not apply:
    every one fits or predicts on a float matrix (dtypes, NaN/inf, sparse input, complex
    data, n_features_in_, 1-D/1-sample/1-feature matrices, sample and subset order on
    numeric X, memmaps, array API, partial_fit, sample_weight, multi-output); their
    text-shaped equivalents are the tests above: fit returns self and keeps its params
    (clone), refuses one class, y of another length, NaN/None, continuous y; classes_
    as given; predict_proba rows sum to 1; pickle gives the same predictions;
    NotFittedError before fit."""
    import warnings

    from sklearn.utils import estimator_checks as ec

    from mlx_slm.sklearn import SLMClassifier

    est = SLMClassifier()
    name = type(est).__name__
    applied = [
        ec.check_estimator_cloneable,
        ec.check_estimator_tags_renamed,
        ec.check_valid_tag_types,
        ec.check_estimator_repr,
        ec.check_no_attributes_set_in_init,
        ec.check_parameters_default_constructible,
        ec.check_get_params_invariance,
        ec.check_set_params,
        ec.check_do_not_raise_errors_in_init_or_set_params,
        ec.check_mixin_order,
        ec.check_estimators_unfitted,  # NotFittedError before any input is read
    ]
    for check in applied:
        check(name, est)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ec.check_estimator(est)  # yields nothing to run for string input: says so, passes
    assert any("requires input" in str(w.message) for w in caught)


# ------------------------------------------------------------------ docs/sklearn.md's walk-through
def _readme_blocks() -> tuple[str, str]:
    """The 'Python: scikit-learn' walk-through (docs/sklearn.md): the notebook block and the
    new-process block, as written."""
    text = (ROOT / "docs" / "sklearn.md").read_text(encoding="utf-8")
    assert text.startswith("# Python: scikit-learn"), "docs/sklearn.md is the scikit-learn page"
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert len(blocks) == 2, "docs/sklearn.md holds the notebook block and the new-process block"
    return blocks[0], blocks[1]


def _readme_csv(folder: Path, n: int = 300) -> None:
    """tickets.csv: `n` of the benchmark's hand-labelled tickets, as many of each label."""
    import pandas as pd

    rows = [json.loads(x) for x in (ROOT / "benchmarks/data/support_tickets.jsonl").read_text().splitlines()]
    df = pd.DataFrame(rows)[["id", "text", "label"]]
    df = df.groupby("label", group_keys=False).head(n // df["label"].nunique()).sort_values("id")
    df.to_csv(folder / "tickets.csv", index=False)


def _run_readme(folder: Path, model: str | None, monkeypatch, new_process: bool = True) -> dict:
    """The notebook block in this process, then the later block in a new process (or, for the
    quick loop, here in a fresh scope with no engine held: the slow test keeps the new process)."""
    notebook, later = _readme_blocks()
    if model is not None:  # the tiny model stands in for the default one; the code is as written
        notebook, later = (b.replace('"qwen2.5-coder-0.5b"', repr(model)) for b in (notebook, later))
    monkeypatch.chdir(folder)
    scope: dict = {}
    exec(compile(notebook, "docs/sklearn.md (Python: scikit-learn)", "exec"), scope)
    if not new_process:
        from contextlib import redirect_stdout
        from io import StringIO

        from mlx_slm import sklearn as sk

        sk.clear_engines()  # as a new process: the pickle must bring back everything it needs
        out = StringIO()
        with redirect_stdout(out):
            exec(compile(later, "docs/sklearn.md (Python: scikit-learn, later)", "exec"), {})
        scope["later_stdout"] = out.getvalue()
        return scope
    r = subprocess.run(
        [sys.executable, "-c", later], cwd=folder, capture_output=True, text=True, timeout=600,
        env={**__import__("os").environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    scope["later_stdout"] = r.stdout
    return scope


def test_readme_walkthrough_runs_as_written_on_the_tiny_model(tiny_qwen_mlx, tmp_path, monkeypatch, fresh, capsys):
    _readme_csv(tmp_path, 120)
    scope = _run_readme(tmp_path, str(tiny_qwen_mlx), monkeypatch, new_process=False)
    assert (tmp_path / "tickets-head.joblib").exists()
    assert len(scope["scores"]) == 5 and fresh["loads"] == 2  # the notebook's one, and the later block's own
    assert scope["later_stdout"].strip(), "the new process printed its predictions"


@pytest.mark.slow
def test_readme_walkthrough_and_pickle_size_on_the_default_model(tmp_path, monkeypatch):
    """As written, on the default model and 300 labelled rows (minutes on a 2-core CPU)."""
    _readme_csv(tmp_path, 300)
    scope = _run_readme(tmp_path, None, monkeypatch)
    assert (tmp_path / "tickets-head.joblib").stat().st_size < 5_000_000
    assert scope["head"].score(scope["test"]["text"], scope["test"]["label"]) > 0.5


ROWS = tickets(30)


def test_the_estimator_says_the_same(tiny_qwen_mlx):
    from mlx_slm.sklearn import SLMClassifier

    rows = [(t, g) for t, g in ROWS if g != "technical"]
    est = SLMClassifier(model=str(tiny_qwen_mlx), method="finetune", labels=["account", "billing", "technical"],
                        val_fraction=0.0, epochs=1, adapt_layers=1)  # fmt: skip
    with pytest.raises(ValueError, match=r"'technical' has 0: a fine-tuned classifier learns each label .* leave"):
        est.fit([t for t, _ in rows], [g for _, g in rows])
