"""A decision request's problems (`text/decisions/errors.py`): each with FastAPI's `loc` and a `type`,
all of a request's problems reported at once."""

from __future__ import annotations

import pytest

from mlx_slm.text.decisions.errors import DecisionErrors, details
from mlx_slm.text.decisions.systemone import parse_systemone


def test_several_problems_reported_at_once():
    with pytest.raises(DecisionErrors) as e:
        parse_systemone({"questions": {"a": {"type": "x"}, "b": {"type": "choice"}}})
    locs = [d["loc"] for d in details(e.value)]
    assert ["body", "model"] in locs and ["body", "state"] in locs and ["body", "questions", "b", "criteria"] in locs
