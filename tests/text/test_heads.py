"""Learned heads (`text/heads.py`, issue 21): the head's maths and fitting, and the head end to end: parity
with Transformers, Ray and the server. (The head kind is tested in tests/kinds/test_head.py, training in
tests/jobs/test_train.py, the CLI in tests/cli/test_train.py.)"""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlx_slm.text.heads import (
    Candidate,
    Head,
    HeadError,
    Search,
    _two_rows,
    fit,
    fit_linear,
    format_table,
    head_input,
    standardiser,
    temperature,
)
from mlx_slm.text.workload import tickets
from tests.hostile import invoke, refused_cleanly, write
from tests.train_cli import labelled, run

pytest.importorskip("sklearn")


def _data(seed: int, n: int, f: int, k: int, signal: float = 2.0):
    rng = np.random.default_rng(seed)
    y = np.arange(n) % k
    centres = rng.normal(size=(k, f)) * signal
    x = centres[y] + rng.normal(size=(n, f)) * rng.uniform(0.5, 3.0, size=f) + rng.normal(size=f) * 5
    return x, y


def _head(x, y, k, C=0.1, layers=(1,)):
    mean, scale, coef, intercept = fit_linear(x, y, k, "logistic", C)
    return Head(tuple(f"l{i}" for i in range(k)), tuple(layers), mean, scale, coef, intercept, C=C)


