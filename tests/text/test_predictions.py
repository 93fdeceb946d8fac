"""What a run gives back (`text/predictions.py`): a `Prediction` is ok until it carries an error,
and a run's `Stats` give its rates and shares (zero, never a division by zero, on an empty run)."""

from __future__ import annotations

import pytest

from mlx_slm.text.predictions import Item, Prediction, Stats


def test_a_prediction_is_ok_until_it_carries_an_error():
    assert Prediction(0, "billing", {"billing": 0.9, "bug": 0.1}).ok
    bad = Prediction(3, error="text is empty")
    assert not bad.ok and bad.label is None and bad.probs == {} and bad.answers is None


def test_stats_rates_and_shares():
    s = Stats(items=10, seconds=2.0, prompt_tokens=400, processed_tokens=300, padding_tokens=30,
              prefix_saved_tokens=100, label_tokens=20, batches=3)  # fmt: skip
    assert s.items_per_s == 5.0 and s.padding_pct == pytest.approx(10.0) and s.prefix_saved_pct == pytest.approx(25.0)
    d = s.as_dict()
    assert d["items_per_s"] == 5.0 and d["padding_pct"] == 10.0 and d["prefix_saved_pct"] == 25.0
    assert list(d) == ["items", "errors", "seconds", "items_per_s", "prompt_tokens", "processed_tokens",
                       "padding_tokens", "padding_pct", "prefix_saved_tokens", "prefix_saved_pct", "label_tokens",
                       "batches"]  # fmt: skip
    empty = Stats()
    assert empty.items_per_s == 0.0 and empty.padding_pct == 0.0 and empty.prefix_saved_pct == 0.0


def test_an_item_continues_the_shared_head_unless_it_has_its_own():
    item = Item(0, [5, 6, 7])
    assert item.prefix is None and item.chains == [] and item.skip == 0 and item.error is None
    assert Item(1, [8], prefix=(1, 2)).prefix == (1, 2)
