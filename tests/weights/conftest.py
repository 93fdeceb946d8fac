"""The fine-tuning tests' tiny models, a run trained once per module (tests/weights/finetuning.py), and a
fine-tuned task whose score head holds a NaN (the adapters' and the export's refusals)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from mlx_slm.text.workload import tickets
from tests.weights.finetuning import Data


@pytest.fixture(scope="module")
def qwen(tiny_arch):
    return Data(tiny_arch.mlx("qwen2"))


@pytest.fixture(scope="module")
def qwen3(tiny_arch):
    return Data(tiny_arch.mlx("qwen3"))


@pytest.fixture(scope="module")
def trained(qwen):
    return qwen.train(epochs=3)


ROWS = tickets(30)


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
