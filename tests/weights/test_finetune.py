"""LoRA fine-tuning (`weights/finetune.py`) on tiny random models: loss goes down, seeded runs are
bit-identical, early stopping, max_minutes and Ctrl-C keep the best epoch, objective (b) equals the
label scoring path, each lever of the recipe trains, a diverging run is refused, and every bad input
is a clear UserError. (The training forward and its gradient are tested in test_adapted.py, the
result in test_adapters.py, the export in test_export.py, the head's start in test_head_starts.py.)"""

from __future__ import annotations

import numpy as np
import pytest

import mlx_slm  # noqa: F401  (BLAS before mlx)
from mlx_slm.ground.errors import UserError
from mlx_slm.text.workload import tickets
from mlx_slm.weights.adapters import FinetuneError
from mlx_slm.weights.finetune import FinetuneSettings, finetune, validation_split
from tests.weights.finetuning import FAST, LABELS, Data


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


def test_quantized_base_trains_as_qlora(tiny_arch, tmp_path):
    """A model kept packed (4-bit) trains with mlx-lm's LoRA layers over the packed projections;
    merging dequantizes the adapted ones, and both ways give the same probabilities."""
    from mlx_slm.weights.convert import convert

    q = convert(tiny_arch.hf("qwen2"), tmp_path / "q4", dtype="float32", quantize=4, group_size=32, progress=None)
    data = Data(q)
    from mlx_slm.models import load_model

    data.model = load_model(q, keep_quantized=True)
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


def test_averaged_epochs_are_the_mean_of_the_later_half(qwen):
    """keep="average": the adapters kept are the mean of the later half's epochs, not the last epoch's."""
    last, mean = qwen.train(epochs=4), qwen.train(epochs=4, keep="average")
    assert not np.array_equal(np.array(last.head), np.array(mean.head))
    assert mean.best_epoch == 4 and [e.epoch for e in mean.history] == [1, 2, 3, 4]


ROWS = tickets(30)


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
