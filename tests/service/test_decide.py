"""service/decide: one failing request of a micro-batch fails alone (`DecisionRun`)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from mlx_slm.service.decide import DecisionRun, QueuedDecision
from mlx_slm.text.decisions.errors import DecisionError


class FakeDecider:
    """Answers each request, except that a batch holding "bug" raises a RuntimeError and one
    holding "long" a DecisionError (as the worker's Decider can, found only when it runs)."""

    def run_items(self, requests):
        if "bug" in requests:
            raise RuntimeError("a bug for this request")
        if "long" in requests:
            raise DecisionError(("body", "state"), "over the context", "tokens_exceeded")
        return [SimpleNamespace(request=r, input_tokens=3, cached_tokens=0) for r in requests]


@pytest.mark.parametrize("bad, kind", [("bug", RuntimeError), ("long", DecisionError)])
def test_one_failing_request_fails_alone(bad, kind):
    items = [QueuedDecision(r, r, index=i) for i, r in enumerate(["a", bad, "b"])]
    got = {d.index: d.result for d in DecisionRun(FakeDecider(), items)}
    assert isinstance(got[1], kind)
    assert got[0].request == "a" and got[2].request == "b"


def test_a_bug_in_a_batch_of_one_is_the_batchs_failure():
    """Alone, a bug fails the batch as a classifier's does (the scheduler answers it: 500)."""
    with pytest.raises(RuntimeError):
        list(DecisionRun(FakeDecider(), [QueuedDecision("bug", "bug")]))
