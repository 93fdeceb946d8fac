"""The fine-tuned kind (`kinds/finetune.py`) on a tiny random Qwen2, in every front end but the
CLI's (tests/cli/test_train_finetune.py): unfused and fused give the same probabilities, the Python
API's task round trip, `serve --task` (our /v1/classify, TEI's /predict, vLLM's /classify; a
request with other labels or another prompt is scored zero-shot, min_confidence abstains),
Ray (`ClassifyBatch` on a task's dict, from another working folder; `classify --ray --task`),
and the scikit-learn estimator's method="finetune" (pickles hold the adapters; to_task and
from_task; seeded fits equal; its refusals)."""

from __future__ import annotations

import json
import pickle
from types import SimpleNamespace

import numpy as np
import pytest

from mlx_slm.classifier.classifier import Classifier
from mlx_slm.classifier.task import Task
from mlx_slm.engine.engine import Engine
from mlx_slm.text.workload import tickets

ROWS = tickets(60)
X = [t for t, _ in ROWS]
Y = [g for _, g in ROWS]
TEXTS = X[:16] + ["x", "refund status please"]


def _probs(preds, labels) -> np.ndarray:
    return np.array([[p.probs[lab] for lab in labels] for p in preds])


@pytest.fixture(scope="module")
def ft(tmp_path_factory, tiny_qwen_mlx):
    """A task fine-tuned by `tuning.run_finetune` (what the CLI runs), and its classifier's answers."""
    from mlx_slm.classifier.plan import Plan
    from mlx_slm.jobs.finetune import run_finetune
    from mlx_slm.jobs.train import TrainRun
    from mlx_slm.weights.finetune import FinetuneSettings
    from mlx_slm.weights.registry import ModelRef

    d = tmp_path_factory.mktemp("ft-kind")
    data = d / "train.jsonl"
    data.write_text("".join(json.dumps({"text": t, "label": g}) + "\n" for t, g in ROWS))
    s = FinetuneSettings(layers=2, epochs=3, learning_rate=1e-3, head_learning_rate=1e-2, val_fraction=0.2)
    plan = Plan(model=ModelRef(str(tiny_qwen_mlx)), save_task=str(d / "task.json"))
    task, tuned = run_finetune(TrainRun(str(data), plan), s)
    engine = Engine.load(str(tiny_qwen_mlx))
    clf = Classifier.from_task(d / "task.json", engine=engine)
    return SimpleNamespace(d=d, path=d / "task.json", task=task, tuned=tuned, engine=engine, clf=clf,
                           want=_probs(clf.classify(TEXTS), tuned.labels))  # fmt: skip


def test_unfused_and_fused_give_the_same_probabilities(ft, tmp_path):
    """The task's "fused": true runs the adapters merged into the weights: the same
    probabilities (1e-5); the base model's weights are left as they were."""
    before = np.array(ft.engine.model.layers[-1].self_attn.q_proj.weight)
    t = json.loads(ft.path.read_text())
    t["finetune"]["fused"] = True
    t["finetune"]["adapters"] = str(ft.d / t["finetune"]["adapters"])
    fused = tmp_path / "fused.json"
    fused.write_text(json.dumps(t))
    clf = Classifier.from_task(fused, engine=ft.engine)
    assert clf.spec.fused and clf.mode == "finetune (score)"
    assert np.abs(_probs(clf.classify(TEXTS), ft.tuned.labels) - ft.want).max() < 1e-5
    assert np.array_equal(np.array(ft.engine.model.layers[-1].self_attn.q_proj.weight), before)


def test_the_python_api_round_trip(ft):
    """Classifier.from_task, a Classifier made from the FineTuned in memory, and the task read
    back from its file give the same answers; the task file's kind section is the adapters'."""
    mem = Classifier(ft.engine, ft.tuned.labels, ft.task.system, ft.task.template, finetuned=ft.tuned)
    assert np.abs(_probs(mem.classify(TEXTS), ft.tuned.labels) - ft.want).max() < 1e-6
    back = Task.load(ft.path)
    assert back.kind.name == "finetune" and back.kind.tuned.best_epoch == ft.tuned.best_epoch
    side = json.loads(ft.path.read_text())["finetune"]["adapters"]
    assert side.startswith("task.json.") and side.endswith(".adapters.safetensors")
    assert back.to_dict()["finetune"]["adapters"] == str(ft.d.resolve() / side)
    again = Classifier.from_task(back, engine=ft.engine)
    assert np.abs(_probs(again.classify(TEXTS), ft.tuned.labels) - ft.want).max() < 1e-6
    with pytest.raises(Exception, match="calibration does not apply to a fine-tuned classifier"):
        Classifier.from_task(back, engine=ft.engine, calibration="batch")


# --------------------------------------------------------------------------- serve


