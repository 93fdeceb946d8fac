"""LoRA fine-tuning (mlx_slm/finetune.py), its result (adapters.py) and the Transformers export
(export.py), on tiny random models: the gradient is right (finite differences, through the
model's CPU fastmath ops too), the training forward (frozen blocks cached, the prompt head at
batch 1) equals inference, loss goes down, seeded runs are bit-identical, early stopping,
max_minutes and Ctrl-C keep the best epoch, save/load, apply == merge, objective (b) equals the
label scoring path, export -> Transformers parity, and every bad input is a clear UserError."""

from __future__ import annotations

import numpy as np
import pytest

import mlx_slm  # noqa: F401  (BLAS before mlx)
from mlx_slm.ground.errors import UserError
from mlx_slm.weights.adapters import FineTuned, FinetuneError
from mlx_slm.weights.finetune import FinetuneSettings, Provenance, finetune, validation_split

LABELS = ("billing", "technical", "account")
FAST = dict(
    layers=2, epochs=4, learning_rate=1e-4, head_learning_rate=1e-2, batch_size=8, val_fraction=0.0, keep="last"
)  # the mechanics; the recipe has its tests


class Data:
    """A tiny model, its tokenizer and the workload's tickets rendered as classify renders them."""

    def __init__(self, path, n: int = 36):
        from transformers import AutoTokenizer

        from mlx_slm.models import load_model
        from mlx_slm.text.labels import build_labelset
        from mlx_slm.text.prompts import PromptFormat, render, tokenize
        from mlx_slm.text.workload import tickets

        self.path = path
        self.model = load_model(path)
        self.tok = AutoTokenizer.from_pretrained(str(path))
        self.fmt = PromptFormat()
        rows = tickets(n)
        self.texts = [t for t, _ in rows]
        self.gold = [g for _, g in rows]
        self.y = np.array([LABELS.index(g) for g in self.gold])
        self.prompts = tokenize(self.tok, [render(self.tok, self.fmt, t) for t in self.texts])
        self.label_tokens = build_labelset(self.tok, LABELS, render(self.tok, self.fmt, "x")).token_ids

    def train(self, **kw):
        extra = {k: kw.pop(k) for k in ("progress",) if k in kw}
        if "base_sha256" in kw:
            extra["provenance"] = Provenance(base_sha256=kw.pop("base_sha256"))
        s = FinetuneSettings(**{**FAST, **kw})
        return finetune(self.model, self.prompts, self.gold, LABELS, s, label_tokens=self.label_tokens, **extra)


@pytest.fixture(scope="module")
def qwen(tiny_arch):
    return Data(tiny_arch.mlx("qwen2"))


@pytest.fixture(scope="module")
def qwen3(tiny_arch):
    return Data(tiny_arch.mlx("qwen3"))


@pytest.fixture(scope="module")
def trained(qwen):
    return qwen.train(epochs=3)


def _top_probs(data, s, params=None):
    """The training path's probabilities of every example: the frozen blocks cached, then `adapted.Top`."""
    import mlx.core as mx

    from mlx_slm.weights import adapted as F
    from mlx_slm.weights.adapters import LabelTokens

    lt = LabelTokens(tuple(data.label_tokens)) if s.objective == "labels" else None
    top = F.Top(data.model, s, len(LABELS), lt)
    if params is not None:
        top.assign(params)
    enc = F.encode(data.model, [list(p) for p in data.prompts], top.start, lt, s, lambda _d: None)
    sc = top.scores(enc, np.arange(len(data.prompts)))
    return np.array(mx.softmax(sc, axis=-1)), top, enc


# --------------------------------------------------------------------------- the forward and its gradient


