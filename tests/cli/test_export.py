"""`mlx-slm export` (`cli/export.py`): a fine-tuned task out as a Transformers checkpoint, into a new or an
empty folder as its help says."""

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
