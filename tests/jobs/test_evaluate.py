"""Evaluation against gold labels (`jobs/evaluate.py`): the predictions it scores must be the output for
this input, and hostile predictions are a clear error; eval --questions applies every option as
classify does."""

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from mlx_slm.cli import BUG_REPORT, main
from mlx_slm.files.output import manifest_path
from mlx_slm.text.workload import tickets
from tests import hostile
from tests.classify_run import TEXTS, cli, jsonl_input, run
from tests.hostile import invoke, refused, refused_cleanly, write


def test_eval_predictions_from_another_input_are_refused(tiny_qwen_mlx, tmp_path):
    gold = tmp_path / "g.jsonl"
    gold.write_text(
        "".join(json.dumps({"id": f"g{i}", "text": t, "label": "a"}) + "\n" for i, t in enumerate(TEXTS[:4]))
    )
    other = jsonl_input(tmp_path / "other.jsonl", TEXTS[:4])
    preds = tmp_path / "p.jsonl"
    assert run(["classify", str(other), "-o", str(preds), *cli(tiny_qwen_mlx)]).exit_code == 0
    r = CliRunner().invoke(main, ["eval", str(gold), "--labels", "a,b,c", "--predictions", str(preds)])
    assert r.exit_code == 2 and "not the output for this input" in r.output


def _edit_in_place(path: Path) -> None:
    """One text changed, the size and the ids kept."""
    data = path.read_text()
    i = data.index('"text": "') + len('"text": "')
    path.write_text(data[:i] + ("X" if data[i] != "X" else "Y") + data[i + 1 :])


def test_eval_refuses_predictions_of_another_input_with_line_number_ids(tiny_qwen_mlx, tmp_path):
    """Issue 26: ids that are line numbers match in any input of that length; the
    predictions' manifest says which content they were made from."""
    gold = tmp_path / "g.jsonl"
    gold.write_text("".join(json.dumps({"text": t, "label": "a"}) + "\n" for t in TEXTS[:4]))
    preds = tmp_path / "p.jsonl"
    assert run(["classify", str(gold), "-o", str(preds), *cli(tiny_qwen_mlx)]).exit_code == 0
    ok = run(["eval", str(gold), "--labels", "a,b,c", "--predictions", str(preds)])
    assert ok.exit_code == 0 and "accuracy" in ok.output
    _edit_in_place(gold)
    r = CliRunner().invoke(main, ["eval", str(gold), "--labels", "a,b,c", "--predictions", str(preds)])
    assert r.exit_code == 2, r.output
    assert "not the output for this input" in r.output and f"mlx-slm classify {gold} -o {preds}" in r.output
    # An unfinished output is refused, naming the way out.
    m = manifest_path(str(preds))
    doc = json.loads(m.read_text())
    m.write_text(json.dumps({**doc, "complete": False}))
    r = CliRunner().invoke(main, ["eval", str(gold), "--labels", "a,b,c", "--predictions", str(preds)])
    assert r.exit_code == 2 and "unfinished" in r.output and "--resume" in r.output
    # Without a manifest (predictions made otherwise), rows are checked by id only.
    m.unlink()
    assert run(["eval", str(gold), "--labels", "a,b,c", "--predictions", str(preds)]).exit_code == 0


# eval --predictions (hostile round eight, issue 53): a label not among the labels counted wrong and named, a label
# without probabilities named by its line.


# ----------------------------------------------------------------------------- eval --predictions


def _gold_and_predictions(tmp_path, preds):
    g, p = tmp_path / "gold.jsonl", tmp_path / "preds.jsonl"
    g.write_text('{"id": 1, "text": "a", "label": "billing"}\n{"id": 2, "text": "b", "label": "tech"}\n')
    p.write_text("".join(json.dumps(x) + "\n" for x in preds))
    return g, p


def test_an_unknown_predicted_label_counts_wrong_and_is_named(tmp_path):
    g, p = _gold_and_predictions(
        tmp_path,
        [{"id": 1, "label": "sales", "probs": {"sales": 0.9, "billing": 0.1}},
         {"id": 2, "label": "tech", "probs": {"tech": 0.8, "billing": 0.2}}],
    )  # fmt: skip
    out = tmp_path / "rep.json"
    r = invoke(["eval", g, "--predictions", p, "--labels", "billing,tech", "--json", out])
    assert r.exit_code == 0, r.output
    assert "accuracy 50.00 %" in r.output and "not among the labels, counted wrong: 'sales' (1)" in r.output
    rep = json.loads(out.read_text())
    assert rep["accuracy"] == 0.5 and rep["unknown_labels"] == {"sales": 1} and "sales" in rep["labels"]


def test_a_label_without_probabilities_is_named_by_its_line(tmp_path):
    g, p = _gold_and_predictions(
        tmp_path, [{"id": 1, "label": "billing", "probs": {"billing": 1.0}}, {"id": 2, "label": "tech"}]
    )
    r = invoke(["eval", g, "--predictions", p, "--labels", "billing,tech"])
    refused_cleanly(r, "line 2", "'tech'", "probs")


