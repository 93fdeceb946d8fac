"""pandas frames in and out (`classifier/frames.py`): a DataFrame's texts classified, the predictions
added as the CSV output's columns (calibration and abstain included), a bad prefix named."""

from __future__ import annotations

import pytest

from tests.conftest import TICKET_TEXTS as TEXTS

pd = pytest.importorskip("pandas")


def test_classify_frame_columns(tiny_clf):
    df = pd.DataFrame({"id": ["a", "b", "c", "d"], "text": [TEXTS[0], "", None, TEXTS[1]]}, index=[10, 11, 12, 13])
    out = tiny_clf.classify_frame(df, text_column="text")
    assert list(out.index) == [10, 11, 12, 13] and "label" not in df.columns  # a copy
    assert list(out.columns) == ["id", "text", "label", "p_billing", "p_technical", "p_account", "truncated", "error"]
    want = tiny_clf.classify([TEXTS[0], TEXTS[1]])
    assert out.loc[10, "label"] == want[0].label and out.loc[13, "label"] == want[1].label
    assert abs(out.loc[10, "p_billing"] - want[0].probs["billing"]) < 1e-12
    assert str(out["p_billing"].dtype) == "float64" and str(out["truncated"].dtype) == "bool"
    assert "empty" in out.loc[11, "error"] and "string" in out.loc[12, "error"]
    assert pd.isna(out.loc[11, "p_billing"]) and pd.isna(out.loc[11, "label"])
    row_sums = out.loc[[10, 13], ["p_billing", "p_technical", "p_account"]].sum(axis=1)
    assert all(abs(s - 1) < 1e-9 for s in row_sums)


def test_classify_frame_names_a_prefix_that_is_not_a_string(tiny_clf):
    """Issue 26: prefix=5 raised a bare TypeError from inside (int + str)."""
    pd = pytest.importorskip("pandas")
    with pytest.raises(TypeError, match=r"classify_frame\(prefix=\.\.\.\) takes a string.*got int 5"):
        tiny_clf.classify_frame(pd.DataFrame({"text": ["hi"]}), prefix=5)


def test_classify_frame_calibration_and_abstain_columns(tiny_clf):
    df = pd.DataFrame({"text": TEXTS})
    out = tiny_clf.classify_frame(df, calibration="batch", min_confidence=0.99)
    for col in ("raw_p_billing", "raw_p_account", "calibration", "abstained"):
        assert col in out.columns
    ref = tiny_clf.classify(TEXTS, calibration="batch", min_confidence=0.99)
    assert list(out["label"]) == [p.label for p in ref]
    assert list(out["abstained"]) == [p.abstained for p in ref]
    assert set(out["calibration"]) == {"batch"}
    assert [round(v, 12) for v in out["raw_p_billing"]] == [round(p.raw_probs["billing"], 12) for p in ref]
    # a column already there is refused, and prefix= avoids it
    gold = pd.DataFrame({"text": TEXTS[:2], "label": ["billing", "technical"]})
    with pytest.raises(ValueError, match="prefix="):
        tiny_clf.classify_frame(gold)
    out = tiny_clf.classify_frame(gold, prefix="pred_")
    assert list(out["label"]) == ["billing", "technical"] and "pred_label" in out.columns
    with pytest.raises(KeyError, match="body"):
        tiny_clf.classify_frame(gold, text_column="body")
    with pytest.raises(TypeError, match="DataFrame"):
        tiny_clf.classify_frame(TEXTS)