# --------------------------------------------------------------------------- the maths
@settings(max_examples=15, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    k=st.integers(2, 5),
    f=st.integers(1, 12),
    C=st.sampled_from([0.01, 0.3, 3.0]),
)
def test_numpy_predict_equals_sklearn_predict_proba(seed, k, f, C):
    """Standardise + multinomial logistic regression, predicted in numpy, equals scikit-learn's
    StandardScaler + LogisticRegression predict_proba (two labels: its one sigmoid row too)."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    x, y = _data(seed, 12 * k, f, k)
    h = _head(x, y, k, C)
    ref = make_pipeline(StandardScaler(), LogisticRegression(C=C, max_iter=500)).fit(x, y)
    new = _data(seed + 1, 20, f, k)[0]
    got = np.exp(h.log_probs(new[:, None, :]))
    np.testing.assert_allclose(got, ref.predict_proba(new), atol=1e-6)
    np.testing.assert_allclose(got.sum(1), 1, atol=1e-12)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(2, 30), f=st.integers(1, 8))
def test_standardiser_equals_standard_scaler(seed, n, f):
    from sklearn.preprocessing import StandardScaler

    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, f)) * rng.uniform(0, 100, size=f) + rng.normal(size=f)
    x[:, 0] = 7.25  # a feature with no spread keeps scale 1
    mean, scale = standardiser(x)
    sk = StandardScaler().fit(x)
    np.testing.assert_allclose(mean, sk.mean_)
    np.testing.assert_allclose(scale, sk.scale_)
    assert scale[0] == 1.0


def test_head_dict_roundtrip_and_checksum():
    x, y = _data(0, 30, 6, 3)
    h = _head(x, y, 3, layers=(2, 3))  # two layers of 3 features each
    d = json.loads(json.dumps(h.to_dict()))
    back = Head.from_dict(d)
    assert back.labels == h.labels and back.layers == (2, 3) and back.sha256 == h.sha256 and back.dim == 3
    feats = x.reshape(30, 2, 3)
    np.testing.assert_array_equal(back.log_probs(feats), h.log_probs(feats))
    bad = dict(d, coef=Head.to_dict(Head(h.labels, h.layers, h.mean, h.scale, h.coef * 1.001, h.intercept))["coef"])
    with pytest.raises(HeadError, match="sha256"):
        Head.from_dict(bad)
    with pytest.raises(HeadError, match="'coef' holds"):
        Head.from_dict(dict(d, coef=d["intercept"]))
    with pytest.raises(HeadError, match="'layers'"):
        Head.from_dict(dict(d, layers=[0]))
    with pytest.raises(HeadError, match="takes features"):
        h.log_probs(np.zeros((2, 1, 3)))


def _c(*layers, pooling="last"):
    return Candidate.of(layers, pooling)


def test_fit_chooses_the_informative_layer_by_cv():
    rng = np.random.default_rng(1)
    n, k, dim = 60, 3, 8
    y = np.arange(n) % k
    noise = rng.normal(size=(n, dim))
    useful = np.eye(k, dim)[y] * 3 + rng.normal(size=(n, dim))
    feats = {"last": np.stack([noise, useful, noise[::-1]], axis=1)}  # layers 1, 2, 3
    h = fit(feats, [1, 2, 3], y, ["a", "b", "c"], [_c(1), _c(2), _c(3), _c(1, 3)], Search(folds=3))
    assert h.layers == (2,) and h.poolings == ("last",) and h.info["chosen"]["accuracy"] > 0.9
    rows = {tuple(r["layers"]): r for r in h.info["table"]}
    assert rows[(1,)]["accuracy"] < 0.6 and set(rows) == {(1,), (2,), (3,), (1, 3)}
    same = fit(
        {"last": np.stack([useful, useful], axis=1)},
        [1, 2],
        y,
        ["a", "b", "c"],
        [_c(2), _c(1), _c(1, 2)],
        Search(folds=3),
    )
    assert same.layers == (1,)  # a tie goes to the earlier (cheaper) layer
    assert [(r["kind"], r["C"]) for r in h.info["regularisation"]] == [("lda", 0.1), ("logistic", 0.1)]
    assert h.estimator == h.info["chosen"]["kind"] and h.estimator in ("lda", "logistic")
    lr = fit(
        feats,
        [1, 2, 3],
        y,
        ["a", "b", "c"],
        [_c(1), _c(2)],
        Search(estimators=("logistic",), Cs=(0.01, 0.1, 1.0), folds=3),
    )
    assert lr.estimator == "logistic" and [r["C"] for r in lr.info["regularisation"]] == [0.01, 0.1, 1.0]
    assert h.info["chosen"]["log_loss_at_temperature"] <= h.info["chosen"]["log_loss"] + 1e-9

    forced = fit(feats, [1, 2, 3], y, ["a", "b", "c"], [_c(1), _c(2)], Search(forced=(1,), folds=3))
    assert forced.layers == (1,) and forced.info["forced"]
    with pytest.raises(HeadError, match="at least 3 examples per label"):
        fit({"last": feats["last"][:7]}, [1, 2, 3], y[:7], ["a", "b", "c"], [_c(1)], Search(folds=3))


@pytest.mark.parametrize("k", [2, 5])
def test_lda_equals_scikit_learns_shrinkage_lda(k):
    """Our one-pass shrinkage LDA gives scikit-learn's LinearDiscriminantAnalysis(solver="lsqr",
    shrinkage="auto") weights, with few examples per label and more features than examples."""
    from sklearn.discriminant_analysis import LinearDiscriminantAnalysis

    rng = np.random.default_rng(k)
    y = np.repeat(np.arange(k), [4, 7, 5, 6, 9][:k])
    x = rng.normal(size=(len(y), 40)) + np.eye(k, 40)[y] * 2
    mean, scale, coef, intercept = fit_linear(x, y, k, "lda")
    z = (x - mean) / scale
    sk = LinearDiscriminantAnalysis(solver="lsqr", shrinkage="auto").fit(z, y)
    ref = Head(tuple("abcde"[:k]), (1,), mean, scale, *_two_rows(sk.coef_, sk.intercept_, k))
    ours = Head(tuple("abcde"[:k]), (1,), mean, scale, coef, intercept)
    np.testing.assert_allclose(ours.log_probs(x[:, None]), ref.log_probs(x[:, None]), atol=1e-8)
    np.testing.assert_allclose(np.exp(ours.log_probs(x[:, None])), sk.predict_proba(z), atol=1e-8)


def test_temperature_undoes_a_sharpened_softmax():
    rng = np.random.default_rng(4)
    z = rng.normal(size=(400, 5)) * 2
    y = np.array([rng.choice(5, p=np.exp(r) / np.exp(r).sum()) for r in z])  # drawn from softmax(z)
    assert abs(temperature(z * 7, y) / 7 - 1) < 0.25  # the logits 7x too sharp: T near 7


def test_fit_chooses_the_pooling_by_cv_and_a_tie_goes_to_the_last_position():
    rng = np.random.default_rng(2)
    n, k, dim = 60, 3, 8
    y = np.arange(n) % k
    noise = rng.normal(size=(n, 2, dim))
    useful = (np.eye(k, dim)[y] * 3 + rng.normal(size=(n, dim)))[:, None].repeat(2, axis=1)
    cands = [_c(1), _c(2), _c(1, pooling="mean"), _c(2, pooling="mean")]
    h = fit({"last": noise, "mean": useful}, [1, 2], y, ["a", "b", "c"], cands, Search(folds=3, combine=False))
    assert (h.layers, h.poolings) == ((1,), ("mean",)) and h.info["chosen"]["poolings"] == ["mean"]
    assert Head.from_dict(h.to_dict()).poolings == ("mean",)
    assert "mean 1" in format_table(h) and "<- chosen" in format_table(h)
    tie = fit({"last": useful, "mean": useful}, [1, 2], y, ["a", "b", "c"], cands, Search(folds=3, combine=False))
    assert (tie.layers, tie.poolings) == ((1,), ("last",))
    forced = fit({"last": noise, "mean": useful}, [1, 2], y, ["a", "b", "c"], cands, Search(forced=(2,), folds=3))
    assert (forced.layers, forced.poolings) == ((2,), ("mean",))  # --layer fixes the layer; CV picks the pooling
    with pytest.raises(HeadError, match="pooling"):
        Head.from_dict(dict(h.to_dict(), pooling="max"))


def test_fit_joins_the_best_last_and_mean_parts_when_each_holds_half_the_signal():
    """Two labels told apart by the last position only, two others by the mean only: the
    greedy joint candidate (best last + best mean, side by side) is scored and wins, and
    the head reads its parts from the features in order."""
    rng = np.random.default_rng(3)
    n, k, dim = 80, 4, 6
    y = np.arange(n) % k
    last = rng.normal(size=(n, 2, dim))
    mean = rng.normal(size=(n, 2, dim))
    last[:, 1, 0] += 6 * (y >= 2)  # layer 2, last: {0, 1} vs {2, 3}
    mean[:, 0, 1] += 6 * (y % 2)  # layer 1, mean: {0, 2} vs {1, 3}
    feats = {"last": last, "mean": mean}
    cands = [_c(1), _c(2), _c(1, pooling="mean"), _c(2, pooling="mean")]
    h = fit(feats, [1, 2], y, list("abcd"), cands, Search(folds=4))
    assert h.parts == ((2, "last"), (1, "mean")) and h.name == "2+mean 1"
    assert h.info["chosen"]["accuracy"] > 0.9
    assert max(r["accuracy"] for r in h.info["table"][:4]) < 0.8  # neither half alone
    back = Head.from_dict(h.to_dict())
    assert back.parts == h.parts and back.estimator == h.estimator and back.to_dict()["pooling"] == ["last", "mean"]
    np.testing.assert_allclose(
        back.log_probs(head_input(feats, [1, 2], back)), h.log_probs(head_input(feats, [1, 2], h))
    )
    assert (head_input(feats, [1, 2], h)[:, 0] == last[:, 1]).all() and (
        head_input(feats, [1, 2], h)[:, 1] == mean[:, 0]
    ).all()
    with pytest.raises(HeadError, match="one per layer"):
        Head.from_dict(dict(h.to_dict(), pooling=["last"]))


# --------------------------------------------------------------------------- the head path
LABELS = ("billing", "technical", "account")
SYSTEM, TEMPLATE = "You classify tickets.", "Ticket: {text}\nCategory:"


# --------------------------------------------------------------------------- the CLI


# --------------------------------------------------------------------------- parity
@pytest.mark.slow
def test_head_parity_on_a_tiny_model(tiny_head, tiny_qwen_mlx, tmp_path):
    """Our features at the head's layer(s) equal Transformers' hidden_states[layer], and the
    head's labels from both feature sets are equal."""
    from mlx_slm.classifier.task import Task
    from mlx_slm.parity.labels import Ours, run_head_parity
    from mlx_slm.weights.convert import weights_sha256

    _, head = tiny_head
    t = Task(str(tiny_qwen_mlx), LABELS, SYSTEM, TEMPLATE,
             weights_sha256=weights_sha256(tiny_qwen_mlx), head=head)  # fmt: skip
    r = run_head_parity(t, [t for t, _ in tickets(10)], Ours(batch_size=4))
    assert r["forward_ok"], r
    assert r["labels"]["agree"] == 10 and r["features"]["max_rel_diff"] < 1e-4 and r["classify_matches_features"]


