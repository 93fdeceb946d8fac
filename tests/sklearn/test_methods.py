"""The estimator's methods of fitting (`sklearn/methods.py`): each takes its own parameters, and refuses
another method's by name."""

from __future__ import annotations

import numpy as np
import pytest

from mlx_slm.text.workload import tickets

pytest.importorskip("sklearn")


LABELS = ("billing", "technical", "account")


SYSTEM, TEMPLATE = "You classify tickets into {labels}.", "Ticket: {text}\nCategory:"


def _labelled(n_per: int = 8, skip: int = 0):
    by: dict[str, list[str]] = {lab: [] for lab in LABELS}
    for t, lab in tickets(400)[skip:]:
        if len(by[lab]) < n_per:
            by[lab].append(t)
    rows = [(t, lab) for lab in LABELS for t in by[lab]]
    rng = np.random.default_rng(0)
    return [rows[i] for i in rng.permutation(len(rows))]


@pytest.fixture(scope="module")
def data():
    rows = _labelled(10)
    seen = {t for t, _ in rows}
    test = [t for t, _ in tickets(400) if t not in seen][:12]
    return [t for t, _ in rows], [lab for _, lab in rows], test


@pytest.mark.parametrize("method", ["finetune", "labels"])
@pytest.mark.parametrize("param", [{"layers": [2]}, {"layers": "all"}, {"pooling": "mean"}, {"pooling": "last"}])
def test_a_learned_heads_parameters_are_refused_by_the_other_methods(tiny_qwen_mlx, data, fresh, method, param):
    """layers= and pooling= choose a learned head's hidden states: method="finetune" (or
    "labels") reads none, so they are refused by name before the model loads (issue 40)."""
    from mlx_slm.sklearn import SLMClassifier

    X, y, _ = data
    name = next(iter(param))
    with pytest.raises(ValueError, match=rf"{name}=.* chooses a learned head's hidden states.*method='{method}'"):
        SLMClassifier(model=str(tiny_qwen_mlx), method=method, template=TEMPLATE, **param).fit(X, y)
    assert fresh["loads"] == 0
