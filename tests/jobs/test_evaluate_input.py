"""`eval` on hostile predictions (wrong types) and a plots folder that is missing or unusable:
a clear error (exit 2), never a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mlx_slm.cli import BUG_REPORT
from tests.hostile import cli, refused, write

GOLD = [("a", "My card was charged twice.", "billing"), ("b", "The app crashes on start.", "technical")]


def _gold(tmp_path: Path) -> Path:
    return write(
        tmp_path / "gold.jsonl", "".join(json.dumps({"id": i, "text": t, "label": g}) + "\n" for i, t, g in GOLD)
    )


def _pred(i: str, label: str = "billing", probs=None) -> dict:
    return {"id": i, "label": label, "probs": probs or {"billing": 0.7, "technical": 0.2, "account": 0.1}}


def test_eval_predictions_with_wrong_types(tmp_path):
    gold = _gold(tmp_path)
    good = [_pred("a"), _pred("b", "technical")]
    cases = {
        "strprob.jsonl": (
            json.dumps(_pred("a", probs={"billing": "0.9"})) + "\n" + json.dumps(good[1]) + "\n",
            ["line 1", "'probs'", "'0.9'"],
        ),
        "array.jsonl": ("[1, 2]\n" + json.dumps(good[1]) + "\n", ["line 1", "JSON list"]),
        "label.jsonl": (json.dumps({**good[0], "label": 3}) + "\n" + json.dumps(good[1]) + "\n", ["'label'"]),
        "probs.jsonl": (json.dumps({**good[0], "probs": [0.5]}) + "\n" + json.dumps(good[1]) + "\n", ["'probs'"]),
        "nan.jsonl": (
            json.dumps(_pred("a", probs={"billing": float("nan")})) + "\n" + json.dumps(good[1]),
            ["nan is not"],
        ),
        "deep.jsonl": ("[" * 50_000 + "\n" + json.dumps(good[1]) + "\n", ["line 1", "nested too deeply"]),
        "bytes.jsonl": (b"\xff\n", ["line 1"]),
        "p.csv": (
            "id,label,p_billing,p_technical,p_account,truncated,line,error\na,billing,high,0.1,0.1,,,\n",
            ["line 2", "'p_billing'", "'high'", "not a number"],
        ),
        "extra.csv": ("id,label,p_billing\na,billing,0.5,0.5\n", ["line 2", "more fields"]),
        "noid.csv": ("x,y\n1,2\n", ["no 'id' column"]),
        "ff.csv": (b"id,label\na,b\xff\n", ["line 2", "UTF-8"]),
        "quote.tsv": ("id\tlabel\n" + '"' + "x" * (3 << 20) + "\n", ["not valid CSV"]),  # past any field limit
    }
    for name, (data, words) in cases.items():
        p = write(tmp_path / name, data)
        r = cli("eval", str(gold), "--predictions", str(p), "--labels", "billing,technical,account")
        refused(r, f"--predictions {p}", *words)
    p = write(tmp_path / "ok.jsonl", "".join(json.dumps(x) + "\n" for x in good))
    r = cli("eval", str(gold), "--predictions", str(p), "--labels", "billing,technical,account")
    assert r.exit_code == 0 and "accuracy 100.00 %" in r.output, r.output


def test_eval_plots_folder_missing_is_made_and_unusable_is_refused(tmp_path):
    pytest.importorskip("matplotlib")
    gold = _gold(tmp_path)
    p = write(tmp_path / "p.jsonl", json.dumps(_pred("a")) + "\n" + json.dumps(_pred("b", "technical")) + "\n")
    base = ["eval", str(gold), "--predictions", str(p), "--labels", "billing,technical,account", "--plots"]
    r = cli(*base, str(tmp_path / "new" / "deeper"))
    assert r.exit_code == 0, r.output
    assert (tmp_path / "new" / "deeper" / "confusion.png").is_file()
    write(tmp_path / "afile", "x")
    refused(cli(*base, str(tmp_path / "afile" / "sub")), "--plots", "cannot create the folder")
    r = cli(*base, str(tmp_path / "afile"))
    assert r.exit_code == 2 and BUG_REPORT not in r.output  # click: a file where a folder is asked for