def _hidden_here(src, prompts, layers, poolings=(), start=0):
    """`reference.hidden_in_child`, computed in this process on one thread: the same
    `reference.hidden` on the same weights, without a child's ~5 s of importing Transformers
    for a tiny model (the child itself is run by the CLI parity test on SmolLM2)."""
    import time

    from mlx_slm.parity.reference import Reference, hidden

    ref = Reference(src, threads=1)
    t = time.perf_counter()
    hs = np.array([hidden(ref, p, layers, poolings, start) for p in prompts])
    return hs, time.perf_counter() - t


def test_head_of_last_and_mean_parts_parity_and_batching(tiny_head, tiny_qwen_mlx, monkeypatch):
    """A head reading layer 2's last position and layer 1's mean: Transformers' hidden states
    pooled the same way agree, and batched with the prefix cache equals one at a time without."""
    from mlx_slm.classifier.classifier import Classifier
    from mlx_slm.classifier.task import Task
    from mlx_slm.jobs.train import head_classifier
    from mlx_slm.parity import reference
    from mlx_slm.parity.labels import Ours, run_head_parity
    from mlx_slm.text.heads import fit_linear
    from mlx_slm.weights.convert import weights_sha256

    engine = tiny_head[0]
    texts = [t for t, _ in tickets(24)]
    got, _, _ = head_classifier(engine, LABELS, SYSTEM, TEMPLATE).features(texts, [1, 2], poolings=("last", "mean"))
    shape = Head(
        LABELS, (2, 1), np.zeros(128), np.ones(128), np.zeros((3, 128)), np.zeros(3), poolings=("last", "mean")
    )
    x = head_input(got, [1, 2], shape).reshape(len(texts), -1)
    head = Head(
        LABELS, (2, 1), *fit_linear(x, np.arange(len(texts)) % 3, 3, "lda"), poolings=("last", "mean"), estimator="lda"
    )
    batched = Classifier(engine, LABELS, SYSTEM, TEMPLATE, head=head).classify(texts)
    alone = Classifier(engine, LABELS, SYSTEM, TEMPLATE, head=head, batch_size=1, use_prefix_cache=False)
    for p, q in zip(batched, alone.classify(texts)):
        assert p.label == q.label
        np.testing.assert_allclose([p.probs[lab] for lab in LABELS], [q.probs[lab] for lab in LABELS], atol=1e-4)
    t = Task(str(tiny_qwen_mlx), LABELS, SYSTEM, TEMPLATE,
             weights_sha256=weights_sha256(tiny_qwen_mlx), head=head)  # fmt: skip
    monkeypatch.setattr(reference, "hidden_in_child", _hidden_here)
    r = run_head_parity(t, texts[:8], Ours(batch_size=4))
    assert r["forward_ok"], r
    assert r["labels"]["agree"] == 8 and r["features"]["max_rel_diff"] < 1e-4 and r["classify_matches_features"]
    assert r["task"]["poolings"] == ["last", "mean"]


