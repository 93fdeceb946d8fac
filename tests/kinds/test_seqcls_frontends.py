"""A sequence-classification checkpoint through every front end but the service (issue 35,
"Everywhere"): eval, --calibrate batch|fit and --min-confidence (single-label; a multi-label
or one-output head refuses them, as eval does), --resume and --shard + merge in the label,
multi and score forms, --save-task then --task, a task refused on another model, the options
a model with its own head refuses, the scikit-learn estimator's method="model" and Ray
(`ClassifyBatch`, `classify --ray`). One aspect of the seqcls kind (`kinds/seqcls.py`; its own
tests are in test_seqcls.py); `mlx-slm parity` on such a model is in tests/parity/test_seqcls.py."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest
from click.testing import CliRunner

from mlx_slm.classifier.classifier import Classifier
from mlx_slm.cli import main
from mlx_slm.engine.engine import Engine
from mlx_slm.parity.reference import SeqClsReference
from tests.seqcls_cases import FORMS, GOLD, seqcls_rows, write_jsonl


def _items(rows) -> list:
    return [(r["text"], r["text_pair"]) if "text_pair" in r else r["text"] for r in rows if r["text"]]


def run(args, **kw):
    return CliRunner().invoke(main, args, catch_exceptions=False, **kw)


@pytest.fixture(scope="module")
def models(tiny_arch) -> dict:
    return {form: tiny_arch.seqcls_mlx(*case) for form, case in FORMS.items()}


# --------------------------------------------------------------------------- eval and calibration


def test_eval_of_a_single_label_head_with_pairs(models, tmp_path):
    rows = seqcls_rows(gold=True)
    inp = write_jsonl(tmp_path / "gold.jsonl", rows)
    r = run(["eval", inp, "--model", str(models["label"]), "--json", str(tmp_path / "rep.json"), "-q"])
    assert r.exit_code == 0, r.output
    rep = json.loads((tmp_path / "rep.json").read_text())
    preds = Classifier(Engine.load(str(models["label"]))).classify(_items(rows))
    gold = [r["label"] for r in rows if r["text"]]
    assert rep["n"] == len(gold) and rep["errors"] == 1
    assert rep["accuracy"] == pytest.approx(np.mean([p.label == g for p, g in zip(preds, gold)]))
    assert rep["labels"] == list(GOLD)


@pytest.mark.parametrize("form", ["multi", "score"])
def test_eval_refuses_a_multi_label_or_one_output_head(models, form, tmp_path):
    inp = write_jsonl(tmp_path / "gold.jsonl", seqcls_rows(gold=True))
    r = run(["eval", inp, "--model", str(models[form]), "-q"])
    assert r.exit_code == 2 and "eval scores one label per text against its gold label" in r.output
    assert ("multi-label head" if form == "multi" else "one-output head") in r.output
    out = tmp_path / "out.jsonl"
    assert (
        run(["classify", inp, "--model", str(models[form]), "-o", str(out), "-q", "--on-error", "skip"]).exit_code == 0
    )
    again = run(["eval", inp, "--predictions", str(out)])  # its output read back: refused too, saying why
    assert again.exit_code == 2 and "eval scores one label per text" in again.output


def test_batch_and_fit_calibration_and_min_confidence_on_a_single_label_head(models, tmp_path):
    rows = seqcls_rows(gold=True)
    inp = write_jsonl(tmp_path / "in.jsonl", rows)
    engine = Engine.load(str(models["label"]))
    raw = Classifier(engine).classify(_items(rows))
    want = Classifier(engine, calibration="batch", min_confidence=0.6).classify(_items(rows))
    r = run(["classify", inp, "--model", str(models["label"]), "--calibrate", "batch", "--min-confidence", "0.6", "-q",
             "--on-error", "skip"])  # fmt: skip
    assert r.exit_code == 0, r.output
    recs = [x for x in map(json.loads, r.stdout.splitlines()) if "error" not in x]
    assert any(x.get("abstained") for x in recs) and not all(x.get("abstained") for x in recs)
    for x, w, p in zip(recs, want, raw):
        assert x["calibration"] == "batch" and x.get("abstained", False) == w.abstained
        assert all(abs(x["probs"][k] - w.probs[k]) < 1e-5 and abs(x["raw_probs"][k] - p.probs[k]) < 1e-5 for k in GOLD)
    task = tmp_path / "task.json"
    labelled = write_jsonl(tmp_path / "labelled.jsonl", [r for r in rows if r["text"]])
    fit = run(["classify", inp, "--model", str(models["label"]), "--calibrate", "fit", "--calibration-data", labelled,
               "--save-task", str(task), "-q", "--on-error", "skip"])  # fmt: skip
    assert fit.exit_code == 0, fit.output
    saved = json.loads(task.read_text())
    assert saved["calibration"]["method"] == "fit" and saved["seqcls"]["labels"] == list(GOLD)
    again = run(["classify", inp, "--task", str(task), "-q", "--on-error", "skip"])
    assert again.stdout == fit.stdout and '"calibration": "fit"' in fit.stdout


@pytest.mark.parametrize("form", ["multi", "score"])
@pytest.mark.parametrize("option", [["--calibrate", "batch"], ["--min-confidence", "0.5"], ["--calibrate", "fit"]])
def test_calibration_is_refused_with_the_kinds_message(models, form, option, tmp_path):
    inp = write_jsonl(tmp_path / "in.jsonl", seqcls_rows(gold=True))
    if option[1] == "fit":
        option = [*option, "--calibration-data", inp]
    out = tmp_path / "out.jsonl"
    r = run(["classify", inp, "--model", str(models[form]), "-o", str(out), *option])
    assert r.exit_code == 2 and "apply to a single-label head" in r.output
    assert ("(--threshold sets which labels are its answer)" in r.output) == (form == "multi")
    assert not out.exists() and list(tmp_path.iterdir()) == [tmp_path / "in.jsonl"]  # nothing written


# --------------------------------------------------------------------------- resume, shards and merge


def _cut(src, dst, rows: int) -> None:
    """`dst`: `src`'s first `rows` rows (and its header) and half a row, with its manifest marked
    unfinished: what a run killed mid-write leaves."""
    lines = open(src, "rb").read().splitlines(True)
    dst.write_bytes(b"".join(lines[:rows]) + lines[rows][:9])
    m = json.loads(open(f"{src}.mlx-slm.json").read())
    m["complete"] = False
    m.pop("rows", None)
    (dst.parent / f"{dst.name}.mlx-slm.json").write_text(json.dumps(m))


@pytest.mark.parametrize("form", ["label", "multi", "score"])
@pytest.mark.parametrize("ext", ["jsonl", "csv"])
def test_resume_and_shards_read_back_every_form(models, form, ext, tmp_path):
    inp = write_jsonl(tmp_path / "in.jsonl", seqcls_rows())
    model = ["--model", str(models[form]), "-q", "--window", "8", "--on-error", "skip"]
    full = tmp_path / f"full.{ext}"
    assert run(["classify", inp, *model, "-o", str(full)]).exit_code == 0
    manifest = json.loads((tmp_path / f"full.{ext}.mlx-slm.json").read_text())["settings"]
    assert manifest["form"] == form and manifest["seqcls"]["function"] in ("softmax", "sigmoid")
    part = tmp_path / f"part.{ext}"
    _cut(full, part, 13)
    r = run(["classify", inp, *model, "-o", str(part), "--resume"])
    assert r.exit_code == 0, r.output
    assert part.read_bytes() == full.read_bytes()
    parts = [str(tmp_path / f"shard{i}.{ext}") for i in range(3)]
    for i, p in enumerate(parts):
        assert run(["classify", inp, *model, "-o", p, "--shard", f"{i}/3"]).exit_code == 0
    merged = tmp_path / f"merged.{ext}"
    r = run(["merge", *parts, "-o", str(merged)])
    assert r.exit_code == 0, r.output
    assert merged.read_bytes() == full.read_bytes()
    if ext == "jsonl":  # Parquet: the parts merged into one table, the score and logit as float64
        import pyarrow.parquet as pq

        assert run(["merge", *parts, "-o", str(tmp_path / "m.parquet")]).exit_code == 0
        table = pq.read_table(str(tmp_path / "m.parquet"))
        recs = [json.loads(x) for x in full.read_text().splitlines()]
        assert table.num_rows == len(recs)
        if form == "score":
            assert str(table.schema.field("score").type) == "double"
            got = table.column("score").to_pylist()
            assert all(g == x.get("score") for g, x in zip(got, recs))


def test_resume_and_merge_refuse_another_threshold(models, tmp_path):
    inp = write_jsonl(tmp_path / "in.jsonl", seqcls_rows())
    model = ["--model", str(models["multi"]), "-q", "--window", "8", "--on-error", "skip"]
    full = tmp_path / "full.jsonl"
    assert run(["classify", inp, *model, "-o", str(full)]).exit_code == 0
    _cut(full, tmp_path / "part.jsonl", 13)
    r = run(["classify", inp, *model, "-o", str(tmp_path / "part.jsonl"), "--resume", "--threshold", "0.7"])
    assert r.exit_code == 2 and "other settings" in r.output and '"threshold": 0.7' in r.output
    a, b = str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")
    assert run(["classify", inp, *model, "-o", a, "--shard", "0/2"]).exit_code == 0
    assert run(["classify", inp, *model, "-o", b, "--shard", "1/2", "--threshold", "0.7"]).exit_code == 0
    m = run(["merge", a, b, "-o", str(tmp_path / "m.jsonl")])
    assert m.exit_code == 2 and "other settings" in m.output


# --------------------------------------------------------------------------- task files and options


@pytest.mark.parametrize("form", ["label", "multi", "score"])
def test_a_task_round_trips_and_is_refused_on_another_model(models, tiny_arch, form, tmp_path):
    inp = write_jsonl(tmp_path / "in.jsonl", seqcls_rows())
    task = tmp_path / "task.json"
    extra = ["--threshold", "0.3"] if form == "multi" else []
    first = run(["classify", inp, "--model", str(models[form]), *extra, "--save-task", str(task), "-q"])
    saved = json.loads(task.read_text())
    assert saved["seqcls"]["threshold"] == (0.3 if form == "multi" else 0.5)
    assert saved["labels"] == saved["seqcls"]["labels"] and "rerank" not in saved
    again = run(["classify", inp, "--task", str(task), "-q"])
    assert first.exit_code == again.exit_code == 1 and again.stdout == first.stdout  # row 7 is an error row
    other = models["label" if form != "label" else "multi"]
    for model, msg in [(other, "the task was saved for a head"), (tiny_arch.mlx("qwen2"), "causal LM without one")]:
        out = tmp_path / "never.jsonl"
        r = CliRunner().invoke(main, ["classify", inp, "--task", str(task), "--model", str(model), "-o", str(out)])
        assert r.exit_code == 2 and msg in r.output and "use the model the task was saved with" in r.output
        assert not out.exists()


def test_options_a_model_with_its_own_head_refuses(models, tmp_path):
    inp = write_jsonl(tmp_path / "in.jsonl", seqcls_rows()[:3])
    questions = tmp_path / "q.jsonl"
    questions.write_text(json.dumps({"name": "team", "question": "Which team?", "labels": ["a", "b"]}) + "\n")
    own = "['negative', 'neutral', 'positive']"
    for extra, msg in [
        (
            ["--labels", "a,b"],
            f"has its own labels {own}; the labels of --labels are ['a', 'b']: drop --labels",
        ),
        (["--questions", str(questions)], "(a 3-label score head: negative, neutral, positive) and has no LM head"),
        (["--threshold", "0.3"], "sets which labels a multi-label sequence classifier answers"),
        (["--scoring", "first-token"], "scores its own labels with its head: drop it"),
    ]:
        out = tmp_path / "never.jsonl"
        r = CliRunner().invoke(main, ["classify", inp, "--model", str(models["label"]), "-o", str(out), *extra])
        assert r.exit_code == 2 and msg in r.output, r.output
        assert not out.exists()
    ok = run(["classify", inp, "--model", str(models["label"]), "--labels", "negative,neutral,positive", "-q"])
    assert ok.exit_code == 0  # its own labels named as they are: accepted


# --------------------------------------------------------------------------- scikit-learn


def test_sklearn_method_model_uses_the_head_as_it_is(models, tiny_arch, tmp_path):
    pytest.importorskip("sklearn")
    from sklearn.model_selection import cross_val_score

    from mlx_slm.sklearn import SLMClassifier

    rows = [r for r in seqcls_rows(gold=True) if r["text"]]
    X, y = [r["text"] for r in rows], [r["label"] for r in rows]
    ref = SeqClsReference(tiny_arch.seqcls_hf(*FORMS["label"]), threads=1)
    want = ref.classify(X)[2]  # (n, 3) in id order
    est = SLMClassifier(str(models["label"]), method="model").fit(X)  # no y needed: nothing to train
    assert list(est.classes_) == list(GOLD)
    assert np.abs(est.predict_proba(X) - want).max() <= 1e-4
    assert list(est.predict(X)) == [GOLD[i] for i in want.argmax(1)]
    order = ["positive", "negative", "neutral"]
    est2 = SLMClassifier(str(models["label"]), method="model", labels=order).fit(X, y)
    assert list(est2.classes_) == order
    assert np.abs(est2.predict_proba(X) - want[:, [2, 0, 1]]).max() <= 1e-4
    assert est2.score(X, y) == pytest.approx(np.mean(est2.predict(X) == np.array(y)))
    back = pickle.loads(pickle.dumps(est2))
    assert np.array_equal(back.predict_proba(X), est2.predict_proba(X)) and list(back.classes_) == order
    est2.to_task(tmp_path / "task.json")
    loaded = SLMClassifier.from_task(tmp_path / "task.json")
    assert loaded.method == "model" and loaded.system is None and loaded.template is None
    assert np.abs(loaded.predict_proba(X) - want).max() <= 1e-4
    fit = SLMClassifier(str(models["label"]), method="model", calibration="fit").fit(X, y)
    assert fit.task_.calibration.fitted and not np.allclose(fit.predict_proba(X), want, atol=1e-3)
    assert len(cross_val_score(SLMClassifier(str(models["label"]), method="model"), X, y, cv=2)) == 2
    for model, kw, msg in [
        (models["multi"], {}, "is a multi-label head"),
        (models["score"], {}, "is a one-output head"),
        (tiny_arch.mlx("qwen2"), {}, "is a causal LM"),
        (models["label"], {"labels": ["a", "b", "c"]}, "the model's own labels are"),
        (models["label"], {"template": "T: {text}"}, "leave system, template and examples unset"),
    ]:
        with pytest.raises(ValueError, match=msg):
            SLMClassifier(str(model), method="model", **kw).fit(X)
    with pytest.raises(ValueError, match="y row 0: label 'billing' is not one of the model's own labels"):
        SLMClassifier(str(models["label"]), method="model").fit(X, ["billing"] * len(X))


# --------------------------------------------------------------------------- Ray


@pytest.mark.parametrize("form", ["label", "multi", "score"])
def test_ray_classify_batch_writes_each_form_with_pairs(models, tiny_arch, form):
    pa = pytest.importorskip("pyarrow")
    pytest.importorskip("ray")
    import mlx_slm.ray as mray

    rows = seqcls_rows(12)
    table = pa.table({"id": [r["id"] for r in rows], "text": [r["text"] or None for r in rows],
                      "text_pair": [r.get("text_pair") for r in rows]})  # fmt: skip
    out = mray.ClassifyBatch(None, {"model": str(models[form])})(table).to_pylist()
    ref = SeqClsReference(tiny_arch.seqcls_hf(*FORMS[form]), threads=1)
    items = _items(rows)
    _, logits, probs = ref.classify([x[0] if isinstance(x, tuple) else x for x in items],
                                    [x[1] if isinstance(x, tuple) else None for x in items])  # fmt: skip
    good = [r for r in out if r["error"] is None]
    assert [r["id"] for r in good] == [r["id"] for r in rows if r["text"]] and out[7]["error"]
    for r, lg, pr in zip(good, logits, probs):
        if form == "label":
            assert set(r) >= {"label", "probs"} and r["label"] == ref.labels[int(pr.argmax())]
            assert max(abs(r["probs"][k] - p) for k, p in zip(ref.labels, pr)) <= 1e-4
        elif form == "multi":
            assert "label" not in r and r["labels"] == [k for k, p in zip(ref.labels, pr) if p >= 0.5]
        else:
            assert "probs" not in r and abs(r["score"] - pr[0]) <= 1e-4 and abs(r["logit"] - lg[0]) <= 1e-4


@pytest.mark.slow
def test_classify_ray_with_pairs_equals_the_local_run(models, tmp_path):
    pytest.importorskip("ray")
    import ray

    import mlx_slm.ray as mray

    mray.init(num_cpus=2)
    try:
        inp = write_jsonl(tmp_path / "in.jsonl", seqcls_rows())
        for form in ("multi", "score"):
            local = run(["classify", inp, "--model", str(models[form]), "-q", "--on-error", "skip"])
            on_ray = run(["classify", inp, "--model", str(models[form]), "-q", "--on-error", "skip", "--ray"])
            assert on_ray.exit_code == 0, on_ray.output
            a = [json.loads(x) for x in local.stdout.splitlines()]
            b = [json.loads(x) for x in on_ray.stdout.splitlines()]
            assert [x.keys() for x in a] == [x.keys() for x in b]
            for x, z in zip(a, b):
                assert x.get("labels") == z.get("labels") and x.get("error") == z.get("error")
                for k in ("score", "logit"):
                    assert abs(x.get(k, 0) - z.get(k, 0)) <= 1e-5
                assert all(abs(v - z["probs"][k]) <= 1e-5 for k, v in (x.get("probs") or {}).items())
    finally:
        ray.shutdown()
