"""Evaluation against gold labels (`jobs/evaluate.py`): the predictions it scores must be the output for
this input."""

import json
from pathlib import Path

from click.testing import CliRunner

from mlx_slm.cli import main
from mlx_slm.files.output import manifest_path
from mlx_slm.text.workload import tickets

TEXTS = [t for t, _ in tickets(40)]


def run(args, input=None):
    return CliRunner().invoke(main, args, input=input, catch_exceptions=False)


def cli(model, *extra):
    return ["--model", str(model), "--labels", "a,b,c", "-q", *extra]


def jsonl_input(path: Path, texts=TEXTS, extra_lines=()) -> Path:
    lines = [json.dumps({"id": f"t{i}", "text": t}) for i, t in enumerate(texts)]
    for at, line in extra_lines:
        lines.insert(at, line)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


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