@pytest.mark.parametrize("objective", ["score", "labels"])
def test_gradient_matches_finite_differences(qwen, objective):
    """The training loss's gradient on an adapter equals a central difference, though the model
    was loaded with the CPU's fastmath ops (whose outputs autodiff takes for constants); with
    `prefix_grad` (else the prompt head's path is left out of the gradient on purpose)."""
    import mlx.core as mx

    from mlx_slm.weights import adapted as F

    assert qwen.model.ops.name == "fastmath"  # what inference runs here; training must not
    s = FinetuneSettings(**{**FAST, "objective": objective, "prefix_grad": True})
    _, top, enc = _top_probs(qwen, s)
    rng = np.random.default_rng(0)
    params = {k: v + mx.array(rng.normal(0, 0.05, v.shape).astype(np.float32)) for k, v in top.params.items()}
    idx = np.arange(8)
    gold = mx.array(qwen.y[idx])

    def loss(p):
        top.assign(p)
        return F.cross_entropy(top.scores(enc, idx), gold)

    _, grads = mx.value_and_grad(loss)(params)
    name = next(k for k in params if k.endswith("mlp.up_proj.lora_b"))
    d = mx.array(rng.normal(0, 1, params[name].shape).astype(np.float32))
    eps = 1e-4  # float32: a larger step is off by the curvature (the scale of 20 makes it large)
    plus = loss({**params, name: params[name] + eps * d}).item()
    minus = loss({**params, name: params[name] - eps * d}).item()
    numeric = (plus - minus) / (2 * eps)
    analytic = (grads[name] * d).sum().item()
    assert abs(numeric - analytic) <= 1e-2 * max(1.0, abs(analytic)), (numeric, analytic)


@pytest.mark.parametrize("objective", ["score", "labels"])
@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
def test_training_forward_equals_inference(tiny_arch, qwen, qwen3, arch, objective):
    """Frozen blocks run once, the prompt head at batch 1 through the adapted blocks, (b)'s trie
    nodes in the rows' own pass: the same probabilities as the plain forward of the applied model
    (qwen3: sliding-window layers too)."""
    data = qwen if arch == "qwen2" else qwen3
    ft = data.train(objective=objective, epochs=1)
    s = FinetuneSettings(**{**FAST, "objective": objective})
    got, _, _ = _top_probs(data, s, {**ft.adapters, **({"score.weight": ft.head} if ft.head is not None else {})})
    want = np.exp(ft.predict(ft.apply(data.model), data.prompts))
    assert np.abs(got - want).max() < 1e-5


def test_labels_objective_scores_as_label_scoring_does(qwen):
    """Objective (b) at inference is the classifier's own label scoring (sequence mode here) on the
    applied model: the same probabilities."""
    from mlx_slm.classifier.classifier import Classifier
    from mlx_slm.engine.engine import Engine

    ft = qwen.train(objective="labels", epochs=2)
    clf = Classifier(Engine(ft.apply(qwen.model), qwen.tok), LABELS, qwen.fmt.system, qwen.fmt.template)
    assert clf.mode == "sequence"
    probs = np.array([[p.probs[k] for k in LABELS] for p in clf.run(qwen.texts)])
    assert np.abs(probs - np.exp(ft.predict(ft.apply(qwen.model), qwen.prompts))).max() < 1e-5


# --------------------------------------------------------------------------- training


@pytest.mark.parametrize("objective", ["score", "labels"])
def test_loss_goes_down(qwen, objective):
    ft = qwen.train(objective=objective, epochs=5)
    losses = [e.train_loss for e in ft.history]
    assert len(losses) == 5 and ft.stopped == "finished" and ft.best_epoch == 5
    assert losses[-1] < 0.6 * losses[0], losses
    acc = (ft.predict(ft.merge(qwen.model), qwen.prompts).argmax(1) == qwen.y).mean()
    assert acc > 0.8


def test_seeded_runs_are_bit_identical(qwen):
    kw = dict(epochs=2, dropout=0.1, val_fraction=0.2)
    a, b, c = qwen.train(**kw), qwen.train(**kw), qwen.train(**kw, seed=1)
    assert a.adapters.keys() == b.adapters.keys()
    for k in a.adapters:
        assert np.array_equal(np.array(a.adapters[k]), np.array(b.adapters[k])), k
    assert np.array_equal(np.array(a.head), np.array(b.head))
    assert [e.train_loss for e in a.history] == [e.train_loss for e in b.history]
    assert not np.array_equal(np.array(a.head), np.array(c.head))  # another seed: another run


