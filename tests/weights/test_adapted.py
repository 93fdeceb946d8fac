"""The fine-tuning run's two passes (`weights/adapted.py`): the frozen blocks below the adapted ones run
once per text, then the adapted top; the gradient is right (finite differences, through the model's
CPU fastmath ops too) and the training forward equals inference."""

from __future__ import annotations

import numpy as np
import pytest

import mlx_slm  # noqa: F401  (BLAS before mlx)
from mlx_slm.weights.finetune import FinetuneSettings
from tests.weights.finetuning import FAST, _top_probs

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
