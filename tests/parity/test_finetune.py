"""Parity of a fine-tuned task (`parity/finetune.py`, `mlx-slm parity --task FT_TASK`): our fine-tuned
classifier against Transformers on the export (objective (a)) or on the merged weights as a causal LM
(objective (b), labels of several tokens)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.train_cli import FAST, run


def _tuned(task: Path):
    from mlx_slm.classifier.task import Task

    return Task.load(task).kind.tuned


def test_parity_task_passes_and_fails_when_the_reference_differs(lora_work, monkeypatch):
    """parity --task: labels equal and probabilities within 1e-4 (exit 0); a reference whose score
    head differs (the export doubled) fails (exit 1)."""
    pytest.importorskip("torch")
    from dataclasses import replace

    import mlx_slm.parity.finetune as export_mod  # where parity --task took `export` from

    r = run(["parity", "--task", lora_work.task, "--n", "12", "--json"])
    assert r.exit_code == 0, r.output
    rep = json.loads(r.stdout)
    a = rep["forward_exactness"]
    assert rep["forward_ok"] and a["agree"] == a["total"] == 12 and a["max_abs_dprob"] < 1e-4
    assert rep["reference"] == "AutoModelForSequenceClassification" and rep["task"]["objective"] == "score"
    real = export_mod.export
    monkeypatch.setattr(export_mod, "export", lambda ft, *a, **k: real(replace(ft, head=ft.head * 3), *a, **k))
    r = run(["parity", "--task", lora_work.task, "--n", "12"])
    assert r.exit_code == 1 and "FAIL" in r.stdout


@pytest.mark.slow
def test_parity_of_the_labels_objective_with_labels_of_several_tokens(lora_work, tmp_path):
    """Objective (b), labels of several tokens (no score head to export): the merged weights as a
    causal LM, each label scored as label scoring scores it: within 1e-4."""
    pytest.importorskip("torch")
    task = tmp_path / "labels.json"
    r = run(["train", lora_work.data, "--finetune", "lora", "--objective", "labels", "--model", lora_work.model,
             "--save-task", task, *FAST])  # fmt: skip
    assert r.exit_code == 0, r.output
    assert any(len(t) > 1 for t in _tuned(task).label_tokens)
    r = run(["parity", "--task", task, "--n", "12", "--json"])
    assert r.exit_code == 0, r.output
    rep = json.loads(r.stdout)
    assert (
        rep["reference"] == "AutoModelForCausalLM, label scoring" and rep["forward_exactness"]["max_abs_dprob"] < 1e-4
    )
    e = run(["export", task, "-o", tmp_path / "x"])
    assert e.exit_code == 2 and "only when every label is one token" in e.output and not (tmp_path / "x").exists()