def test_early_stopping_keeps_the_best_epoch(qwen):
    """A learning rate high enough to overfit: validation loss turns up, training stops after
    `patience` worse epochs, and the adapters returned score the validation set as the best epoch did."""
    ft = qwen.train(epochs=12, learning_rate=3e-3, head_learning_rate=3e-2, val_fraction=0.3, patience=2, keep="best")
    vl = [e.val_loss for e in ft.history]
    assert ft.best_epoch == int(np.argmin(vl)) + 1
    assert ft.stopped == "early_stopping" and len(vl) == ft.best_epoch + 2
    _, val = validation_split(qwen.y, LABELS, 0.3, 0)
    lp = ft.predict(ft.merge(qwen.model), [qwen.prompts[i] for i in val])
    assert abs(-lp[np.arange(len(val)), qwen.y[val]].mean() - vl[ft.best_epoch - 1]) < 1e-4


def test_max_minutes_stops_and_keeps_what_it_has(qwen):
    ft = qwen.train(epochs=5, max_minutes=1e-9, val_fraction=0.2)
    assert ft.stopped == "max_minutes"
    assert len(ft.history) == 1 and not ft.history[0].complete and ft.history[0].steps == 1
    assert ft.best_epoch == 1 and ft.head is not None


def test_interruption_keeps_the_best_epoch(qwen):
    seen = []

    def stop_in_epoch(n):
        def progress(p):
            seen.append(p)
            if p.phase == "train" and p.epoch == n:
                raise KeyboardInterrupt

        return progress

    ft = qwen.train(epochs=4, val_fraction=0.2, keep="best", progress=stop_in_epoch(3))
    assert ft.stopped == "interrupted" and len(ft.history) == 2
    assert ft.best_epoch == int(np.argmin([e.val_loss for e in ft.history])) + 1
    assert {p.phase for p in seen} == {"encode", "train"}
    with pytest.raises(KeyboardInterrupt):  # nothing finished yet: nothing to keep
        qwen.train(epochs=4, val_fraction=0.2, progress=stop_in_epoch(1))


# --------------------------------------------------------------------------- the result


def test_save_load_round_trip(trained, qwen, tmp_path):
    path = tmp_path / "a.safetensors"
    sha = trained.save(path)
    back = FineTuned.load(path, sha256=sha)
    assert back.record() == trained.record()
    for k in trained.adapters:
        assert np.array_equal(np.array(back.adapters[k]), np.array(trained.adapters[k]))
    assert np.array_equal(np.array(back.head), np.array(trained.head))
    assert np.array_equal(back.predict(back.apply(qwen.model), qwen.prompts), trained.predict(trained.apply(
        qwen.model), qwen.prompts))  # fmt: skip
    path.write_bytes(path.read_bytes()[:-4] + b"xxxx")
    with pytest.raises(FinetuneError, match="changed since it was saved"):
        FineTuned.load(path, sha256=sha)
    import mlx.core as mx

    mx.save_safetensors(str(tmp_path / "other.safetensors"), {"w": mx.zeros((2,))})
    with pytest.raises(FinetuneError, match="not an mlx-slm adapters file"):
        FineTuned.load(tmp_path / "other.safetensors")
    with pytest.raises(FinetuneError, match="cannot read"):
        FineTuned.load(tmp_path / "missing.safetensors")


def test_apply_and_merge_agree_and_leave_the_base_alone(trained, qwen):
    from mlx.utils import tree_flatten

    before = {k: np.array(v) for k, v in tree_flatten(qwen.model.parameters())}
    types_before = [type(m).__name__ for _, m in qwen.model.named_modules()]
    unfused = trained.predict(trained.apply(qwen.model), qwen.prompts)
    fused = trained.predict(trained.merge(qwen.model), qwen.prompts)
    assert np.abs(np.exp(unfused) - np.exp(fused)).max() < 1e-5
    after = dict(tree_flatten(qwen.model.parameters()))
    assert before.keys() == after.keys() and all(np.array_equal(before[k], np.array(after[k])) for k in before)
    assert [type(m).__name__ for _, m in qwen.model.named_modules()] == types_before


