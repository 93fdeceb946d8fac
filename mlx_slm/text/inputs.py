"""What the Python API takes as texts, and how it hands predictions back to pandas.

The checks refuse inputs that would silently give wrong answers (one `str` iterated by
character, a DataFrame iterated by column name, bytes), tell missing texts apart without
importing pandas, and check `classify_frame`'s arguments (its rows come from
`records.RecordShape`). Kept apart from `Classifier` so the facade holds only the task's
settings and its public methods.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from ..ground.errors import MissingExtra
from ..ground.ranges import check
from .predictions import Prediction


def is_frame(x: Any) -> bool:
    """A pandas DataFrame (or one like it), told without importing pandas."""
    return type(x).__name__ == "DataFrame" and hasattr(x, "columns") and hasattr(x, "iloc")


def as_texts(texts: Any, text_column: str | None) -> Any:
    """`texts` as an iterable of texts, refusing what would silently give wrong answers:
    a single `str` is one text (iterating it would classify each character), a DataFrame
    needs `text_column` (iterating it gives its column names), bytes are not text."""
    if isinstance(texts, str):
        if text_column is not None:
            raise TypeError("text_column= goes with a pandas DataFrame; got a single string")
        return [texts]
    if isinstance(texts, (bytes, bytearray)):
        raise TypeError("texts are str, not bytes: decode them first (e.g. data.decode('utf-8'))")
    if is_frame(texts):
        if text_column is None:
            raise TypeError(
                "a pandas DataFrame iterates over its column names, not its rows: pass text_column='text' "
                "(the column holding the texts), or df['text'], or use classify_frame(df, text_column=...)"
            )
        if text_column not in texts.columns:
            raise KeyError(f"text_column={text_column!r} is not a column of the frame: name the column of texts")
        return list(texts[text_column])
    if text_column is not None:
        raise TypeError(f"text_column= goes with a pandas DataFrame; got {type(texts).__name__}")
    if isinstance(texts, Mapping):
        raise TypeError("a mapping iterates over its keys: pass the texts themselves (e.g. list(d.values()))")
    if not isinstance(texts, Iterable):
        raise TypeError(
            f"texts must be an iterable of str (a list, a pandas Series) or one str, got {type(texts).__name__}: "
            "e.g. classify(['My card was charged twice'])"
        )
    return texts


def check_window(window: Any) -> None:
    """A window of items is read, sorted and batched at a time: 0 would read nothing."""

    check("window", window, "window")  # a RangeError, a ValueError


def missing(x: Any) -> bool:
    """None, a float NaN, or pandas' NA/NaT: a missing text, told without importing pandas."""
    if x is None or (isinstance(x, float) and x != x):
        return True
    return type(x).__name__ in ("NAType", "NaTType")


def with_progress(preds: Iterator[Prediction], total: int | None) -> Iterator[Prediction]:
    """A tqdm bar on stderr, one step per prediction (they come a batch at a time)."""
    with progress_bar(total) as bar:
        for p in preds:
            bar.update(1)
            yield p


def progress_bar(total: int | None, desc: str = "mlx-slm") -> Any:
    """A tqdm bar on stderr (tqdm.auto: a widget in a notebook), counting items."""
    try:
        from tqdm.auto import tqdm  # lazy: only for a bar
    except ImportError:
        raise MissingExtra("progress=True needs tqdm: pip install tqdm") from None

    return tqdm(total=total, unit="item", file=sys.stderr, desc=desc)


def check_frame(df: Any, text_column: str, prefix: Any) -> None:
    """`classify_frame`'s arguments: a DataFrame holding one column of texts, and a string prefix."""
    if not is_frame(df):
        raise TypeError(f"classify_frame takes a pandas DataFrame, got {type(df).__name__}: use classify()")
    if text_column not in df.columns:
        raise KeyError(
            f"text_column={text_column!r} is not a column of the frame (its columns: "
            f"{', '.join(map(str, list(df.columns)[:10]))}): name the column holding the texts"
        )
    if list(df.columns).count(text_column) > 1:
        raise ValueError(
            f"the frame has {list(df.columns).count(text_column)} columns named {text_column!r}: rename them"
        )
    if not isinstance(prefix, str):  # `prefix + name` would raise a bare TypeError further on
        raise TypeError(
            f"classify_frame(prefix=...) takes a string put before each new column's name "
            f"(e.g. prefix='pred_'), got {type(prefix).__name__} {prefix!r}"
        )


def check_new_columns(df: Any, names: Sequence[str], prefix: str) -> None:
    """Refuse to overwrite a column `df` already has."""
    clash = [prefix + c for c in names if prefix + c in df.columns]
    if clash:
        raise ValueError(
            f"the frame already has a column {clash[0]!r}: pass prefix='pred_' (or another) to "
            "classify_frame so the predictions do not overwrite it"
        )
