"""No NaN task, no NaN probability (issue 40, item 3).

A fine-tune that diverged (float16, `--lr 1`) was saved as a good task ("kept epoch 1", NaN
losses); `classify` then wrote `"probs": {"account": NaN}` (not JSON) and `export` wrote NaN
weights. Now a run whose loss reaches NaN or infinity stops (exit 2, naming the epoch and the
fix) and saves nothing; adapters holding non-finite weights are refused at load (classify,
export); and a probability that is not finite, whatever made it, is an error row in every
front end (`pipeline.finite`), never a number in the output.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from mlx_slm.cli import main
from mlx_slm.text.workload import tickets

ROWS = tickets(30)


def run(args, **kw):
    return CliRunner().invoke(main, [str(a) for a in args], **kw)


def _strict(text: str) -> list[dict]:
    """JSON lines as a strict parser reads them (NaN and Infinity are not JSON)."""

    def refuse(c):
        raise ValueError(f"{c} is not JSON")

    return [json.loads(x, parse_constant=refuse) for x in text.splitlines() if x.strip()]


def _data(tmp_path: Path) -> Path:
    p = tmp_path / "train.jsonl"
    p.write_text("".join(json.dumps({"text": t, "label": g}) + "\n" for t, g in ROWS))
    return p


def test_a_diverging_fine_tune_stops_naming_the_epoch_and_the_fix_and_saves_nothing(tiny_qwen_mlx, tmp_path):
    data = _data(tmp_path)
    r = run(["train", data, "--finetune", "lora", "--model", tiny_qwen_mlx, "--dtype", "float16", "--lr", "1",
             "--head-lr", "1", "--epochs", "3", "--adapt-layers", "2", "--save-task", tmp_path / "t.json", "-q"])  # fmt: skip
    assert r.exit_code == 2, r.output
    assert re.search(r"fine-tuning diverged in epoch \d", r.output) and "nothing is saved" in r.output
    assert "--lr" in r.output and "--dtype float32" in r.output and "Traceback" not in r.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.jsonl"]


def test_the_python_api_refuses_a_diverging_run_too(tiny_qwen_mlx):
    from mlx_slm.classifier.plan import Plan
    from mlx_slm.engine.engine import Engine
    from mlx_slm.jobs.finetune import finetune_texts
    from mlx_slm.weights.adapters import FinetuneError
    from mlx_slm.weights.finetune import FinetuneSettings

    engine = Engine.load(str(tiny_qwen_mlx), dtype="float16")
    s = FinetuneSettings(layers=2, epochs=2, learning_rate=1.0, head_learning_rate=1.0, val_fraction=0.2)
    with pytest.raises(FinetuneError, match=r"diverged in epoch \d+: the .* is (nan|inf)"):
        plan = Plan.of(("account", "billing", "technical"), None, "Text: {text}\nLabel:")
        finetune_texts(engine, plan, [t for t, _ in ROWS], [g for _, g in ROWS], s)


@pytest.fixture(scope="module")
def nan_task(tmp_path_factory, engine):
    """A fine-tuned task whose score head holds a NaN, saved as a diverged run would have been."""
    from dataclasses import replace

    import mlx.core as mx

    from mlx_slm.classifier.plan import Plan
    from mlx_slm.classifier.task import Task
    from mlx_slm.jobs.finetune import finetune_texts
    from mlx_slm.weights.convert import versions
    from mlx_slm.weights.finetune import FinetuneSettings

    d = tmp_path_factory.mktemp("nan-task")
    labels = ("account", "billing", "technical")
    s = FinetuneSettings(layers=1, epochs=1, val_fraction=0.0, learning_rate=1e-3)
    plan = Plan.of(labels, None, "T: {text}\nL:")
    tuned = finetune_texts(engine, plan, [t for t, _ in ROWS], [g for _, g in ROWS], s)
    head = np.array(tuned.head)
    head[0, 0] = np.nan
    bad = replace(tuned, head=mx.array(head))
    side = d / "t.adapters.safetensors"  # saved as the old `save_finetuned` did (no check of its own)
    sha = bad.save(side)
    task = Task(model=str(engine.path), labels=labels, system=None, template="T: {text}\nL:",
                weights_sha256=engine.weights_sha256, versions=versions())  # fmt: skip
    d_task = task.to_dict()
    d_task["finetune"] = {"adapters": side.name, "sha256": sha, "fused": False, "objective": "score",
                          "layers": list(bad.lora.layers), "rank": bad.lora.rank}  # fmt: skip
    (d / "t.json").write_text(json.dumps(d_task))
    return d / "t.json", bad


def test_adapters_holding_non_finite_weights_are_refused_at_load(nan_task, engine, tmp_path):
    from mlx_slm.classifier.classifier import Classifier
    from mlx_slm.weights.adapters import FineTuned, FinetuneError

    task, bad = nan_task
    with pytest.raises(FinetuneError, match=r"non-finite weights \(NaN or infinity\) in score.weight"):
        FineTuned.from_bytes(bad.to_bytes())
    with pytest.raises(FinetuneError, match="non-finite weights"):  # in memory (the estimator's) too
        Classifier(engine, list(bad.labels), None, "T: {text}\nL:", finetuned=bad)
    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(json.dumps({"text": t}) + "\n" for t, _ in ROWS[:4]))
    r = run(["classify", inp, "--task", task, "-o", tmp_path / "o.jsonl", "-q"])
    assert r.exit_code == 2 and "non-finite weights" in r.output and "fine-tune again" in r.output, r.output
    assert not (tmp_path / "o.jsonl").exists()
    r = run(["export", task, "-o", tmp_path / "exported", "-q"])
    assert r.exit_code == 2 and "non-finite weights" in r.output, r.output
    assert not (tmp_path / "exported").exists()


def test_export_refuses_merged_weights_that_overflow_its_dtype(nan_task, engine, tmp_path):
    """Finite adapters whose merged weights do not fit float16: refused, nothing written."""
    from dataclasses import replace

    from mlx_slm.weights.adapters import FinetuneError
    from mlx_slm.weights.export import export

    _, bad = nan_task
    huge = replace(bad, head=bad.head * 0 + 1e6, adapters={k: v * 0 + 1e3 for k, v in bad.adapters.items()})
    with pytest.raises(FinetuneError, match="non-finite values .* as float16: nothing is written; export as float32"):
        export(huge, engine.model, engine.tokenizer, engine.path, tmp_path / "out", dtype="float16")
    assert not (tmp_path / "out").exists()


@pytest.fixture(scope="module")
def nan_seqcls(tiny_arch, tmp_path_factory) -> Path:
    """The tiny sequence classifier with a NaN in its score head (weights that answer NaN)."""
    import shutil

    import mlx.core as mx

    out = tmp_path_factory.mktemp("nan-seqcls") / "m"
    shutil.copytree(tiny_arch.seqcls_mlx("qwen2", 3), out)
    w = mx.load(str(out / "model.safetensors"))
    score = np.array(w["score.weight"])
    score[1, :] = np.inf
    w["score.weight"] = mx.array(score)
    mx.save_safetensors(str(out / "model.safetensors"), w, metadata={"format": "mlx"})
    (out / "conversion.json").unlink()  # its weights' hash changed: a plain MLX folder
    return out


def test_a_non_finite_probability_is_an_error_row_never_a_number(nan_seqcls, tmp_path):
    from mlx_slm.classifier.classifier import Classifier

    clf = Classifier.load(str(nan_seqcls))
    preds = clf.classify(["hello there", "my bill is wrong"])
    assert all(p.error and "non-finite probability" in p.error for p in preds)
    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, (t, _) in enumerate(ROWS[:5])))
    out = tmp_path / "o.jsonl"
    r = run(["classify", inp, "--model", nan_seqcls, "-o", out, "--on-error", "skip", "-q"])
    assert r.exit_code == 0, r.output
    rows = _strict(out.read_text())
    assert len(rows) == 5 and all("non-finite probability" in x["error"] for x in rows)
    assert not any(isinstance(v, float) and not math.isfinite(v) for x in rows for v in x.values())


def test_serve_answers_a_non_finite_probability_as_an_error_in_json(nan_seqcls):
    httpx = pytest.importorskip("httpx")
    pytest.importorskip("uvicorn")
    from mlx_slm.server import ServeOptions, Service, classifier_loader
    from tests.server.test_app import ThreadServer

    s = ThreadServer(Service(classifier_loader(str(nan_seqcls)), ServeOptions(max_wait_ms=5))).start()
    try:
        r = httpx.post(s.url + "/v1/classify", json={"texts": ["hello there", "my bill"]}, timeout=60)
    finally:
        s.stop()
    body = _strict(r.text)[0]  # strict JSON: no NaN or Infinity in it
    assert all("non-finite probability" in str(x.get("error")) for x in body["results"]), body


def test_the_progress_bar_names_the_epoch_of_its_validation_figures(tiny_qwen_mlx, capsys):
    """The bar showed the previous epoch's val_acc as if it were the current one's."""
    from mlx_slm.classifier.plan import Plan
    from mlx_slm.engine.engine import Engine
    from mlx_slm.jobs.finetune import finetune_texts, progress_bar
    from mlx_slm.weights.finetune import FinetuneSettings

    seen = []
    update, close = progress_bar(False)

    def both(p):
        seen.append(p)
        update(p)

    engine = Engine.load(str(tiny_qwen_mlx))
    s = FinetuneSettings(layers=1, epochs=2, learning_rate=1e-3, val_fraction=0.2, patience=5)
    plan = Plan.of(("account", "billing", "technical"), None, "T: {text}\nL:")
    finetune_texts(engine, plan, [t for t, _ in ROWS], [g for _, g in ROWS], s, progress=both)
    close()
    steps2 = [p for p in seen if p.phase == "train" and p.epoch == 2 and p.val_epoch != 2]
    assert steps2 and all(p.val_epoch == 1 and p.val_accuracy is not None for p in steps2)
    ends = [p for p in seen if p.phase == "train" and p.val_epoch == p.epoch]
    assert [p.epoch for p in ends] == [1, 2]  # each epoch's own figures as it ends
    err = capsys.readouterr().err
    assert "(epoch 1)" in err and "(epoch 2)" in err
