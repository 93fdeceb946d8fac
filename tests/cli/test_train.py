"""`mlx-slm train` (`cli/train.py`): the command's options, then `classify`/`eval --task` with what it saved."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mlx_slm.text.heads import (
    candidate_name,
)
from mlx_slm.text.workload import tickets
from tests.train_cli import FT, labelled, run, train_file

pytest.importorskip("sklearn")


# --------------------------------------------------------------------------- the head path
LABELS = ("billing", "technical", "account")


# --------------------------------------------------------------------------- the CLI


def test_cli_train_then_classify_and_eval(tiny_qwen_mlx, tmp_path):
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"text": t, "label": lab}) + "\n" for t, lab in labelled(6)))
    task = tmp_path / "task.json"
    m = str(tiny_qwen_mlx)
    r = run(["train", str(data), "--model", m, "--save-task", str(task), "--layers", "1,3", "--folds", "3"])
    assert r.exit_code == 0, r.output
    # the tiny random model's mean-pooled states tell these tickets apart perfectly (a certain head);
    # the last position's do not: that head's probabilities spread, for --min-confidence below
    last = tmp_path / "last.json"
    r = run(["train", str(data), "--model", m, "--save-task", str(last), "--layers", "1,3", "--folds", "3", "--pooling", "last"])  # fmt: skip
    assert r.exit_code == 0 and "mean" not in r.stdout.split("chosen:")[0], r.output
    assert "CV accuracy" in r.stdout and "<- chosen" in r.stdout and "2+3" in r.stdout and "chosen: layer" in r.stdout
    saved = json.loads(task.read_text())
    assert saved["labels"] == sorted(LABELS) and saved["head"]["info"]["data_sha256"]
    names = [candidate_name(x["layers"], x["poolings"]) for x in saved["head"]["info"]["table"]]
    assert names[:6] == ["1", "3", "2+3", "mean 1", "mean 3", "mean 2+3"]  # then the best of each, side by side
    assert len(names) == 7 and "+mean " in names[6]
    out = tmp_path / "out.jsonl"
    unseen = tmp_path / "unseen.jsonl"  # texts the head was not fitted on: its probabilities spread
    seen = {t for t, _ in labelled(6)}
    unseen.write_text("".join([json.dumps({"text": t}) + "\n" for t, _ in tickets(200) if t not in seen][:18]))
    r = run(["classify", str(unseen), "--task", str(last), "-o", str(out)])
    assert r.exit_code == 0, r.output
    top = sorted(max(json.loads(x)["probs"].values()) for x in out.read_text().splitlines())
    bar = next(p for p in top if p > top[0])  # some rows below it, some at or above
    r = run(["classify", str(unseen), "--task", str(last), "-o", str(out), "--min-confidence", repr(bar)])
    assert r.exit_code == 0, r.output
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(rows) == 18 and all(abs(sum(x["probs"].values()) - 1) < 1e-5 for x in rows)
    assert any(x.get("abstained") for x in rows)
    assert all(bool(x.get("abstained")) == (max(x["probs"].values()) < bar) for x in rows)
    manifest = json.loads((tmp_path / "out.jsonl.mlx-slm.json").read_text())
    assert (
        manifest["settings"]["scoring"] == "head"
        and manifest["settings"]["head"]["sha256"] == json.loads(last.read_text())["head"]["sha256"]
    )
    assert "head scoring" in r.stderr
    r = run(["eval", str(data), "--task", str(task), "-q"])
    assert r.exit_code == 0 and "accuracy" in r.stdout
    r = run(["classify", str(data), "--task", str(task), "--calibrate", "batch"])
    assert r.exit_code == 2 and "calibration does not apply" in r.output
    r = run(["classify", str(data), "--task", str(task), "--labels", "a,b"])
    assert r.exit_code == 2 and "--labels changed" in r.output
    # --layer forces an earlier layer; labels outside --labels and too few examples are refused
    r = run(["train", str(data), "--model", m, "--save-task", str(task), "--layers", "2", "--layer", "1", "--folds", "3", "-q"])  # fmt: skip
    assert r.exit_code == 0 and json.loads(task.read_text())["head"]["layers"] == [1]
    r = run(["train", str(data), "--model", m, "--save-task", str(task), "--labels", "billing,technical"])
    assert r.exit_code == 2 and "not in --labels: 'account'" in r.output
    r = run(["train", str(data), "--model", m, "--save-task", str(task), "--folds", "7"])
    assert r.exit_code == 2 and "'account' has 6" in r.output and "at least 7 examples per label" in r.output


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return train_file(tmp_path_factory)


# --------------------------------------------------------------------------- options and messages


def test_head_init_words_works_from_the_cli(tmp_path, data, tiny_qwen_mlx):
    """It always exited 2 with a Python-API message about label_tokens."""
    task = tmp_path / "t.json"
    r = run(["train", data, "--model", tiny_qwen_mlx, "--save-task", task, "--head-init", "words", *FT])
    assert r.exit_code == 0, r.output
    assert json.loads(task.read_text())["finetune"]["objective"] == "score"


def test_adapt_layers_over_the_models_blocks_names_the_option_and_the_blocks(tmp_path, data, tiny_qwen_mlx):
    r = run(["train", data, "--model", tiny_qwen_mlx, "--save-task", tmp_path / "t.json", *FT, "--adapt-layers", "5"])
    assert r.exit_code == 2, r.output
    assert "(--adapt-layers 5): this model has 3 blocks: adapt at most 3" in r.output


def test_train_from_stdin_is_refused_saying_why(tmp_path):
    """train reads DATA more than once: stdin (-) is refused saying so, not as "File '-' does not exist"."""
    r = run(["train", "-", "--save-task", str(tmp_path / "t.json")], input='{"text": "x", "label": "a"}\n')
    assert r.exit_code == 2 and "reads DATA more than once" in r.output and "does not exist" not in r.output
    r = run(["train", str(tmp_path / "none.jsonl"), "--save-task", str(tmp_path / "t.json")])
    assert r.exit_code == 2 and "does not exist" in r.output