@pytest.mark.real
@pytest.mark.slow
def test_head_parity_on_smollm2(smollm2_mlx, tmp_path):
    """SmolLM2: a head trained on two layers (a middle one and the last), checked from the CLI."""
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"text": t, "label": lab}) + "\n" for t, lab in labelled(5)))
    task = tmp_path / "task.json"
    r = run(["train", str(data), "--model", "smollm2-135m", "--save-task", str(task), "--layers", "12,30", "-q"])
    assert r.exit_code == 0, r.output
    r = run(["parity", "--task", str(task), "--n", "6", "--json"])
    assert r.exit_code == 0, r.output
    rep = json.loads(r.stdout)
    assert rep["forward_ok"] and rep["labels"]["agree"] == 6 and rep["scoring"] == "head"


def test_ray_worker_builds_the_head_classifier(tiny_head, tiny_qwen_mlx):
    """Ray's worker class, fed the task as a dict (what remote nodes get), classifies with the head."""
    pa = pytest.importorskip("pyarrow")
    from mlx_slm.classifier.classifier import Classifier
    from mlx_slm.classifier.task import Task
    from mlx_slm.ray import ClassifyBatch
    from mlx_slm.weights.convert import weights_sha256

    engine, head = tiny_head
    t = Task(str(tiny_qwen_mlx), LABELS, SYSTEM, TEMPLATE, weights_sha256=weights_sha256(tiny_qwen_mlx), head=head)
    texts = [t for t, _ in tickets(6)]
    want = [p.label for p in Classifier.from_task(t, engine=engine).classify(texts)]
    worker = ClassifyBatch(t.to_dict())
    assert worker.clf.mode == "head"
    got = worker(pa.table({"text": texts}))
    assert got.column("label").to_pylist() == want


