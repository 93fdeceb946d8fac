"""Labelled texts read for training (`jobs/labelled.py`): `train` reads a second text exactly as `classify` does (issue 40, item 2): `--pair-field`
(JSONL/Parquet, default text_pair, read where a row has one) and `--pair-column` (CSV), the
same reader rule (`TaskOptions.read_pair`). A template with {pair} trains on the pairs (the head
and --finetune); a pair the prompt cannot take is refused naming its line, never dropped."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from mlx_slm.cli import main
from mlx_slm.text.workload import tickets

ROWS = tickets(30)
PAIR_TEMPLATE = "A: {text}\nB: {pair}"
FT = ["--finetune", "lora", "--adapt-layers", "1", "--epochs", "1", "--val-fraction", "0.2"]


def run(args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture
def data(tmp_path):
    p = tmp_path / "pairs.jsonl"
    p.write_text("".join(json.dumps({"text": t, "text_pair": f"about {g}", "label": g}) + "\n" for t, g in ROWS))
    return p


def test_read_training_data_keeps_each_rows_pair(data, tmp_path):
    from mlx_slm.files.readers import ReadSpec
    from mlx_slm.jobs.train import read_training_data

    got = read_training_data(str(data), spec=ReadSpec(pair="text_pair"), folds=2)
    assert got.texts[0] == (ROWS[0][0], f"about {ROWS[0][1]}")
    csv = tmp_path / "pairs.csv"
    csv.write_text("text,other,label\n" + "".join(f'"{t}",x {g},{g}\n' for t, g in ROWS))
    got = read_training_data(str(csv), spec=ReadSpec(pair="other"), folds=2)
    assert got.texts[1] == (ROWS[1][0], f"x {ROWS[1][1]}")


@pytest.mark.parametrize("how", [[], FT], ids=["head", "finetune"])
def test_a_pair_template_trains_on_the_pairs(data, tmp_path, tiny_qwen_mlx, how):
    task = tmp_path / "t.json"
    extra = how or ["--folds", "2"]
    r = run(["train", data, "--model", tiny_qwen_mlx, "--save-task", task, "--template", PAIR_TEMPLATE, *extra, "-q"])
    assert r.exit_code == 0, r.output
    assert json.loads(task.read_text())["template"] == PAIR_TEMPLATE
    c = run(["classify", data, "--task", task, "-q"])
    assert c.exit_code == 0 and all("label" in json.loads(x) for x in c.stdout.splitlines())


@pytest.mark.parametrize("how", [[], FT], ids=["head", "finetune"])
def test_a_pair_the_prompt_cannot_take_is_refused_by_line(data, tmp_path, tiny_qwen_mlx, how):
    task = tmp_path / "t.json"
    r = run(["train", data, "--model", tiny_qwen_mlx, "--save-task", task, *(how or ["--folds", "2"]), "-q"])
    assert r.exit_code == 2 and "line 1" in r.output and "text_pair" in r.output and "{pair}" in r.output, r.output
    assert not task.exists()


def test_csv_pairs_come_from_pair_column(tmp_path, tiny_qwen_mlx):
    csv = tmp_path / "pairs.csv"
    csv.write_text("text,doc,label\n" + "".join(f'"{t}",about {g},{g}\n' for t, g in ROWS))
    task = tmp_path / "t.json"
    r = run(["train", csv, "--model", tiny_qwen_mlx, "--save-task", task, "--template", PAIR_TEMPLATE,
             "--pair-column", "doc", "--folds", "2", "-q"])  # fmt: skip
    assert r.exit_code == 0, r.output
    # without --pair-column a CSV has no pair (classify's rule): the {pair} template names line 1
    r = run(["train", csv, "--model", tiny_qwen_mlx, "--save-task", task, "--template", PAIR_TEMPLATE, "--folds", "2"])
    assert r.exit_code == 2 and "line 2" in r.output and "no second text" in r.output and "--pair-column" in r.output