@pytest.fixture(scope="module")
def served(ft):
    pytest.importorskip("starlette")
    pytest.importorskip("uvicorn")
    httpx = pytest.importorskip("httpx")
    from mlx_slm.jobs import plan as plans
    from mlx_slm.jobs.plan import TaskOptions
    from mlx_slm.server import Loaded, ServeOptions, Service
    from tests.server.test_app import ThreadServer

    plan = plans.resolve(TaskOptions(task_file=str(ft.path), given=frozenset({"task_file"})), lambda _m: None)

    def load():  # as `mlx-slm serve --task` loads
        p, clf = plans.load_fitted(plan, lambda _m: None)
        return Loaded(clf, p.calibration, p.min_confidence, p.warmup, model=p.model.name,
                      weights_sha256=clf.engine.weights_sha256)  # fmt: skip

    srv = ThreadServer(Service(load, ServeOptions(max_wait_ms=5))).start()
    yield srv, httpx
    srv.stop()


def test_serve_task_answers_with_the_fine_tuned_classifier_on_every_route(ft, served):
    srv, httpx = served
    labels = list(ft.tuned.labels)
    r = httpx.post(srv.url + "/v1/classify", json={"texts": TEXTS}, timeout=60).json()
    assert r["scoring"] == "finetune"
    got = np.array([[x["probs"][lab] for lab in labels] for x in r["results"]])
    assert np.abs(got - ft.want).max() < 1e-5 and [x["label"] for x in r["results"]] == [labels[k] for k in
                                                                                        ft.want.argmax(1)]  # fmt: skip
    tei = httpx.post(srv.url + "/predict", json={"inputs": TEXTS}, timeout=60).json()
    for row, want in zip(tei, ft.want):
        assert [d["label"] for d in row] == [labels[k] for k in np.argsort(-want, kind="stable")]
        assert all(abs(d["score"] - want[labels.index(d["label"])]) < 1e-5 for d in row)
    v = httpx.post(srv.url + "/classify", json={"model": "m", "input": TEXTS}, timeout=60).json()
    assert np.abs(np.array([row["probs"] for row in v["data"]]) - ft.want).max() < 1e-5
    info = httpx.get(srv.url + "/v1/model").json()["task"]
    assert info["scoring"] == "finetune (score)" and info["finetune"]["sha256"] == ft.task.finetune["sha256"]


def test_serve_other_labels_or_another_prompt_are_scored_zero_shot(ft, served):
    """A request with its own labels, or its own system message, is not what the adapters were
    trained for: it is scored zero-shot on the base model (the labels kind), as classify would."""
    srv, httpx = served
    other = httpx.post(srv.url + "/v1/classify", json={"texts": TEXTS[:4], "labels": ["spam", "ham"]}).json()
    assert other["scoring"] == "labels"
    zs = Classifier(ft.engine, ["spam", "ham"], ft.task.system, ft.task.template).classify(TEXTS[:4])
    assert np.abs(np.array([[x["probs"][k] for k in ("spam", "ham")] for x in other["results"]])
                  - _probs(zs, ("spam", "ham"))).max() < 1e-5  # fmt: skip
    own = httpx.post(srv.url + "/v1/classify", json={"texts": TEXTS[:4], "system": "Be brief."}).json()
    assert own["scoring"] == "labels"
    zs = Classifier(ft.engine, ft.tuned.labels, "Be brief.", ft.task.template).classify(TEXTS[:4])
    assert np.abs(np.array([[x["probs"][k] for k in ft.tuned.labels] for x in own["results"]])
                  - _probs(zs, ft.tuned.labels)).max() < 1e-5  # fmt: skip
    same = httpx.post(srv.url + "/v1/classify", json={"texts": TEXTS[:4], "labels": list(ft.tuned.labels)}).json()
    assert same["scoring"] == "finetune"


def test_serve_min_confidence_abstains_on_the_fine_tuned_probabilities(ft, served):
    srv, httpx = served
    cut = float(np.median(ft.want.max(axis=1)))
    res = httpx.post(srv.url + "/v1/classify", json={"texts": TEXTS, "min_confidence": cut}).json()["results"]
    assert [x.get("abstained", False) for x in res] == [bool(p < cut) for p in ft.want.max(axis=1)]
    bad = httpx.post(srv.url + "/v1/classify", json={"texts": TEXTS, "labels": ["a", "b"], "min_confidence": 2})
    assert bad.status_code == 422


# --------------------------------------------------------------------------- Ray


def test_ray_classify_batch_takes_the_tasks_dict_from_any_working_folder(ft, tmp_path, monkeypatch):
    """`ClassifyBatch(task=Task.to_dict())` has no task file to be relative to: the dict names the
    adapters by their absolute path, so a worker in another folder reads them (sha256 checked)."""
    pa = pytest.importorskip("pyarrow")
    pytest.importorskip("ray")
    import mlx_slm.ray as mray

    d = Task.load(ft.path).to_dict()
    monkeypatch.chdir(tmp_path)
    table = pa.table({"id": list(range(len(TEXTS) + 1)), "text": TEXTS + [None]})
    out = mray.ClassifyBatch(d, None)(table).to_pylist()
    assert out[-1]["error"] and all(r["error"] is None for r in out[:-1])
    got = np.array([[r["probs"][lab] for lab in ft.tuned.labels] for r in out[:-1]])
    assert np.abs(got - ft.want).max() < 1e-5
    gone = {**d, "finetune": {**d["finetune"], "adapters": str(tmp_path / "nowhere.safetensors")}}
    with pytest.raises(Exception, match="is missing: put it back beside the task"):
        mray.ClassifyBatch(gone, None)


