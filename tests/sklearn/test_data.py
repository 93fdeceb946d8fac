"""What the estimator's `fit` and `predict` take (`sklearn/data.py`), checked before any model loads: X as
texts, y as labels, the examples and the template, a `ValueError` naming what is wrong."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize(
    ("params", "words"),
    [({"examples": [("a",)]}, ["example 1", "(text, label) pair"]),
     ({"examples": [("charged twice", "zzz")]}, ["example 1", "'zzz' is not one of the labels"]),
     ({"examples": [(3, "x")]}, ["example 1", "its text is int"]),
     ({"examples": "charged,x"}, ["examples must be a list"]),
     ({"template": "Ticket:"}, ["no {text} placeholder"]),
     ({"template": "{text} {labels}"}, ["{labels}"])],
)  # fmt: skip
def test_the_estimator_checks_examples_and_template_at_fit_before_any_model(params, words, tmp_path):
    pytest.importorskip("sklearn")
    from mlx_slm.sklearn import SLMClassifier

    est = SLMClassifier(model=str(tmp_path / "no-model"), method="labels", **params)
    with pytest.raises(ValueError) as e:
        est.fit(["charged twice", "app crashes", "card lost", "login fails"], ["x", "y", "x", "y"])
    for w in words:
        assert w in str(e.value), (w, str(e.value))
    assert "no-model" not in str(e.value)
