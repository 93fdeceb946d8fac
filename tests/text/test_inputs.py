"""What the Python API takes as texts (`text/inputs.py`): one `str` is one text, a DataFrame needs
`text_column=`, a missing text says missing, a window that would read nothing is refused; progress bars on stderr."""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import TICKET_TEXTS as TEXTS
from tests.hostile import task_clf as _clf

pd = pytest.importorskip("pandas")


def test_one_string_is_one_text(tiny_clf):
    one = tiny_clf.classify("My card was charged twice")
    assert len(one) == 1 and one[0].index == 0
    assert one[0].label == tiny_clf.classify(["My card was charged twice"])[0].label
    assert len(list(tiny_clf.classify_iter("hello"))) == 1
    assert len(list(tiny_clf.run("hello"))) == 1
    with pytest.raises(TypeError, match="bytes"):
        tiny_clf.classify(b"hello")
    with pytest.raises(TypeError, match="mapping"):
        tiny_clf.classify({"a": "hello"})


def test_dataframe_refused_without_text_column(tiny_clf):
    df = pd.DataFrame({"id": [1, 2, 3], "text": TEXTS[:3]})
    with pytest.raises(TypeError, match="text_column="):
        tiny_clf.classify(df)
    with pytest.raises(TypeError, match="text_column="):
        list(tiny_clf.classify_iter(df))
    got = tiny_clf.classify(df, text_column="text")
    assert [p.label for p in got] == [p.label for p in tiny_clf.classify(TEXTS[:3])]
    assert [p.label for p in tiny_clf.classify(df["text"])] == [p.label for p in got]  # a Series works
    with pytest.raises(KeyError, match="body"):
        tiny_clf.classify(df, text_column="body")
    with pytest.raises(TypeError, match="DataFrame"):
        tiny_clf.classify(TEXTS, text_column="text")


def test_texts_not_iterable_and_windows_that_read_nothing(engine):
    """classify(None) said "'NoneType' object is not iterable"; window=0 yielded no prediction
    at all for any input (every input row must give a row); window=-1 was islice's error."""
    tiny_clf = _clf(engine)
    for bad in (None, 5, 2.5):
        with pytest.raises(TypeError, match="texts must be an iterable of str"):
            tiny_clf.classify(bad)
    for w in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="window must be an integer from 1"):
            list(tiny_clf.classify_iter(["a", "b"], window=w))
        with pytest.raises(ValueError, match="window must be an integer"):
            tiny_clf.run(["a"], window=w)
        with pytest.raises(ValueError, match="window must be an integer"):
            tiny_clf.features(["a"], [1], window=w)
    assert [p.index for p in tiny_clf.classify_iter(["a", "b", "c"], window=np.int64(2))] == [0, 1, 2]


def test_missing_texts_say_missing(engine):
    """A NaN or None text in a frame was 'text must be a string, got float'."""
    pd = pytest.importorskip("pandas")
    tiny_clf = _clf(engine)
    df = pd.DataFrame({"text": ["my card was charged", float("nan"), None, "", 3]})
    out = tiny_clf.classify_frame(df)
    assert out["label"].notna().tolist() == [True, False, False, False, False]
    err = out["error"].tolist()
    assert "missing" in err[1] and "missing" in err[2] and "empty" in err[3] and "got int" in err[4]
    with pytest.raises(ValueError, match="2 columns named 'text'"):
        tiny_clf.classify_frame(pd.DataFrame([["a", "b"]], columns=["text", "text"]))


def test_progress_bar_on_stderr(tiny_clf, capsys):
    got = tiny_clf.classify(TEXTS, progress=True)
    err = capsys.readouterr().err
    assert f"{len(TEXTS)}/{len(TEXTS)}" in err and "mlx-slm" in err
    assert [p.index for p in got] == list(range(len(TEXTS)))
    assert [p.label for p in got] == [p.label for p in tiny_clf.classify(TEXTS)]
    list(tiny_clf.classify_iter(TEXTS, progress=True))
    assert f"{len(TEXTS)}/{len(TEXTS)}" in capsys.readouterr().err
    tiny_clf.classify_frame(pd.DataFrame({"text": TEXTS}), progress=True)
    assert f"{len(TEXTS)}/{len(TEXTS)}" in capsys.readouterr().err