@pytest.mark.slow
def test_classify_ray_task_equals_the_local_run(ft, tmp_path):
    pytest.importorskip("ray")
    import ray
    from click.testing import CliRunner

    import mlx_slm.ray as mray
    from mlx_slm.cli import main

    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in enumerate(TEXTS)))
    mray.init(num_cpus=2)
    try:
        local = CliRunner().invoke(main, ["classify", str(inp), "--task", str(ft.path), "-q"])
        on_ray = CliRunner().invoke(main, ["classify", str(inp), "--task", str(ft.path), "-q", "--ray"])
    finally:
        ray.shutdown()
    assert local.exit_code == on_ray.exit_code == 0, on_ray.output
    a = [json.loads(x) for x in local.stdout.splitlines()]
    b = [json.loads(x) for x in on_ray.stdout.splitlines()]
    assert [x["label"] for x in a] == [x["label"] for x in b]
    assert max(abs(x["probs"][k] - y["probs"][k]) for x, y in zip(a, b) for k in x["probs"]) < 1e-5


# --------------------------------------------------------------------------- scikit-learn


@pytest.fixture(scope="module")
def est(tiny_qwen_mlx):
    pytest.importorskip("sklearn")
    from mlx_slm.sklearn import SLMClassifier

    e = SLMClassifier(model=str(tiny_qwen_mlx), method="finetune", epochs=3, learning_rate=1e-3,
                      head_learning_rate=1e-2, adapt_layers=2, val_fraction=0.2)  # fmt: skip
    return e.fit(X, Y)


def test_estimator_finetune_predicts_with_the_fine_tuned_kind(est):
    """predict_proba is the fine-tuned classifier's (the task it holds), columns in classes_ order."""
    assert list(est.classes_) == ["account", "billing", "technical"] and est.task_.kind.name == "finetune"
    p = est.predict_proba(TEXTS)
    clf = Classifier.from_task(est.task_)
    assert np.abs(p - _probs(clf.classify(TEXTS), est.classes_)).max() < 1e-6
    assert list(est.predict(TEXTS)) == [est.classes_[k] for k in p.argmax(1)]
    assert est.task_.kind.tuned.settings["layers"] == 2 and est.task_.kind.tuned.settings["epochs"] == 3


def test_estimator_finetune_pickles_with_its_adapters_and_round_trips_a_task(est, tmp_path):
    """The pickle holds the adapters (no file beside it); to_task writes the task and its adapters
    file; from_task reads them back with the settings they were trained with; a clone fitted
    again with the same seed gives the same probabilities."""
    from sklearn.base import clone

    from mlx_slm.sklearn import SLMClassifier

    p = est.predict_proba(TEXTS)
    blob = pickle.dumps(est)
    assert 20_000 < len(blob) < 1_000_000  # the tiny model's adapters (2 blocks, rank 8) and head, not its weights
    back = pickle.loads(blob)
    assert np.array_equal(back.predict_proba(TEXTS), p)
    est.to_task(tmp_path / "task.json")
    side = json.loads((tmp_path / "task.json").read_text())["finetune"]["adapters"]
    assert sorted(x.name for x in tmp_path.iterdir()) == sorted([side, "task.json"])
    assert side.startswith("task.json.") and side.endswith(".adapters.safetensors")
    loaded = SLMClassifier.from_task(tmp_path / "task.json")
    assert loaded.method == "finetune" and loaded.learning_rate == 1e-3 and loaded.adapt_layers == 2
    assert np.abs(loaded.predict_proba(TEXTS) - p).max() < 1e-6
    assert np.abs(pickle.loads(pickle.dumps(loaded)).predict_proba(TEXTS) - p).max() < 1e-6
    assert np.array_equal(clone(est).fit(X, Y).predict_proba(TEXTS), p)


@pytest.mark.parametrize(
    "params, y, match",
    [
        (dict(calibration="fit"), None, "a fine-tuned model's probabilities are fitted"),
        (dict(examples=[("a", "billing")]), None, "method='finetune' learns from X and y"),
        (dict(val_fraction=0.1), "rare", "'rare' has 1.*val_fraction=0.1 holds out at least one example of each label"),
        (dict(adapt_layers=9), None, r"layers=9 \(--adapt-layers 9\): this model has 3 blocks"),
        (dict(learning_rate=0.0), None, "learning_rate"),
    ],
)
def test_estimator_finetune_refusals(tiny_qwen_mlx, params, y, match):
    pytest.importorskip("sklearn")
    from mlx_slm.sklearn import SLMClassifier

    est = SLMClassifier(model=str(tiny_qwen_mlx), method="finetune", **{"adapt_layers": 2, **params})
    with pytest.raises(ValueError, match=match):
        est.fit(X, Y[:-1] + ["rare"] if y == "rare" else Y)  # 'rare': one example, none left to train on
