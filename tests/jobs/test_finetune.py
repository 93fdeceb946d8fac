"""`mlx-slm train --finetune lora` (`jobs/finetune.py`): a fine-tuned classifier from labelled data, saved
as a task; a run that diverges stops and saves nothing, the progress bar names each epoch's figures."""

from __future__ import annotations

import json
import re
from pathlib import Path

from click.testing import CliRunner

from mlx_slm.cli import main
from mlx_slm.text.workload import tickets
from tests.hostile import invoke, refused_cleanly

ROWS = tickets(30)


def run(args, **kw):
    return CliRunner().invoke(main, [str(a) for a in args], **kw)


def _data(tmp_path: Path) -> Path:
    p = tmp_path / "train.jsonl"
    p.write_text("".join(json.dumps({"text": t, "label": g}) + "\n" for t, g in ROWS))
    return p


def test_a_diverging_fine_tune_stops_naming_the_epoch_and_the_fix_and_saves_nothing(tiny_qwen_mlx, tmp_path):
    data = _data(tmp_path)
    r = run(["train", data, "--finetune", "lora", "--model", tiny_qwen_mlx, "--dtype", "float16", "--lr", "1",
             "--head-lr", "1", "--epochs", "3", "--adapt-layers", "2", "--save-task", tmp_path / "t.json", "-q"])  # fmt: skip
    assert r.exit_code == 2, r.output
    assert re.search(r"fine-tuning diverged in epoch \d", r.output) and "nothing is saved" in r.output
    assert "--lr" in r.output and "--dtype float32" in r.output and "Traceback" not in r.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.jsonl"]


def test_the_progress_bar_names_the_epoch_of_its_validation_figures(tiny_qwen_mlx, capsys):
    """The bar showed the previous epoch's val_acc as if it were the current one's."""
    from mlx_slm.classifier.plan import Plan
    from mlx_slm.engine.engine import Engine
    from mlx_slm.jobs.finetune import finetune_texts, progress_bar
    from mlx_slm.weights.finetune import FinetuneSettings

    seen = []
    update, close = progress_bar(False)

    def both(p):
        seen.append(p)
        update(p)

    engine = Engine.load(str(tiny_qwen_mlx))
    s = FinetuneSettings(layers=1, epochs=2, learning_rate=1e-3, val_fraction=0.2, patience=5)
    plan = Plan.of(("account", "billing", "technical"), None, "T: {text}\nL:")
    finetune_texts(engine, plan, [t for t, _ in ROWS], [g for _, g in ROWS], s, progress=both)
    close()
    steps2 = [p for p in seen if p.phase == "train" and p.epoch == 2 and p.val_epoch != 2]
    assert steps2 and all(p.val_epoch == 1 and p.val_accuracy is not None for p in steps2)
    ends = [p for p in seen if p.phase == "train" and p.val_epoch == p.epoch]
    assert [p.epoch for p in ends] == [1, 2]  # each epoch's own figures as it ends
    err = capsys.readouterr().err
    assert "(epoch 1)" in err and "(epoch 2)" in err


def test_a_label_with_no_rows_at_val_fraction_0_names_the_fix(tiny_qwen_mlx, tmp_path):
    data = tmp_path / "two.jsonl"
    data.write_text("".join(json.dumps({"text": t, "label": g}) + "\n" for t, g in ROWS if g != "technical"))
    r = invoke(["train", data, "--finetune", "lora", "--model", tiny_qwen_mlx, "--labels",
                "account,billing,technical", "--val-fraction", "0", "--save-task", tmp_path / "t.json", "-q"])  # fmt: skip
    refused_cleanly(r, "too few examples: 'technical' has 0.", "add examples of those labels",
                    "leave them out of --labels")  # fmt: skip
    assert not (tmp_path / "t.json").exists()
