"""A fine-tuned classifier out as a Transformers checkpoint (`weights/export.py`):
`{Arch}ForSequenceClassification` gives the task's probabilities, refusals name the fix."""

from __future__ import annotations

import json

import numpy as np
import pytest

import mlx_slm  # noqa: F401  (BLAS before mlx)
from mlx_slm.weights.adapters import FinetuneError
from mlx_slm.weights.finetune import FinetuneSettings, finetune
from tests.weights.finetuning import FAST, LABELS, Data

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
