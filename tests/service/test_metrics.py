"""The service's measures (`service/metrics.py`): counters and histograms, and the compute-time estimate
that prices an item's attention by the model's shape (causal, a cached start whole)."""

from __future__ import annotations

import math

import pytest

from mlx_slm.service import RateTracker
from mlx_slm.service.decide import QueuedDecision
from mlx_slm.service.keys import DECIDE_KEY
from mlx_slm.service.metrics import ATTENTION_TIME, attention_share
from tests.service.test_scheduler import job, scheduler

# ----------------------------------------------------------------------------- the estimate


def test_attention_is_weighed_causally_and_a_cached_start_whole():
    """A row of n fresh tokens attends n / 2 keys per token on average; n new tokens after c
    cached ones attend c + n / 2; a batch of rows of length L, L / 2 each."""
    t = RateTracker(attention=1e-4)
    c = ATTENTION_TIME * 1e-4
    assert t.weighted(4000) == pytest.approx(4000 * (1 + c * 2000))
    assert t.weighted(1000, 5000) == pytest.approx(1000 * (1 + c * 4500))  # 4,000 cached, 1,000 new
    assert t.weighted(8 * 300, 300) == pytest.approx(2400 * (1 + c * 150))  # 8 rows of 300
    t.observe(100, 1.0)
    w = t.tokens_within(30.0)
    assert t.estimate(w) <= 30.0 + 1e-9 < t.estimate(w + 2)  # the budget: the longest row that fits


def test_a_decision_request_is_priced_without_the_start_its_state_cache_holds():
    """jevcompat's ladder asks 128 options, then 255 of which the first 127 are the same: the
    worker's state cache holds that start, so the 255-option request runs (and is priced at)
    the rest only; with the cache off, its whole cost."""
    from mlx_slm.service.decide import DecisionTask

    class States:
        def __init__(self, entries, held):
            self.entries, self.held, self.asked = entries, held, []

        def get(self, tokens, cache_key=None, floor=0):
            self.asked.append((len(tokens), cache_key, floor))
            return object(), self.held

    class Decider:
        def __init__(self, states):
            self.states, self.planner = states, type("Planner", (), {"head": [1, 2, 3]})()

    class Request:
        cache_key = "conversation-1"

    prepared = type("Prepared", (), {"ids": list(range(5610))})()
    item = QueuedDecision(Request(), prepared, cost=5642, longest=5610)
    on = States(64, 2751)
    assert DecisionTask(Decider(on)).work(item) == 5642 - 2751 and on.asked == [(5610, "conversation-1", 3)]
    assert DecisionTask(Decider(States(0, 2751))).work(item) == 5642  # the cache is off
    s = scheduler()
    j = job(1, ("state",))
    s.submit(j, [item], DECIDE_KEY, [5642], [False], [5642 - 2751])
    assert s.queue[0].tokens_run == 2891 and s.queue[0].cost == 5642  # priced on what runs; budgeted whole


pytest.importorskip("starlette")


pytest.importorskip("uvicorn")


# ----------------------------------------------------------------------------- long items, deadlines


def test_the_time_estimate_prices_attention_by_the_models_shape():
    class Args:
        hidden_size, intermediate_size, num_attention_heads, num_key_value_heads, head_dim = 896, 4864, 14, 2, 64

    a = attention_share(Args())
    assert math.isclose(a, 2 * 14 * 64 / (896 * 896 * 2 + 2 * 896 * 128 + 3 * 896 * 4864))  # Qwen2.5-0.5B: ~1.2e-4
    assert attention_share(object()) == 0.0  # a shape it cannot read: linear, as before
    t = RateTracker(attention=a)
    t.observe(10, 0.1)
    t.observe(80, 0.4)
    linear = t.fixed + t.per_token * 8161
    # causal: each token attends half the row's keys on average, at attention's own cost per multiply-add
    assert t.estimate(8161) == pytest.approx(t.fixed + t.per_token * 8161 * (1 + ATTENTION_TIME * a * 8161 / 2))
    assert t.estimate(8161) > 1.6 * linear  # an 8k-token item costs well over its tokens at the linear rate
    assert t.estimate(10) == pytest.approx(0.1, rel=0.01)  # the short end is what was measured
    w = t.tokens_within(30.0)
    assert t.estimate(w) <= 30.0 + 1e-9 < t.estimate(w + 2)  # the budget: the longest row that fits