def test_adapters_refuse_another_model(trained, tiny_arch, qwen):
    from mlx_slm.models import load_model

    llama = load_model(tiny_arch.mlx("llama"))
    with pytest.raises(FinetuneError, match="trained on another model"):
        trained.apply(llama)
    ft = qwen.train(epochs=1, base_sha256="a" * 64)
    with pytest.raises(FinetuneError, match="sha256"):
        ft.merge(qwen.model, sha256="b" * 64)


def test_quantized_base_trains_as_qlora(tiny_arch, tmp_path):
    """A model kept packed (4-bit) trains with mlx-lm's LoRA layers over the packed projections;
    merging dequantizes the adapted ones, and both ways give the same probabilities."""
    from mlx_slm.weights.convert import convert

    q = convert(tiny_arch.hf("qwen2"), tmp_path / "q4", dtype="float32", quantize=4, group_size=32, progress=None)
    data = Data(q)
    from mlx_slm.models import load_model

    data.model = load_model(q, dequantize=False)
    assert data.model.quantized
    ft = data.train(epochs=2)
    assert ft.history[-1].train_loss < ft.history[0].train_loss
    a = ft.predict(ft.apply(data.model), data.prompts)
    b = ft.predict(ft.merge(data.model), data.prompts)
    assert np.abs(np.exp(a) - np.exp(b)).max() < 1e-4


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "change, match",
    [
        (dict(labels=("billing",)), "at least 2 labels"),
        (dict(gold=["billing"] * 35 + ["refunds"]), "'refunds' is not one of the labels"),
        (dict(gold=[0] * 35 + [7]), "gold index 7 is not a label index"),
        (dict(prompts=[], gold=[]), "no examples"),
        (dict(gold=["billing"] * 2), "36 prompts but 2 gold labels"),
        (dict(prompts="long"), "over the model's context of 1024"),
        (dict(prompts="empty"), "example 0: the prompt has no tokens"),
        (dict(prompts="vocab"), "outside the model's vocabulary"),
        (dict(gold="rare"), "too few examples for the validation split.*'account' has 1"),
        (dict(gold="absent"), r"no examples of \['account'\]"),
        (dict(settings=dict(layers=9)), r"layers=9 \(--adapt-layers 9\): this model has 3 blocks"),
        (dict(settings=dict(objective="head")), r"objective='head' \(--objective head\): one of score, labels"),
        (dict(settings=dict(keys=("self_attn.x_proj",))), "keys=.*projections of a block"),
        (dict(settings=dict(val_fraction=0.6)), "val_fraction=0.6"),
        (dict(settings=dict(max_minutes=0)), "max_minutes=0"),
        (dict(settings=dict(objective="labels"), label_tokens=None), "give label_tokens"),
    ],
)
def test_bad_input_is_a_clear_user_error(qwen, change, match):
    prompts, gold = [list(p) for p in qwen.prompts], list(qwen.gold)
    if change.get("prompts") == "long":
        prompts[3] = prompts[3] * 40
    elif change.get("prompts") == "empty":
        prompts[0] = []
    elif change.get("prompts") == "vocab":
        prompts[1] = prompts[1] + [10**6]
    elif "prompts" in change:
        prompts = change["prompts"]
    if change.get("gold") == "rare":
        gold = [g if g != "account" else "billing" for g in gold]
        gold[0] = "account"
    elif change.get("gold") == "absent":
        gold = [g if g != "account" else "billing" for g in gold]
    elif "gold" in change:
        gold = change["gold"]
    s = FinetuneSettings(**{**FAST, "val_fraction": 0.1, **change.get("settings", {})})
    with pytest.raises(UserError, match=match):
        finetune(qwen.model, prompts, gold, change.get("labels", LABELS), s,
                 label_tokens=change.get("label_tokens", qwen.label_tokens))  # fmt: skip


