"""Hostile round eight (issue 53), the jobs' part: messages that name the right thing. A number too
long for Python to read is said so in every JSON reader (not Python's `sys.set_int_max_str_digits`
advice, which no user of a file or an HTTP client can follow)."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest

from mlx_slm.classifier.task import Task
from mlx_slm.files.labelfiles import read_label_descriptions
from mlx_slm.files.readers import STATE_OPTIONS, TEXT_OPTIONS, ReadSpec, read_rows
from mlx_slm.ground.errors import UserError
from mlx_slm.jobs.plan import TaskOptions, resolve
from mlx_slm.text.calibration import Calibrator
from mlx_slm.text.prompts import read_examples
from mlx_slm.text.questions import read_questions
from tests.hostile import invoke, refused_cleanly

HUGE = "9" * 5000


def _fault(fn, path) -> str:
    with pytest.raises(UserError) as e:
        fn(str(path))
    return str(e.value)


@pytest.mark.parametrize(
    "name, line, read",
    [
        ("input.jsonl", f'{{"text": "a", "n": {HUGE}}}', lambda p: next(iter(read_rows(p))).error),
        (
            "examples.jsonl",
            f'{{"text": "a", "label": "x", "n": {HUGE}}}',
            lambda p: _fault(lambda q: read_examples(q, ["x", "y"]), p),
        ),
        ("labels.jsonl", f'{{"label": "x", "n": {HUGE}}}', lambda p: _fault(read_label_descriptions, p)),
        ("questions.jsonl", f'{{"name": "q", "n": {HUGE}}}', lambda p: _fault(read_questions, p)),
        ("questions.json", f'[{{"name": "q", "n": {HUGE}}}]', lambda p: _fault(read_questions, p)),
        ("task.json", f'{{"model": "m", "n": {HUGE}}}', lambda p: _fault(Task.load, p)),
    ],
)
def test_every_json_reader_says_a_number_is_too_long(tmp_path, name, line, read):
    p = tmp_path / name
    p.write_text(line + "\n")
    said = read(p)
    assert "number too long" in said and "set_int_max_str_digits" not in said, said


# ----------------------------------------------------------------------------- options nothing reads


def _input(tmp_path):
    p = tmp_path / "in.jsonl"
    rows = [{"id": i, "text": f"ticket {i}", "label": ("billing", "tech")[i % 2]} for i in range(4)]
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return p


@pytest.mark.parametrize("command", ["classify", "eval"])
@pytest.mark.parametrize(
    "extra, says",
    [
        ((), "(none)"),
        (("--calibrate", "fit", "--calibration-data", "CAL"), "(fit)"),
    ],
)
def test_warmup_without_a_warm_up_calibration_is_refused(tmp_path, tiny_qwen_mlx, command, extra, says):
    inp = _input(tmp_path)
    extra = [str(inp) if x == "CAL" else x for x in extra]
    r = invoke([command, inp, "--model", tiny_qwen_mlx, "--labels", "billing,tech", "--warmup", "3", *extra, "-q"])
    refused_cleanly(r, "--warmup", says, "--calibrate batch|em")


def test_serve_refuses_warmup_without_a_warm_up_calibration(tiny_qwen_mlx):
    # a child process: an option taken would serve until killed
    cmd = [sys.executable, "-m", "mlx_slm.cli", "serve", "--model", str(tiny_qwen_mlx), "--port", "0", "--warmup", "3"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--warmup" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_warmup_is_taken_where_a_prior_is_fitted_on_the_input():
    for calibrate in ("batch", "em"):
        o = TaskOptions(calibrate=calibrate, warmup=7, given=frozenset({"calibrate", "warmup"}))
        if calibrate == "em":
            o = replace(o, calibration_data=__file__, given=o.given | {"calibration_data"})
        assert resolve(o, print).calibration.warmup == 7


def test_warmup_reaches_the_questions_batch_prior(tmp_path):
    q = tmp_path / "q.jsonl"
    q.write_text('{"name": "topic", "question": "Which?", "labels": ["a", "b"]}\n')
    o = TaskOptions(
        questions_file=str(q), calibrate="batch", warmup=5, given=frozenset({"questions_file", "calibrate", "warmup"})
    )
    assert resolve(o, print).calibration.warmup == 5  # was the default 512: --warmup ignored with --questions
    with pytest.raises(UserError, match="--warmup"):
        resolve(replace(o, calibrate="none", given=o.given - {"calibrate"}), print)


def test_warmup_with_a_task_of_a_fitted_prior_is_refused(tmp_path):
    t = tmp_path / "t.json"
    prior = Calibrator("batch", ("billing", "tech"), (-0.5, -0.9))
    Task(model="m", labels=["billing", "tech"], system="Route.", template="{text}", calibration=prior).save(t)
    with pytest.raises(UserError, match="the task's fitted prior"):
        resolve(TaskOptions(task_file=str(t), warmup=5, given=frozenset({"task_file", "warmup"})), print)
    resolve(
        TaskOptions(
            task_file=str(t), calibrate="batch", warmup=5, given=frozenset({"task_file", "calibrate", "warmup"})
        ),
        print,
    )


def test_ray_refuses_warmup_without_a_warm_up_calibration(tiny_qwen_mlx):
    mray = pytest.importorskip("mlx_slm.ray")
    with pytest.raises(ValueError, match="warmup"):
        mray.classify_dataset(None, model=str(tiny_qwen_mlx), calibrate="none", warmup=5)


@pytest.mark.parametrize("option", ["--gold-field", "--gold-column"])
def test_classify_refuses_a_gold_field_nothing_reads(tmp_path, tiny_qwen_mlx, option):
    inp = _input(tmp_path)
    r = invoke(["classify", inp, "--model", tiny_qwen_mlx, "--labels", "billing,tech", option, "label", "-q"])
    refused_cleanly(r, "--gold-field", "--calibration-data")
    ok = invoke(["classify", inp, "--model", tiny_qwen_mlx, "--labels", "billing,tech", "--calibrate", "fit",
                 "--calibration-data", inp, option, "label", "-q"])  # fmt: skip
    assert ok.exit_code == 0, ok.output


@pytest.mark.parametrize("option", ["--text-field", "--gold-field", "--pair-column"])
def test_serve_refuses_calibration_data_fields_without_calibration_data(tiny_qwen_mlx, option):
    cmd = [sys.executable, "-m", "mlx_slm.cli", "serve", "--model", str(tiny_qwen_mlx), "--port", "0", option, "x"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and option in r.stderr and "--calibration-data" in r.stderr, r.stderr


# ----------------------------------------------------------------------------- the weights check


def test_a_task_from_other_weights_names_the_model_loaded_beside_its_sha256():
    from mlx_slm.classifier.decision_plan import DecisionPlan, task_methods
    from mlx_slm.text.decisions.settings import DecisionConfig
    from mlx_slm.weights.registry import ModelRef

    sec = {"questions": {"spam": {"type": "noul", "instructions": "Spam?"}}, "temperatures": {"spam": 1.5}}
    t = Task(model="/models/a", labels=(), system=None, template="{text}", weights_sha256="ab" * 32, decisions=sec)
    with pytest.raises(UserError) as e:  # a task's own check, without the name of the model loaded
        t.check_weights("cd" * 32)
    said = str(e.value)
    assert (
        "/models/a has cdcd" not in said
        and "abababababab... (/models/a)" in said
        and "the model loaded has cdcd" in said
    )

    class Loaded:
        path, weights_sha256 = None, "cd" * 32

    plan = DecisionPlan(ModelRef("/models/b"), task=t, methods=task_methods(t, DecisionConfig()))
    with pytest.raises(UserError) as e:  # decide, eval and serve load the plan: the model's name is said
        plan.loaded(Loaded())
    assert "the model loaded (/models/b) has cdcdcdcdcdcd" in str(e.value) and "/models/a has" not in str(e.value)


# ----------------------------------------------------------------------------- eval --predictions


def _gold_and_predictions(tmp_path, preds):
    g, p = tmp_path / "gold.jsonl", tmp_path / "preds.jsonl"
    g.write_text('{"id": 1, "text": "a", "label": "billing"}\n{"id": 2, "text": "b", "label": "tech"}\n')
    p.write_text("".join(json.dumps(x) + "\n" for x in preds))
    return g, p


def test_an_unknown_predicted_label_counts_wrong_and_is_named(tmp_path):
    g, p = _gold_and_predictions(
        tmp_path,
        [{"id": 1, "label": "sales", "probs": {"sales": 0.9, "billing": 0.1}},
         {"id": 2, "label": "tech", "probs": {"tech": 0.8, "billing": 0.2}}],
    )  # fmt: skip
    out = tmp_path / "rep.json"
    r = invoke(["eval", g, "--predictions", p, "--labels", "billing,tech", "--json", out])
    assert r.exit_code == 0, r.output
    assert "accuracy 50.00 %" in r.output and "not among the labels, counted wrong: 'sales' (1)" in r.output
    rep = json.loads(out.read_text())
    assert rep["accuracy"] == 0.5 and rep["unknown_labels"] == {"sales": 1} and "sales" in rep["labels"]


def test_a_label_without_probabilities_is_named_by_its_line(tmp_path):
    g, p = _gold_and_predictions(
        tmp_path, [{"id": 1, "label": "billing", "probs": {"billing": 1.0}}, {"id": 2, "label": "tech"}]
    )
    r = invoke(["eval", g, "--predictions", p, "--labels", "billing,tech"])
    refused_cleanly(r, "line 2", "'tech'", "probs")


# ----------------------------------------------------------------------------- the option a reader names


def test_decide_names_its_own_option_for_a_csv_without_a_state_column(tmp_path, tiny_qwen_mlx):
    inp, q = tmp_path / "s.csv", tmp_path / "q.json"
    inp.write_text("id,body\n1,hello\n")
    q.write_text('{"spam": {"type": "noul", "instructions": "Spam?"}}')
    r = invoke(["decide", inp, "--questions", q, "--model", tiny_qwen_mlx, "-q"])
    refused_cleanly(r, "--state-column")
    assert "--text-column" not in r.output


@pytest.mark.parametrize(
    "states, options", [((), TEXT_OPTIONS), (("state", "text"), STATE_OPTIONS), (("text",), TEXT_OPTIONS)]
)
def test_every_reader_names_the_commands_own_option(tmp_path, states, options):
    """decide's states (--state-field/--state-column), eval --decisions' (its --text-field/--text-column)
    and every other command's texts: each format's missing text names the option of the command run."""
    spec = ReadSpec(text_field=(states or ("text",))[0], states=states, text_options=options)
    csv, jsonl = tmp_path / "in.csv", tmp_path / "in.jsonl"
    csv.write_text("id,body\n1,hello\n")
    jsonl.write_text('{"id": 1, "body": "hello"}\n')
    with pytest.raises(UserError) as e:
        list(read_rows(str(csv), spec))
    assert options[1] in str(e.value) and ({*TEXT_OPTIONS, *STATE_OPTIONS} - {options[1]}).isdisjoint(
        str(e.value).split()
    )
    row = next(iter(read_rows(str(jsonl), spec)))
    assert options[0] in row.error and (STATE_OPTIONS if options == TEXT_OPTIONS else TEXT_OPTIONS)[0] not in row.error
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"id": [1], "body": ["hello"]}), tmp_path / "in.parquet")
    with pytest.raises(UserError) as e:
        list(read_rows(str(tmp_path / "in.parquet"), spec))
    assert f"use {options[0]}" in str(e.value)


# ----------------------------------------------------------------------------- little data


def test_lda_with_one_example_a_label_or_a_feature_constant_within_labels():
    """The shared covariance is singular there: the least-squares solve scikit-learn's lsqr solver uses
    answers (a feature that varies within no label weighs nothing), where `solve` raised LinAlgError."""
    from sklearn.discriminant_analysis import LinearDiscriminantAnalysis

    from mlx_slm.text.heads import fit_linear

    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(2, 16)), np.array([0, 1])  # one example a label: every feature constant within it
    mean, scale, coef, intercept = fit_linear(x, y, 2, "lda")
    assert np.isfinite(coef).all() and np.isfinite(intercept).all()
    y = np.repeat([0, 1, 2], 4)
    x = rng.normal(size=(12, 8))
    x[:, 3] = y * 2.0  # constant within every label
    mean, scale, coef, intercept = fit_linear(x, y, 3, "lda")
    z = (x - mean) / scale
    sk = LinearDiscriminantAnalysis(solver="lsqr", shrinkage="auto").fit(z, y)
    np.testing.assert_allclose(coef, sk.coef_, atol=1e-8)
    np.testing.assert_allclose(intercept, sk.intercept_, atol=1e-8)


def test_train_on_four_rows_with_two_folds(tmp_path, tiny_qwen_mlx):
    data = tmp_path / "t.jsonl"
    rows = [
        ("refund please", "billing"),
        ("charged twice", "billing"),
        ("app crashes", "tech"),
        ("login error", "tech"),
    ]
    data.write_text("".join(json.dumps({"text": t, "label": lab}) + "\n" for t, lab in rows))
    r = invoke(["train", data, "--model", tiny_qwen_mlx, "--folds", "2", "--save-task", tmp_path / "task.json", "-q"])
    assert r.exit_code == 0 and (tmp_path / "task.json").exists(), (r.exit_code, r.output, r.exception)


@pytest.mark.parametrize(
    "command, suffix, option, says",
    [
        ("classify", ".jsonl", "--id-column", "use --id-field"),
        ("classify", ".jsonl", "--text-column", "use --text-field"),
        ("classify", ".csv", "--text-field", "use --text-column"),
        ("classify", ".txt", "--id-field", "plain text only: drop it"),
        ("eval", ".jsonl", "--id-column", "use --id-field"),
        ("train", ".jsonl", "--text-column", "use --text-field"),
    ],
)
def test_a_field_option_no_input_format_reads_is_refused(tmp_path, tiny_qwen_mlx, command, suffix, option, says):
    inp = tmp_path / f"in{suffix}"
    rows = [
        ("refund please", "billing"),
        ("charged twice", "billing"),
        ("app crashes", "tech"),
        ("login error", "tech"),
    ]
    if suffix == ".jsonl":
        inp.write_text(
            "".join(json.dumps({"id": i, "text": t, "label": lab}) + "\n" for i, (t, lab) in enumerate(rows))
        )
    elif suffix == ".csv":
        inp.write_text("id,text,label\n" + "".join(f"{i},{t},{lab}\n" for i, (t, lab) in enumerate(rows)))
    else:
        inp.write_text("".join(t + "\n" for t, _ in rows))
    extra = ["--save-task", tmp_path / "t.json"] if command == "train" else ["--labels", "billing,tech"]
    r = invoke([command, inp, "--model", tiny_qwen_mlx, option, "x", *extra, "-q"])
    refused_cleanly(r, option, says)


def test_field_options_of_either_file_are_taken(tmp_path, tiny_qwen_mlx):
    """--text-column reads the CSV INPUT while --calibration-data is JSONL: taken (each file its own)."""
    inp, cal = tmp_path / "in.csv", tmp_path / "cal.jsonl"
    inp.write_text("id,body\n1,refund please\n2,app crashes\n")
    cal.write_text(
        "".join(json.dumps({"text": t, "label": lab}) + "\n" for t, lab in [("a", "billing"), ("b", "tech")] * 2)
    )
    r = invoke(["classify", inp, "--model", tiny_qwen_mlx, "--labels", "billing,tech", "--text-column", "body",
                "--calibrate", "fit", "--calibration-data", cal, "-q"])  # fmt: skip
    assert r.exit_code == 0, r.output
