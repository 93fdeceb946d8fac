"""What `fit` and `predict` take, checked: X as texts, y as labels, the classes; a `ValueError`
naming the row and the fix for anything else (scikit-learn's convention)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from sklearn.utils.multiclass import check_classification_targets

from ..text.inputs import missing


def is_frame(x: Any) -> bool:
    return type(x).__name__ == "DataFrame" and hasattr(x, "columns") and hasattr(x, "iloc")


def column(x: Any, what: str) -> list[Any]:
    """A list, 1-D array, pandas Series, one-column DataFrame or (n, 1) array as a list."""
    if x is None:
        raise ValueError(f"{what} is None: give a sequence (a list, a NumPy array or a pandas Series)")
    if isinstance(x, (str, bytes, bytearray)):
        raise ValueError(
            f"{what} is one {type(x).__name__}: give a sequence of them, e.g. [{x[:30]!r}] (one item a row)"
        )
    if is_frame(x):
        if x.shape[1] != 1:
            raise ValueError(
                f"{what} is a DataFrame of {x.shape[1]} columns: select the one column it should be "
                "(df['text']), or let a ColumnTransformer pass that column"
            )
        x = x.iloc[:, 0]
    if hasattr(x, "to_numpy") and not isinstance(x, np.ndarray):  # a pandas Series (keeps None/NaN as they are)
        x = x.to_numpy(dtype=object)
    if hasattr(x, "toarray"):
        raise ValueError(f"{what} is a sparse matrix: give texts (a list, a NumPy array or a pandas Series)")
    if isinstance(x, np.ndarray):
        if x.ndim == 2 and x.shape[1] == 1:
            x = x[:, 0]
        if x.ndim != 1:
            raise ValueError(f"{what} has shape {x.shape}: give one item a row (a 1-D array, or a single column)")
        return x.tolist()
    try:
        return list(x)
    except TypeError:
        raise ValueError(
            f"{what} must be a sequence (a list, a NumPy array, a pandas Series), not {type(x).__name__}"
        ) from None


def texts_of(X: Any) -> list[str]:
    """X as a list of non-empty str; anything else is a `ValueError` naming the row."""
    texts = column(X, "X")
    if not texts:
        raise ValueError("X holds no texts (0 rows): give at least one")
    for i, t in enumerate(texts):
        if isinstance(t, (bytes, bytearray)):
            raise ValueError(f"X row {i} is bytes, not text: decode it first (e.g. x.decode('utf-8'))")
        if missing(t):
            raise ValueError(f"X row {i}: the text is missing (None/NaN): fill it in, or drop the row")
        if not isinstance(t, str):
            raise ValueError(f"X row {i} is {type(t).__name__} {t!r:.40}, not a text (str): X holds texts")
        if not t.strip():
            raise ValueError(f"X row {i}: the text is empty: give it some text, or drop the row")
    return [str(t) for t in texts]


def targets(y: Any, n: int) -> np.ndarray:
    """y as a 1-D array of labels (strings or integers), one per text."""
    if y is None:
        raise ValueError("requires y to be passed, but the target y is None: give each text its label")
    got = column(y, "y")
    if len(got) != n:
        raise ValueError(f"X has {n} texts but y has {len(got)} labels: give one label per text")
    for i, v in enumerate(got):
        if isinstance(v, (bytes, bytearray)):
            raise ValueError(f"y row {i} is bytes: give labels as str (decode them) or integers")
        if missing(v):
            raise ValueError(f"y row {i}: the label is missing (None/NaN): give every text its label, or drop the row")
        if isinstance(v, (list, tuple, dict, set, np.ndarray)):
            raise ValueError(f"y row {i} is a {type(v).__name__}: one label per text (multi-label is not supported)")
    kinds = {"str" if isinstance(v, str) else type(v).__name__ for v in got}
    if "str" in kinds and len(kinds) > 1:
        raise ValueError(
            f"y mixes label types ({', '.join(sorted(kinds))}): give every label as str, or every one as int"
        )
    arr = np.asarray(got)
    check_classification_targets(arr)  # floats with fractions: "Unknown label type: continuous"
    return arr


def label_key(v: Any) -> Any:
    """A label as compared with `labels=`: numpy scalars as Python values."""
    return v.item() if isinstance(v, np.generic) else v


def classes_of(
    y: Any, n: int, labels: Sequence[Any] | None, zero_shot: bool = False, calibration: str = "none"
) -> tuple[np.ndarray, list[str], list[str] | None]:
    """`fit`'s classes (`labels` or the sorted values of `y`), their names as text, and each of
    the `n` texts' gold label as text (None: `zero_shot` labels given without `y`)."""
    if zero_shot and y is None and labels is not None:
        if calibration in ("fit", "em"):
            raise ValueError(f"calibration={calibration!r} is fitted on labelled texts: give y")
        classes = np.asarray(list(labels))
        gold = None
    else:
        y_arr = targets(y, n)
        classes = np.unique(y_arr) if labels is None else np.asarray(list(labels))
        if labels is not None:
            known = {label_key(c) for c in classes}
            for i, v in enumerate(y_arr.tolist()):
                if label_key(v) not in known:
                    raise ValueError(
                        f"y row {i}: label {v!r} is not in labels={list(classes.tolist())[:8]}: add it to "
                        "labels, or drop the row"
                    )
        if len(classes) < 2:
            raise ValueError(
                f"y has one class ({classes[0]!r}): a classifier needs examples of at least two classes"
                if len(classes)
                else "y has no class: give labelled texts"
            )
        gold = [str(v) for v in y_arr.tolist()]
    names = [str(c) for c in classes.tolist()]
    if len(set(names)) != len(names):
        raise ValueError(f"labels {names[:8]} repeat once written as text: give distinct labels")
    return classes, names, gold