def test_not_one_of_our_architectures_is_refused(qwen):
    with pytest.raises(FinetuneError, match="one of our architectures"):
        finetune(object(), qwen.prompts, qwen.gold, LABELS)


# --------------------------------------------------------------------------- export


def _reference_probs(out, prompts) -> np.ndarray:
    import torch
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(str(out), dtype=torch.float32).eval()
    with torch.no_grad():
        return np.stack([model(torch.tensor([p])).logits.softmax(-1)[0].numpy() for p in prompts])


@pytest.mark.parametrize("arch", ["qwen2", "llama", "qwen3"])
def test_export_gives_transformers_the_same_probabilities(tiny_arch, arch, tmp_path):
    """Exported as {Arch}ForSequenceClassification, the fine-tuned model's probabilities under
    Transformers equal ours on the same prompts (float32, 1e-4); config and card as documented."""
    pytest.importorskip("torch")
    import json

    from mlx_slm.weights.export import Described, export

    data = Data(tiny_arch.mlx(arch), n=24)
    ft = data.train(epochs=2)
    out = export(ft, data.model, data.tok, data.path, tmp_path / "cls", described=Described(prompt={"system":
                 data.fmt.system, "template": data.fmt.template}, base_name="tiny"))  # fmt: skip
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == [{"qwen2": "Qwen2", "llama": "Llama", "qwen3": "Qwen3"}[arch]
                                    + "ForSequenceClassification"]  # fmt: skip
    assert cfg["id2label"] == {"0": "billing", "1": "technical", "2": "account"} and cfg["num_labels"] == 3
    assert cfg["problem_type"] == "single_label_classification" and cfg["pad_token_id"] == data.tok.pad_token_id
    assert cfg["mlx_slm"]["prompt"]["template"] == data.fmt.template
    assert "AutoModelForSequenceClassification" in (out / "README.md").read_text()
    ours = np.exp(ft.predict(ft.merge(data.model), data.prompts))
    assert np.abs(_reference_probs(out, data.prompts) - ours).max() < 1e-4


def test_export_of_one_token_label_objective(tiny_arch, tmp_path):
    """Objective (b) with one-token labels exports its score head as the LM head's label rows."""
    pytest.importorskip("torch")
    from mlx_slm.text.labels import build_labelset
    from mlx_slm.text.prompts import render
    from mlx_slm.weights.export import export

    data = Data(tiny_arch.mlx("qwen2"), n=24)
    labels = ("a", "b", "c")
    ls = build_labelset(data.tok, labels, render(data.tok, data.fmt, "x"))
    assert ls.mode == "first-token"
    gold = [labels[LABELS.index(g)] for g in data.gold]
    s = FinetuneSettings(**{**FAST, "objective": "labels", "epochs": 2})
    ft = finetune(data.model, data.prompts, gold, labels, s, label_tokens=ls.token_ids)
    out = export(ft, data.model, data.tok, data.path, tmp_path / "cls")
    ours = np.exp(ft.predict(ft.merge(data.model), data.prompts))
    assert np.abs(_reference_probs(out, data.prompts) - ours).max() < 1e-4


def test_export_refusals(qwen, tmp_path):
    from mlx_slm.weights.export import export

    ft = qwen.train(objective="labels", epochs=1)
    with pytest.raises(FinetuneError, match="only when every label is one token"):
        export(ft, qwen.model, qwen.tok, qwen.path, tmp_path / "x")
    assert not (tmp_path / "x").exists()
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "f").write_text("")
    with pytest.raises(FinetuneError, match="not an empty folder"):
        export(qwen.train(epochs=1), qwen.model, qwen.tok, qwen.path, tmp_path / "full")
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_probe_initialized_head_starts_ahead(qwen):
    """head_init="probe": the head is fitted on the base features before the first step (its
    training loss is below a zero head's log 3 at once), and the first epoch ends lower too."""
    import mlx.core as mx

    from mlx_slm.weights import adapted as F
    from mlx_slm.weights import head_starts as H

    s = FinetuneSettings(**{**FAST, "val_fraction": 0.2, "head_init": "probe"})
    _, top, enc = _top_probs(qwen, s)
    split = validation_split(qwen.y, LABELS, 0.2, 0)
    top.head = H.probe(top, enc, qwen.y, split, s)
    tr = split[0]
    assert F.cross_entropy(top.scores(enc, tr), mx.array(qwen.y[tr])).item() < 0.5 * np.log(3)
    zero = qwen.train(epochs=1, val_fraction=0.2)
    probe = qwen.train(epochs=1, val_fraction=0.2, head_init="probe")
    assert probe.history[0].train_loss < zero.history[0].train_loss


