"""What the Python API takes as texts (`text/inputs.py`): one `str` is one text, a DataFrame needs
`text_column=`, a missing text says missing, a window that would read nothing is refused; progress bars on stderr."""

from __future__ import annotations

import numpy as np
import pytest

from mlx_slm.classifier.classifier import Classifier
from tests.hostile import task_clf as _clf

pd = pytest.importorskip("pandas")


TEXTS = [
    "My card was charged twice for the same invoice.",
    "The mobile app crashes whenever I open the settings page.",
    "x",
    "I need to change the email address on my profile, it is old and I no longer use it at all.",
    "refund status please",
    "Why was I billed again?",
]


@pytest.fixture(scope="module")
def clf(tiny_qwen_mlx):
    return Classifier.load(str(tiny_qwen_mlx), batch_size=2)


def test_one_string_is_one_text(clf):
    one = clf.classify("My card was charged twice")
    assert len(one) == 1 and one[0].index == 0
    assert one[0].label == clf.classify(["My card was charged twice"])[0].label
    assert len(list(clf.classify_iter("hello"))) == 1
    assert len(list(clf.run("hello"))) == 1
    with pytest.raises(TypeError, match="bytes"):
        clf.classify(b"hello")
    with pytest.raises(TypeError, match="mapping"):
        clf.classify({"a": "hello"})


def test_dataframe_refused_without_text_column(clf):
    df = pd.DataFrame({"id": [1, 2, 3], "text": TEXTS[:3]})
    with pytest.raises(TypeError, match="text_column="):
        clf.classify(df)
    with pytest.raises(TypeError, match="text_column="):
        list(clf.classify_iter(df))
    got = clf.classify(df, text_column="text")
    assert [p.label for p in got] == [p.label for p in clf.classify(TEXTS[:3])]
    assert [p.label for p in clf.classify(df["text"])] == [p.label for p in got]  # a Series works
    with pytest.raises(KeyError, match="body"):
        clf.classify(df, text_column="body")
    with pytest.raises(TypeError, match="DataFrame"):
        clf.classify(TEXTS, text_column="text")


def test_texts_not_iterable_and_windows_that_read_nothing(engine):
    """classify(None) said "'NoneType' object is not iterable"; window=0 yielded no prediction
    at all for any input (every input row must give a row); window=-1 was islice's error."""
    clf = _clf(engine)
    for bad in (None, 5, 2.5):
        with pytest.raises(TypeError, match="texts must be an iterable of str"):
            clf.classify(bad)
    for w in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="window must be an integer from 1"):
            list(clf.classify_iter(["a", "b"], window=w))
        with pytest.raises(ValueError, match="window must be an integer"):
            clf.run(["a"], window=w)
        with pytest.raises(ValueError, match="window must be an integer"):
            clf.features(["a"], [1], window=w)
    assert [p.index for p in clf.classify_iter(["a", "b", "c"], window=np.int64(2))] == [0, 1, 2]


def test_missing_texts_say_missing(engine):
    """A NaN or None text in a frame was 'text must be a string, got float'."""
    pd = pytest.importorskip("pandas")
    clf = _clf(engine)
    df = pd.DataFrame({"text": ["my card was charged", float("nan"), None, "", 3]})
    out = clf.classify_frame(df)
    assert out["label"].notna().tolist() == [True, False, False, False, False]
    err = out["error"].tolist()
    assert "missing" in err[1] and "missing" in err[2] and "empty" in err[3] and "got int" in err[4]
    with pytest.raises(ValueError, match="2 columns named 'text'"):
        clf.classify_frame(pd.DataFrame([["a", "b"]], columns=["text", "text"]))


def test_progress_bar_on_stderr(clf, capsys):
    got = clf.classify(TEXTS, progress=True)
    err = capsys.readouterr().err
    assert f"{len(TEXTS)}/{len(TEXTS)}" in err and "mlx-slm" in err
    assert [p.index for p in got] == list(range(len(TEXTS)))
    assert [p.label for p in got] == [p.label for p in clf.classify(TEXTS)]
    list(clf.classify_iter(TEXTS, progress=True))
    assert f"{len(TEXTS)}/{len(TEXTS)}" in capsys.readouterr().err
    clf.classify_frame(pd.DataFrame({"text": TEXTS}), progress=True)
    assert f"{len(TEXTS)}/{len(TEXTS)}" in capsys.readouterr().err
