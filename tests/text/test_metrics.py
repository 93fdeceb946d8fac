"""Evaluation metrics on a small hand-computed example.

Eight items, labels a, b, c (one abstention):

    item  gold  pred  conf   correct
    0     a     a     0.90   yes
    1     a     a     0.80   yes
    2     a     b     0.60   no
    3     b     b     0.70   yes
    4     b     -     -      (abstained)
    5     c     c     0.95   yes
    6     c     a     0.55   no
    7     c     c     0.65   yes

Confusion (answered only), rows gold:  a [2 1 0]  b [0 1 0]  c [1 0 2].
Support (all gold): a 3, b 2, c 3.
Precision: a 2/3, b 1/2, c 2/2.  Recall (abstention a miss): a 2/3, b 1/2, c 2/3.
F1: a 2/3, b 1/2, c 2*(1*2/3)/(1+2/3) = 4/5.  Macro-F1 = (2/3 + 1/2 + 4/5)/3 = 59/90.
Accuracy: answered 5/7, all 5/8; coverage 7/8.
ECE, 5 bins of width 0.2, answered items:
    (0.4, 0.6]: 0.55 x, 0.60 x        mean conf 0.575, acc 0  -> gap 0.575, 2 items
    (0.6, 0.8]: 0.65, 0.70, 0.80 ok   mean conf 0.7167, acc 1 -> gap 0.2833, 3 items
    (0.8, 1.0]: 0.90, 0.95 ok         mean conf 0.925, acc 1  -> gap 0.075, 2 items
    ECE = (2*0.575 + 3*(1 - 2.15/3) + 2*0.075)/7 = (1.15 + 0.85 + 0.15)/7 = 2.15/7
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from mlx_slm.jobs.evaluate import plot
from mlx_slm.text.metrics import (
    EvaluationError,
    accuracy,
    confusion,
    coverage_curve,
    ece,
    format_report,
    macro_f1,
    per_label,
    reliability,
    report,
    threshold_for_accuracy,
)

LABELS = ["a", "b", "c"]
GOLD = np.array([0, 0, 0, 1, 1, 2, 2, 2])
PRED = np.array([0, 0, 1, 1, -1, 2, 0, 2])
CONF = np.array([0.90, 0.80, 0.60, 0.70, 0.0, 0.95, 0.55, 0.65])
ANS = PRED >= 0
OK = (GOLD == PRED)[ANS]
CA = CONF[ANS]


def test_confusion_excludes_abstained():
    cm = confusion(GOLD, PRED, 3)
    assert cm.tolist() == [[2, 1, 0], [0, 1, 0], [1, 0, 2]]
    assert cm.sum() == 7


def test_per_label_and_macro_f1():
    cm = confusion(GOLD, PRED, 3)
    support = np.bincount(GOLD, minlength=3)
    per = per_label(cm, LABELS, support)
    assert per["a"] == pytest.approx({"precision": 2 / 3, "recall": 2 / 3, "f1": 2 / 3, "support": 3})
    assert per["b"] == pytest.approx({"precision": 1 / 2, "recall": 1 / 2, "f1": 1 / 2, "support": 2})
    assert per["c"] == pytest.approx({"precision": 1.0, "recall": 2 / 3, "f1": 4 / 5, "support": 3})
    assert macro_f1(cm, support) == pytest.approx(59 / 90)
    # without the full support, recall is over answered items: b is then 1/1
    assert per_label(cm, LABELS)["b"]["recall"] == 1.0
    assert per_label(cm, LABELS)["b"]["support"] == 1


def test_undefined_ratios_are_zero_and_absent_labels_left_out_of_macro():
    cm = confusion([0, 0, 1], [0, 1, 1], 3)  # label c: never gold, never predicted
    with np.errstate(all="raise"):
        per = per_label(cm, LABELS)
    assert per["c"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 0}
    # a: P 1, R 1/2, F1 2/3;  b: P 1/2, R 1, F1 2/3;  c left out
    assert macro_f1(cm) == pytest.approx(2 / 3)
    assert macro_f1(np.zeros((3, 3), dtype=int)) == 0.0


def test_accuracy_counts_abstained_as_wrong():
    assert accuracy(GOLD, PRED) == pytest.approx(5 / 8)
    assert accuracy([], []) == 0.0
    with pytest.raises(EvaluationError, match="8 items but pred has 7"):
        accuracy(GOLD, PRED[:-1])


def test_ece_and_reliability_by_hand():
    assert ece(CA, OK, bins=5) == pytest.approx(2.15 / 7)
    rel = reliability(CA, OK, bins=5)
    assert [r["count"] for r in rel] == [0, 0, 2, 3, 2]
    assert rel[2] == pytest.approx({"lo": 0.4, "hi": 0.6, "confidence": 0.575, "accuracy": 0.0, "count": 2})
    assert rel[3]["confidence"] == pytest.approx((0.65 + 0.7 + 0.8) / 3) and rel[3]["accuracy"] == 1.0
    assert rel[0]["confidence"] is None and rel[0]["accuracy"] is None
    # perfectly calibrated: ECE 0; always-confident and always-wrong: ECE 1
    assert ece([0.5, 0.5], [True, False], bins=10) == pytest.approx(0.0)
    assert ece([1.0, 1.0], [False, False]) == pytest.approx(1.0)
    # bins are right-closed: 0.7 belongs to (0.6, 0.7]
    assert reliability([0.7], [True], bins=10)[6]["count"] == 1
    assert ece([], []) == 0.0


def test_coverage_curve_by_hand():
    curve = coverage_curve(CA, OK, points=(1.0, 0.8, 0.5))
    assert [r["threshold"] for r in curve] == [0.55, 0.6, 0.7]
    assert [r["n"] for r in curve] == [7, 6, 4]
    assert [r["accuracy"] for r in curve] == pytest.approx([5 / 7, 5 / 6, 1.0])
    assert [r["coverage"] for r in curve] == pytest.approx([1.0, 6 / 7, 4 / 7])
    assert [r["target"] for r in curve] == [1.0, 0.8, 0.5]
    # default points: thresholds never rise as coverage grows
    full = coverage_curve(CA, OK)
    assert [r["target"] for r in full] == [1.0, 0.9, 0.8, 0.7, 0.6, 0.5]
    thr = [r["threshold"] for r in full]
    assert thr == sorted(thr)  # targets fall, so thresholds rise along the list
    assert coverage_curve([], []) == []


def test_coverage_curve_keeps_ties_together():
    curve = coverage_curve([0.9, 0.9, 0.5], [True, False, True], points=(1 / 3,))
    assert curve[0]["n"] == 2 and curve[0]["coverage"] == pytest.approx(2 / 3)
    assert curve[0]["accuracy"] == 0.5


def test_threshold_for_accuracy():
    assert threshold_for_accuracy(CA, OK, 1.0) == 0.65
    assert threshold_for_accuracy(CA, OK, 0.8) == 0.6
    assert threshold_for_accuracy(CA, OK, 0.72) == 0.6
    assert threshold_for_accuracy(CA, OK, 0.7) == 0.55
    assert threshold_for_accuracy(CA, OK, 1.01) is None
    # ties: at 0.9 both tied items are kept (1/2 right); the target is only met at 0.5 (2/3)
    assert threshold_for_accuracy([0.9, 0.9, 0.5], [True, False, True], 1.0) is None
    assert threshold_for_accuracy([0.9, 0.9, 0.5], [True, False, True], 0.6) == 0.5
    assert threshold_for_accuracy([], [], 0.5) is None


def _rep():
    gold = [LABELS[i] for i in GOLD]
    pred = [LABELS[i] if i >= 0 else None for i in PRED]
    conf = [float(c) if p is not None else None for c, p in zip(CONF, pred)]
    return report(gold, pred, conf, LABELS, bins=5)


def test_report():
    rep = _rep()
    assert set(rep) == {
        "n",
        "labels",
        "accuracy",
        "accuracy_all",
        "coverage",
        "abstained",
        "macro_f1",
        "per_label",
        "confusion",
        "ece",
        "reliability",
        "coverage_curve",
    }
    assert rep["n"] == 8 and rep["abstained"] == 1 and rep["labels"] == LABELS
    assert rep["accuracy"] == pytest.approx(5 / 7)
    assert rep["accuracy_all"] == pytest.approx(5 / 8)
    assert rep["coverage"] == pytest.approx(7 / 8)
    assert rep["macro_f1"] == pytest.approx(59 / 90)
    assert rep["ece"] == pytest.approx(2.15 / 7)
    assert rep["confusion"] == [[2, 1, 0], [0, 1, 0], [1, 0, 2]]
    assert rep["per_label"]["b"]["recall"] == 0.5 and rep["per_label"]["b"]["support"] == 2
    assert rep["coverage_curve"][0]["n"] == 7
    json.dumps(rep, allow_nan=False)  # JSON-safe


def test_report_errors():
    with pytest.raises(EvaluationError, match="gold label 'x' of item 0"):
        report(["x"], ["a"], [0.5], LABELS)
    with pytest.raises(EvaluationError, match="predicted label 'z' of item 0"):
        report(["a"], ["z"], [0.5], LABELS)
    with pytest.raises(EvaluationError, match="one entry per item"):
        report(["a", "b"], ["a"], [0.5], LABELS)
    with pytest.raises(EvaluationError, match="confidence of item 0"):
        report(["a"], ["a"], [1.5], LABELS)
    with pytest.raises(EvaluationError, match=r"pred indices must lie in \[0, 3\) or be -1"):
        confusion([0], [3], 3)


def test_report_all_abstained():
    rep = report(["a", "b"], [None, None], [None, None], LABELS)
    assert rep["accuracy"] == 0.0 and rep["coverage"] == 0.0 and rep["abstained"] == 2
    assert rep["coverage_curve"] == [] and rep["ece"] == 0.0
    assert "abstained 2" in format_report(rep)


def test_format_report():
    text = format_report(_rep())
    for lab in LABELS:
        assert f"\n{lab} " in text  # a per-label row and a confusion row each
    assert "accuracy 71.43 % (answered)" in text
    assert "62.50 % (all, abstained wrong)" in text
    assert "macro-F1 0.6556" in text and "ECE 0.3071" in text
    conf_rows = [ln.split() for ln in text.splitlines() if ln.split()[:1] in (["a"], ["b"], ["c"])]
    assert ["a", "2", "1", "0"] in conf_rows and ["c", "1", "0", "2"] in conf_rows
    assert "  50%" in text and "100.00%" in text


def test_plot_writes_two_pngs(tmp_path):
    paths = plot(_rep(), tmp_path / "plots")
    assert [p.name for p in paths] == ["confusion.png", "reliability.png"]
    for p in paths:
        data = p.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