def test_default_layers_are_the_top_sixteen_or_every_block_of_a_smaller_model(qwen):
    from dataclasses import replace

    from mlx_slm.weights.finetune import DEFAULT_LAYERS

    n = len(qwen.model.layers)
    assert FinetuneSettings().layers is None and DEFAULT_LAYERS == 16 and n < DEFAULT_LAYERS
    assert FinetuneSettings().for_model(qwen.model).layers == n  # a 3-block model: all of them
    assert FinetuneSettings(layers=2).for_model(qwen.model).layers == 2  # given: kept
    FinetuneSettings().check(qwen.model)  # None is a valid setting
    tuned = qwen.train(layers=None, epochs=1)
    assert tuned.lora.layers == tuple(range(n)) and tuned.settings["layers"] == n  # recorded resolved
    with pytest.raises(FinetuneError, match=rf"layers={n + 1} \(--adapt-layers {n + 1}\): this model has {n} blocks"):
        replace(FinetuneSettings(), layers=n + 1).for_model(qwen.model)


# --------------------------------------------------------------------------- the levers tried for few shots (issue 42)
@pytest.mark.parametrize(
    "lever",
    [
        {"head_init": "centroid"},
        {"head_init": "words"},
        {"label_smoothing": 0.1},
        {"contrastive": 0.5},
        {"keep": "average", "epochs": 4},
    ],
    ids=["centroid", "words", "smoothing", "contrastive", "average"],
)
def test_each_lever_trains_and_is_seeded(qwen, lever):
    """Each lever of the recipe trains (the loss goes down, the classifier learns the tickets) and
    the same seed gives the same adapters."""
    a, b = qwen.train(**lever), qwen.train(**lever)
    losses = [e.train_loss for e in a.history]
    assert losses[-1] < losses[0], losses
    assert (a.predict(a.merge(qwen.model), qwen.prompts).argmax(1) == qwen.y).mean() > 0.7
    assert np.array_equal(np.array(a.head), np.array(b.head))


def test_centroid_and_words_heads_start_from_something(qwen):
    """A head that starts as the base features' class centroids (or the label words' LM-head rows)
    scores the training texts better than the zero head's chance at step 0."""
    import mlx.core as mx

    from mlx_slm.weights import adapted as F
    from mlx_slm.weights import head_starts as H

    s = FinetuneSettings(**{**FAST, "val_fraction": 0.0})
    _, top, enc = _top_probs(qwen, s)
    everything = np.arange(len(qwen.y))
    top.head = H.centroid(top, enc, qwen.y, (everything, everything[:0]), s)
    assert F.cross_entropy(top.scores(enc, everything), mx.array(qwen.y)).item() < np.log(3)
    from mlx_slm.weights.adapters import LabelTokens

    w = H.words(top, LabelTokens(tuple(tuple(t) for t in qwen.label_tokens)))
    assert w.shape == (3, qwen.model.args.hidden_size) and np.abs(np.array(w).sum(0)).max() < 1e-4  # centred


def test_averaged_epochs_are_the_mean_of_the_later_half(qwen):
    """keep="average": the adapters kept are the mean of the later half's epochs, not the last epoch's."""
    last, mean = qwen.train(epochs=4), qwen.train(epochs=4, keep="average")
    assert not np.array_equal(np.array(last.head), np.array(mean.head))
    assert mean.best_epoch == 4 and [e.epoch for e in mean.history] == [1, 2, 3, 4]
