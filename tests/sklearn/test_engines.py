"""One loaded engine per process and the hidden states already computed (`sklearn/engines.py`): every
clone of an estimator shares them, each text run once."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("sklearn")

from tests.sklearn.tickets import LABELS, SYSTEM, TEMPLATE  # noqa: E402


def test_feature_cache_runs_each_text_once_and_gives_its_features(tiny_qwen_mlx, data, fresh):
    from mlx_slm import Classifier
    from mlx_slm.sklearn import FeatureCache, shared_engine

    X, _, _ = data
    clf = Classifier(shared_engine(str(tiny_qwen_mlx)), LABELS, SYSTEM, TEMPLATE, features_only=True)
    direct, _, _ = clf.features(X, [1, 2], poolings=("last", "mean"))
    cache = FeatureCache()
    got, errors, st = cache.features(clf, X[:10], [1, 2], ("last", "mean"))
    assert st.items == 10 and errors == [None] * 10 and len(cache) == 10
    got, errors, st = cache.features(clf, X, [2], ("mean",))  # 10 held, the rest run
    assert st.items == len(X) - 10
    np.testing.assert_allclose(got["mean"], direct["mean"][:, 1:], atol=1e-4)
    got, _, st = cache.features(clf, X[9::-1], [1, 2], ("last",))  # all held: nothing runs
    assert st.items == 0
    np.testing.assert_allclose(got["last"], direct["last"][9::-1], atol=1e-4)
    assert cache.features(clf, X, [1], ("last",))[2].items == len(X) - 10  # the others lack that part
    other = Classifier(clf.engine, LABELS, "Another prompt.", TEMPLATE, features_only=True)
    assert cache.features(other, X[:3], [1], ("last",))[2].items == 3  # another prompt: other features
    small = FeatureCache(max_bytes=4 * 64 * 3)  # three vectors of 64 floats
    small.features(clf, X[:5], [1], ("last",))
    assert len(small) == 3
    _, errors, _ = cache.features(clf, ["ok", "  "], [1], ("last",))
    assert errors[0] is None and "empty" in errors[1]