def test_server_uses_the_head_for_its_own_task_only(tiny_head, tiny_qwen_mlx):
    from mlx_slm.server import ServeOptions, Service, classifier_loader

    _, head = tiny_head
    service = Service(
        classifier_loader(str(tiny_qwen_mlx), LABELS, SYSTEM, TEMPLATE, head=head), ServeOptions(max_wait_ms=5)
    )
    service._load()
    key = service.default_key
    assert service._back_classifier(key).mode == "head" and service.front_classifier(key).mode == "head"
    other = service.task_key(["x", "y"], None, None, None)
    assert service.front_classifier(other).head is None  # other labels: label scoring


def test_server_reply_says_which_scoring_ran(tiny_head, tiny_qwen_mlx):
    """A head task's server answers a request with its own labels by label scoring: the reply says so."""
    httpx = pytest.importorskip("httpx")
    pytest.importorskip("uvicorn")
    from mlx_slm.server import ServeOptions, Service, classifier_loader
    from tests.server.test_app import ThreadServer

    _, head = tiny_head
    loader = classifier_loader(str(tiny_qwen_mlx), LABELS, SYSTEM, TEMPLATE, head=head)
    s = ThreadServer(Service(loader, ServeOptions(max_wait_ms=5))).start()
    try:
        own = httpx.post(s.url + "/v1/classify", json={"text": "refund please"}, timeout=30).json()
        other = httpx.post(s.url + "/v1/classify", json={"text": "refund please", "labels": ["x", "y"]}, timeout=30)
    finally:
        s.stop()
    assert own["scoring"] == "head" and set(own["results"][0]["probs"]) == set(LABELS)
    assert other.json()["scoring"] == "labels" and set(other.json()["results"][0]["probs"]) == {"x", "y"}


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


@pytest.mark.parametrize(
    ("head", "words"),
    [({}, ["field 'kind'"]), ({"kind": None}, ["field 'kind'"]), ({"kind": "lda", "pooling": 3}, ["field 'pooling'"]),
     ({"kind": "lda", "pooling": []}, ["field 'pooling'"]), ({"kind": "newer"}, ["'newer' head", "upgrade mlx-slm"])],
)  # fmt: skip
def test_a_damaged_head_names_the_field_and_only_a_newer_one_says_upgrade(head, words, head_task, tmp_path):
    task = json.loads(head_task.read_text())
    task["head"] = {**task["head"], **head} if head else {}
    if "pooling" in head and head["pooling"] == []:
        task["head"]["pooling"] = []
    if head == {"kind": None}:
        task["head"]["kind"] = None
    bad = write(tmp_path / "t.json", json.dumps(task))
    r = invoke(["classify", write(tmp_path / "in.jsonl", '{"text": "hi"}\n'), "--task", bad])
    refused_cleanly(r, f"task file {bad}", *words)
    assert "None" not in r.output and ("upgrade" in r.output) == ("upgrade mlx-slm" in words)
