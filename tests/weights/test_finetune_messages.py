"""Messages that named no fix, or the wrong one, around fine-tuning (issue 40, item 5).

`export -o DIR` on an existing folder said "give a file path" and refused an empty folder that
`--help` allows; a label with no rows at `--val-fraction 0` said "too few examples: 'z' has 0."
and nothing more (the estimator: "no examples of 'z' has 0"). (`architectures` naming both a
causal LM and a sequence classifier: tests/weights/test_modelfiles_config.py; the progress bar's
validation epoch: tests/weights/test_finetune_divergence.py.)
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mlx_slm.text.workload import tickets
from tests.hostile import invoke, refused_cleanly

ROWS = tickets(30)


@pytest.fixture(scope="module")
def task(tmp_path_factory, tiny_qwen_mlx) -> Path:
    d = tmp_path_factory.mktemp("ft-msg")
    data = d / "train.jsonl"
    data.write_text("".join(json.dumps({"text": t, "label": g}) + "\n" for t, g in ROWS))
    r = invoke(["train", data, "--finetune", "lora", "--model", tiny_qwen_mlx, "--adapt-layers", "1", "--epochs", "1",
                "--val-fraction", "0", "--save-task", d / "task.json", "-q"])  # fmt: skip
    assert r.exit_code == 0, r.output
    return d / "task.json"


def test_export_takes_a_new_or_an_empty_folder_as_its_help_says(task, tmp_path):
    assert "A new (or empty) folder." in invoke(["export", "--help"]).output
    empty = tmp_path / "empty"
    empty.mkdir()
    r = invoke(["export", task, "-o", empty, "-q"])
    assert r.exit_code == 0, r.output
    assert (empty / "config.json").is_file() and (empty / "model.safetensors").is_file()
    r = invoke(["export", task, "-o", tmp_path / "new", "-q"])
    assert r.exit_code == 0 and (tmp_path / "new" / "config.json").is_file(), r.output


def test_export_onto_a_folder_that_holds_files_says_so(task, tmp_path):
    full = tmp_path / "full"
    full.mkdir()
    (full / "notes.txt").write_text("mine")
    r = invoke(["export", task, "-o", full, "-q"])
    refused_cleanly(r, f"-o {full} is a folder that is not empty (notes.txt)", "give a new (or empty) folder")
    assert "give a file path" not in r.output
    assert sorted(p.name for p in full.iterdir()) == ["notes.txt"]


def test_a_label_with_no_rows_at_val_fraction_0_names_the_fix(tiny_qwen_mlx, tmp_path):
    data = tmp_path / "two.jsonl"
    data.write_text("".join(json.dumps({"text": t, "label": g}) + "\n" for t, g in ROWS if g != "technical"))
    r = invoke(["train", data, "--finetune", "lora", "--model", tiny_qwen_mlx, "--labels",
                "account,billing,technical", "--val-fraction", "0", "--save-task", tmp_path / "t.json", "-q"])  # fmt: skip
    refused_cleanly(r, "too few examples: 'technical' has 0.", "add examples of those labels",
                    "leave them out of --labels")  # fmt: skip
    assert not (tmp_path / "t.json").exists()


def test_the_estimator_says_the_same(tiny_qwen_mlx):
    from mlx_slm.sklearn import SLMClassifier

    rows = [(t, g) for t, g in ROWS if g != "technical"]
    est = SLMClassifier(model=str(tiny_qwen_mlx), method="finetune", labels=["account", "billing", "technical"],
                        val_fraction=0.0, epochs=1, adapt_layers=1)  # fmt: skip
    with pytest.raises(ValueError, match=r"'technical' has 0: a fine-tuned classifier learns each label .* leave"):
        est.fit([t for t, _ in rows], [g for _, g in rows])
