"""One loaded engine per process, and the hidden states already computed: what every clone of an
estimator shares (scikit-learn clones an estimator for every fold and grid candidate)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..engine.engine import Engine
from ..text.predictions import Stats
from ..weights.registry import ModelRef

_ENGINES: dict[tuple[str, str | None], Any] = {}  # (model as given, dtype) -> Engine
_LOCK = threading.Lock()


def shared_engine(model: str | Path, dtype: str | None = None) -> Any:
    """The process's one loaded `Engine` for `model` (a name or path) in `dtype`.

    Loaded on first use (under a lock: clones fitted in threads wait for one load, not
    several), then shared by every estimator and clone. Two names for the same weights
    share one engine too: after a load, an engine already held with the same weights
    sha256 and dtype is kept and the new one dropped."""
    key = (str(model), dtype)
    with _LOCK:
        engine = _ENGINES.get(key)
        if engine is None:
            engine = Engine.load(ModelRef(str(model), dtype))
            same = [
                e
                for e in _ENGINES.values()
                if e.weights_sha256 is not None
                and e.weights_sha256 == engine.weights_sha256
                and e.compute_dtype == engine.compute_dtype
            ]
            engine = same[0] if same else engine
            _ENGINES[key] = engine
        return engine


def clear_engines() -> None:
    """Forget the loaded engines and the features computed on them (their memory goes once
    no estimator holds a classifier on them)."""
    with _LOCK:
        _ENGINES.clear()
    FEATURES.clear()


FEATURE_CACHE_BYTES = 1 << 30  # hidden states kept: 300 texts x 8 layers x 2 poolings x 896 floats is 17 MB


class FeatureCache:
    """The hidden states already computed, per (engine, prompt, text) and (layer, pooling).

    Model selection fits one estimator many times on overlapping texts: the folds of
    `cross_val_score` share most of their training texts, and every `GridSearchCV`
    candidate sees the same folds. The forward pass is the cost; the head's fit on its
    features is cheap. So the estimator asks here first, and runs only the texts (or the
    parts) not seen yet: each text runs about once however many folds and candidates
    there are. Keys hold the engine itself (identity), the prompt as the classifier
    renders it (system, template, examples, truncation, context): another prompt is
    another text. Least recently used texts go past `max_bytes`. A cached text's
    numbers come from the batch it first ran in; batching changes them only in float
    rounding (left padding and RoPE offsets keep each row's maths its own)."""

    def __init__(self, max_bytes: int = FEATURE_CACHE_BYTES):
        self.max_bytes = max_bytes
        self._rows: OrderedDict[tuple[Any, ...], dict[tuple[int, str], np.ndarray]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def clear(self) -> None:
        with self._lock:
            self._rows.clear()
            self._bytes = 0

    def __len__(self) -> int:
        return len(self._rows)

    def features(
        self,
        clf: Any,
        texts: Sequence[str],
        layers: Sequence[int],
        poolings: Sequence[str],
        window: int = 1024,
        progress: bool = False,
    ) -> tuple[dict[str, np.ndarray], list[str | None], Any]:
        """As `Classifier.features` returns them; the run's `Stats` count the texts run now."""
        layers, poolings = list(layers), tuple(poolings)
        f = clf.format
        prompt = (clf.engine, f.system, f.template, f.examples, clf.truncate, clf.max_length)
        parts = [(x, p) for p in poolings for x in layers]
        with self._lock:
            held = [self._rows.get((prompt, t)) for t in texts]
            for t, h in zip(texts, held):
                if h is not None:
                    self._rows.move_to_end((prompt, t))
        todo = [i for i, h in enumerate(held) if h is None or any(k not in h for k in parts)]
        errors: list[str | None] = [None] * len(texts)
        st = Stats()
        if todo:
            got, errs, st = clf.features([texts[i] for i in todo], layers, window, poolings, progress=progress)
            with self._lock:
                for j, i in enumerate(todo):
                    if errs[j] is not None:
                        errors[i] = errs[j]
                        continue
                    entry = self._rows.setdefault((prompt, texts[i]), {})
                    for c, x in enumerate(layers):
                        for p in poolings:
                            if (x, p) not in entry:
                                entry[(x, p)] = got[p][j, c].copy()  # a copy: the batch's array can go
                                self._bytes += entry[(x, p)].nbytes
                    held[i] = entry
                while self._bytes > self.max_bytes and len(self._rows) > 1:
                    _, old = self._rows.popitem(last=False)
                    self._bytes -= sum(a.nbytes for a in old.values())
        dim = int(clf.model.args.hidden_size)
        out = {p: np.full((len(texts), len(layers), dim), np.nan, dtype=np.float32) for p in poolings}
        for i, h in enumerate(held):
            if errors[i] is None and h is not None:
                for c, x in enumerate(layers):
                    for p in poolings:
                        out[p][i, c] = h[(x, p)]
        return out, errors, st


FEATURES = FeatureCache()