@pytest.fixture
def gold(tmp_path):
    rows = [
        {"text": t, "team": ("a", "b")[i % 2], "urgent": ("yes", "no")[i % 3 == 0]}
        for i, (t, _) in enumerate(tickets(12))
    ]
    data = write(tmp_path / "gold.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    q = write(tmp_path / "q.jsonl", json.dumps({"name": "team", "question": "Which team?", "labels": ["a", "b"]}) + "\n"
              + json.dumps({"name": "urgent", "question": "Urgent?", "labels": ["yes", "no"]}) + "\n")  # fmt: skip
    return data, q


def test_eval_questions_applies_calibration_abstain_and_save_task_as_classify(tiny_qwen_mlx, gold, tmp_path):
    data, q = gold
    base = ["eval", "-", "--model", tiny_qwen_mlx, "--questions", q, "--gold-field", "team", "--gold-field",
            "urgent", "-q"]  # fmt: skip
    stdin = data.read_text()
    raw = invoke([*base, "--json", tmp_path / "raw.json"], input=stdin)  # stdin read once for both fields
    assert raw.exit_code == 0, raw.output
    task = tmp_path / "t.json"
    cal = invoke([*base, "--calibrate", "batch", "--warmup", "4", "--min-confidence", "0.9", "--save-task", task,
                  "--json", tmp_path / "cal.json"], input=stdin)  # fmt: skip
    assert cal.exit_code == 0, cal.output
    r0, r1 = (json.loads((tmp_path / f).read_text())["questions"] for f in ("raw.json", "cal.json"))
    assert r0 != r1  # the options changed the report, as they change classify's labels
    saved = json.loads(task.read_text())
    assert saved["calibration"] == "batch" and saved["warmup"] == 4 and saved["min_confidence"] == 0.9
    out = tmp_path / "o.jsonl"  # the same abstentions as classify with the same flags
    c = invoke(["classify", data, "--model", tiny_qwen_mlx, "--questions", q, "--calibrate", "batch", "--warmup", "4",
                "--min-confidence", "0.9", "-q", "-o", out])  # fmt: skip
    abstained = sum(1 for ln in out.read_text().splitlines() if json.loads(ln)["answers"]["team"]["label"] is None)
    assert c.exit_code == 0 and r1["team"]["abstained"] == abstained > 0 and r0["team"]["abstained"] == 0


def test_eval_questions_refuses_a_question_given_twice_and_run_options_with_predictions(tiny_qwen_mlx, gold, tmp_path):
    data, q = gold
    base = ["eval", data, "--model", tiny_qwen_mlx, "--questions", q]
    refused_cleanly(invoke([*base, "--gold-field", "team", "--gold-field", "team=urgent"]),
                    "--gold-field team=urgent", "question 'team' is given twice")  # fmt: skip
    preds = write(tmp_path / "p.jsonl", "")
    for flag in (["--calibrate", "batch"], ["--min-confidence", "0.5"], ["--save-task", tmp_path / "t.json"]):
        r = invoke([*base, "--gold-field", "team", "--predictions", preds, *flag])
        refused_cleanly(r, "--predictions scores a classify output as it was written", flag[0])


# `eval` on hostile predictions (wrong types) and a plots folder that is missing or unusable: a clear error
# (exit 2), never a traceback.


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
        r = hostile.cli("eval", str(gold), "--predictions", str(p), "--labels", "billing,technical,account")
        refused(r, f"--predictions {p}", *words)
    p = write(tmp_path / "ok.jsonl", "".join(json.dumps(x) + "\n" for x in good))
    r = hostile.cli("eval", str(gold), "--predictions", str(p), "--labels", "billing,technical,account")
    assert r.exit_code == 0 and "accuracy 100.00 %" in r.output, r.output


def test_eval_plots_folder_missing_is_made_and_unusable_is_refused(tmp_path):
    pytest.importorskip("matplotlib")
    gold = _gold(tmp_path)
    p = write(tmp_path / "p.jsonl", json.dumps(_pred("a")) + "\n" + json.dumps(_pred("b", "technical")) + "\n")
    base = ["eval", str(gold), "--predictions", str(p), "--labels", "billing,technical,account", "--plots"]
    r = hostile.cli(*base, str(tmp_path / "new" / "deeper"))
    assert r.exit_code == 0, r.output
    assert (tmp_path / "new" / "deeper" / "confusion.png").is_file()
    write(tmp_path / "afile", "x")
    refused(hostile.cli(*base, str(tmp_path / "afile" / "sub")), "--plots", "cannot create the folder")
    r = hostile.cli(*base, str(tmp_path / "afile"))
    assert r.exit_code == 2 and BUG_REPORT not in r.output  # click: a file where a folder is asked for
