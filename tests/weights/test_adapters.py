"""A fine-tuned classifier (`weights/adapters.py`): LoRA adapters on a model's top blocks and a score head,
saved and loaded back, applied or merged alike, refused on another model or with non-finite weights."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

import mlx_slm  # noqa: F401  (BLAS before mlx)
from mlx_slm.cli import main
from mlx_slm.text.workload import tickets
from mlx_slm.weights.adapters import FineTuned, FinetuneError

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


ROWS = tickets(30)


def run(args, **kw):
    return CliRunner().invoke(main, [str(a) for a in args], **kw)


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
