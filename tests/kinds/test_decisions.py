"""Decisions on an engine (`kinds/decisions.py`): a request's questions as branches after its state;
the planner keeps a bounded LRU of label sets."""

from __future__ import annotations


def test_the_planner_keeps_a_bounded_lru_of_label_sets(yesno_decider, monkeypatch):
    """Beyond 26 options the labels are the option names: a long-lived server sees ever new ones,
    so the planner keeps at most `LABEL_SETS` label sets, the most recently used."""
    import mlx_slm.kinds.decisions as kd

    _, decider = yesno_decider
    monkeypatch.setattr(kd, "LABEL_SETS", 3)
    planner = kd.DecisionPlanner(decider.tokenizer, decider.config, decider.max_length)
    first = planner.labels(("Yes", "No"))
    for i in range(6):
        planner.labels((f"a{i}", f"b{i}"))
        assert planner.labels(("Yes", "No")) is first  # used again: kept
    assert len(planner._labels) == 3


def test_a_feature_tap_of_other_layers_is_another_reader():
    """A state cache keys a variant's answer by what reads it: taps of other layers never share one."""
    from mlx_slm.kinds.decisions import FeatureTap

    assert FeatureTap((3,)).sha256 != FeatureTap((5, 7)).sha256
    assert FeatureTap((5, 7)).sha256 == FeatureTap((5, 7)).sha256
