"""Decisions on an engine (`kinds/decisions.py`): a request's questions as branches after its state;
the planner keeps a bounded LRU of label sets."""

from __future__ import annotations

import pytest

from mlx_slm.text.decisions.settings import DecisionConfig

TEMPERATURE = {"choice": 1.7, "score": 0.6}


@pytest.fixture(scope="module", params=["qwen2", pytest.param("llama", marks=pytest.mark.slow)])
def tiny(request, tmp_path_factory):
    """A tiny random model whose tokenizer has Yes and No as tokens (as real chat models do), its
    float32 MLX conversion, and a Decider on it with temperatures per type."""
    from mlx_slm.classifier.decider import Decider
    from mlx_slm.weights.convert import convert
    from tests.conftest import make_tiny

    arch = request.param
    hf_dir = make_tiny(tmp_path_factory.mktemp(f"hf-yesno-{arch}"), arch, words=("Yes", "No"))
    mlx_dir = convert(hf_dir, tmp_path_factory.mktemp(f"mlx-yesno-{arch}") / "m", dtype="float32", progress=None)
    config = DecisionConfig(temperature=TEMPERATURE)
    return hf_dir, Decider.load(str(mlx_dir), decision_config=config, dtype="float32")


def test_the_planner_keeps_a_bounded_lru_of_label_sets(tiny, monkeypatch):
    """Beyond 26 options the labels are the option names: a long-lived server sees ever new ones,
    so the planner keeps at most `LABEL_SETS` label sets, the most recently used."""
    import mlx_slm.kinds.decisions as kd

    _, decider = tiny
    monkeypatch.setattr(kd, "LABEL_SETS", 3)
    planner = kd.DecisionPlanner(decider.tokenizer, decider.config, decider.max_length)
    first = planner.labels(("Yes", "No"))
    for i in range(6):
        planner.labels((f"a{i}", f"b{i}"))
        assert planner.labels(("Yes", "No")) is first  # used again: kept
    assert len(planner._labels) == 3
