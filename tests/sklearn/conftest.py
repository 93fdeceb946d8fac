"""The estimator's tests share a count of the engines it loads and the feature rows it computes."""

from __future__ import annotations

import pytest


@pytest.fixture()
def fresh(monkeypatch):
    """No engine held by the estimator's cache; counts `Engine.load` calls and feature rows."""
    from mlx_slm import sklearn as sk
    from mlx_slm.engine.engine import Engine

    sk.clear_engines()
    counts = {"loads": 0, "feature_rows": 0}
    load, features = Engine.load.__func__, Engine.features

    def counting_load(cls, *a, **k):
        counts["loads"] += 1
        return load(cls, *a, **k)

    def counting_features(self, batch, *a, **k):
        counts["feature_rows"] += len(batch.ids)
        return features(self, batch, *a, **k)

    monkeypatch.setattr(Engine, "load", classmethod(counting_load))
    monkeypatch.setattr(Engine, "features", counting_features)
    yield counts
    sk.clear_engines()


@pytest.fixture(scope="module")
def data():
    """(texts, labels, texts to predict): `tickets.train_and_test`, once per module."""
    from tests.sklearn.tickets import train_and_test

    return train_and_test()
