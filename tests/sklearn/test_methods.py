"""The estimator's methods of fitting (`sklearn/methods.py`): each takes its own parameters, and refuses
another method's by name."""

from __future__ import annotations

import pytest

pytest.importorskip("sklearn")

from tests.sklearn.tickets import TEMPLATE  # noqa: E402


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
