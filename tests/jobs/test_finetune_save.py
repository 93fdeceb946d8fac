"""A fine-tuned task and its adapters saved as one unit (`jobs/finetune.py`'s `save_finetuned`; issue 40,
item 1: data loss).

`train --finetune --save-task T` onto an existing task wrote the new adapters over the file the
old task names, then the task: a kill between the two left the old task naming adapters that
failed its sha256; a task write that failed (EIO) deleted the adapters the OLD task names;
`intents.v1` and `intents.v2` (or `t` and `t.json`) shared one `intents.adapters.safetensors`;
and the adapters file could be the training data. Now each fine-tune's adapters get a name of
their own (`output.adapters_file`: the task file's whole name and their sha256), written before
the task, checked with the run's outputs: the old pair stays whole until the new one is.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mlx_slm.classifier.task import Task
from mlx_slm.text.workload import tickets

ROWS = tickets(24)
LABELS = ("account", "billing", "technical")


@pytest.fixture(scope="module")
def tuned(engine):
    """Two different fine-tunes of the tiny model (seeds 0 and 1) and the task they belong to."""
    from mlx_slm.classifier.plan import Plan
    from mlx_slm.jobs.finetune import finetune_texts
    from mlx_slm.weights.convert import versions
    from mlx_slm.weights.finetune import FinetuneSettings

    texts, gold = [t for t, _ in ROWS], [g for _, g in ROWS]
    system, template = "Route the ticket.", "Ticket: {text}\nCategory:"

    def one(seed: int):
        s = FinetuneSettings(layers=1, epochs=1, val_fraction=0.0, learning_rate=1e-3, seed=seed)
        return finetune_texts(engine, Plan.of(LABELS, system, template), texts, gold, s)

    task = Task(model=str(engine.path), labels=LABELS, system=system, template=template,
                weights_sha256=engine.weights_sha256, versions=versions())  # fmt: skip
    return task, one(0), one(1)


def _answers(path: Path, engine) -> np.ndarray:
    from mlx_slm.classifier.classifier import Classifier

    clf = Classifier.from_task(path, engine=engine)
    return np.array([[p.probs[x] for x in LABELS] for p in clf.classify([t for t, _ in ROWS[:4]])])


def _named(path: Path) -> Path:
    return path.parent / json.loads(path.read_text())["finetune"]["adapters"]


def test_a_new_save_gets_new_adapters_and_the_old_pair_stays_whole_until_then(tuned, engine, tmp_path):
    from mlx_slm.jobs.finetune import save_finetuned

    task, a, b = tuned
    t = tmp_path / "t.json"
    save_finetuned(task, a, t)
    old_text, old_side = t.read_text(), _named(t)
    old_bytes, before = old_side.read_bytes(), _answers(t, engine)
    save_finetuned(task, b, t)
    new_side = _named(t)
    assert (
        new_side != old_side and new_side.name.startswith("t.json.") and new_side.name.endswith(".adapters.safetensors")
    )
    assert old_side.read_bytes() == old_bytes  # never written over: a copy of the old task still loads
    (tmp_path / "old.json").write_text(old_text)
    assert np.array_equal(_answers(tmp_path / "old.json", engine), before)
    assert not np.allclose(_answers(t, engine), before)
    save_finetuned(task, b, t)  # the same adapters again: the same file, unchanged
    assert _named(t) == new_side


KILLED = """
import json, os, sys
from mlx_slm.weights.adapters import FineTuned
from mlx_slm.classifier.task import Task
from mlx_slm.jobs.finetune import save_finetuned

task = Task.from_dict(json.loads(open(sys.argv[1]).read()))
tuned = FineTuned.from_bytes(open(sys.argv[2], "rb").read())
Task.save = lambda self, path: os._exit(9)  # killed between the adapters' write and the task's
save_finetuned(task, tuned, sys.argv[3])
"""


def test_a_kill_between_the_two_writes_leaves_the_old_task_whole(tuned, engine, tmp_path):
    from mlx_slm.jobs.finetune import save_finetuned

    task, a, b = tuned
    t = tmp_path / "t.json"
    save_finetuned(task, a, t)
    old_text, before = t.read_text(), _answers(t, engine)
    (tmp_path / "in").mkdir()
    plain = tmp_path / "in" / "task.json"
    plain.write_text(json.dumps(task.to_dict()))
    blob = tmp_path / "in" / "b.bin"
    blob.write_bytes(b.to_bytes())
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    r = subprocess.run([sys.executable, "-c", KILLED, str(plain), str(blob), str(t)], env=env, capture_output=True)
    assert r.returncode == 9, r.stderr.decode()[-2000:]
    assert t.read_text() == old_text
    assert np.array_equal(_answers(t, engine), before)  # its adapters pass its sha256


def test_a_failing_task_write_never_deletes_the_adapters_an_old_task_names(tuned, engine, tmp_path, monkeypatch):
    from mlx_slm.jobs.finetune import save_finetuned
    from mlx_slm.kinds.base import TaskError

    task, a, b = tuned
    t = tmp_path / "t.json"
    save_finetuned(task, a, t)
    before, files = _answers(t, engine), sorted(os.listdir(tmp_path))

    def eio(self, path):
        raise TaskError(f"cannot write the task file {path} ({os.strerror(errno.EIO)})")

    monkeypatch.setattr(Task, "save", eio)
    for tuned_now in (b, a):  # new adapters (removed again), and the very adapters the old task names (kept)
        with pytest.raises(TaskError, match="Input/output error"):
            save_finetuned(task, tuned_now, t)
        assert sorted(os.listdir(tmp_path)) == files
    monkeypatch.undo()
    assert np.array_equal(_answers(t, engine), before)


@pytest.mark.parametrize("names", [("intents.v1", "intents.v2"), ("t", "t.json")])
def test_two_task_names_never_share_an_adapters_file(tuned, engine, tmp_path, names):
    from mlx_slm.jobs.finetune import save_finetuned

    task, a, b = tuned
    first, second = tmp_path / names[0], tmp_path / names[1]
    save_finetuned(task, a, first)
    before = _answers(first, engine)
    save_finetuned(task, b, second)
    assert _named(first) != _named(second)
    assert np.array_equal(_answers(first, engine), before)
    save_finetuned(task, a, second)  # the same adapters under both names: still a file each
    assert _named(first) != _named(second) and np.array_equal(_answers(first, engine), before)


@pytest.mark.slow
def test_the_adapters_file_is_never_the_training_data(tiny_qwen_mlx, tmp_path):
    """`train data.adapters.safetensors --save-task data.json` overwrote its own data; the
    adapters file is an output of the run like the task: never DATA, whatever its name."""
    from tests.hostile import invoke

    rows = "".join(json.dumps({"text": t, "label": g}) + "\n" for t, g in ROWS)
    args = ["--finetune", "lora", "--model", tiny_qwen_mlx, "--adapt-layers", "1", "--epochs", "1",
            "--val-fraction", "0", "--format", "jsonl", "-q"]  # fmt: skip
    data = tmp_path / "data.adapters.safetensors"
    data.write_text(rows)
    r = invoke(["train", data, "--save-task", tmp_path / "data.json", *args])
    assert r.exit_code == 0, r.output
    assert data.read_text() == rows
    side = _named(tmp_path / "data.json")
    (tmp_path / "again").mkdir()
    same = tmp_path / "again" / side.name  # the data under the very name its adapters will get
    same.write_text(rows)
    r = invoke(["train", same, "--save-task", tmp_path / "again" / "data.json", *args])
    assert r.exit_code == 2 and "the adapters file" in r.output and "is the input" in r.output, r.output
    assert same.read_text() == rows and not (tmp_path / "again" / "data.json").exists()


def test_a_task_saved_before_with_task_adapters_safetensors_still_loads(tuned, engine, tmp_path):
    """Tasks saved before (adapters named `X.adapters.safetensors`) load as they did."""
    from mlx_slm.jobs.finetune import save_finetuned

    task, a, _ = tuned
    t = tmp_path / "intents.json"
    save_finetuned(task, a, t)
    before = _answers(t, engine)
    old = tmp_path / "intents.adapters.safetensors"
    _named(t).rename(old)
    d = json.loads(t.read_text())
    d["finetune"]["adapters"] = old.name
    t.write_text(json.dumps(d))
    assert np.array_equal(_answers(t, engine), before)


@pytest.mark.parametrize(
    "how",
    [
        ["classify", "IN", "--task", "T", "-o", "A", "--output-format", "jsonl", "-q"],
        ["classify", "IN", "--task", "T", "-o", "OUT", "--save-task", "A", "-q"],
        ["eval", "IN", "--task", "T", "--json", "A", "-q"],
    ],
)
def test_no_output_of_a_run_is_the_adapters_its_task_reads(tuned, tmp_path, how):
    """A fine-tuned task's adapters are one of the files a run reads (`output.files_read`):
    `-o`, `--save-task` or `--json` onto them is refused before anything is written."""
    from mlx_slm.jobs.finetune import save_finetuned
    from tests.hostile import invoke

    task, a, _ = tuned
    t = tmp_path / "t.json"
    save_finetuned(task, a, t)
    side = _named(t)
    before = side.read_bytes()
    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(json.dumps({"text": x, "label": g}) + "\n" for x, g in ROWS[:4]))
    names = {"IN": inp, "T": t, "A": side, "OUT": tmp_path / "out.jsonl"}
    r = invoke([names.get(x, x) for x in how])
    assert r.exit_code == 2 and "is the --task's adapters file" in r.output, r.output
    assert side.read_bytes() == before and not (tmp_path / "out.jsonl").exists()


def test_the_estimator_s_to_task_saves_the_same_way(tiny_qwen_mlx, tmp_path, monkeypatch):
    """`SLMClassifier.to_task` writes a fine-tuned task through the same `save_finetuned`: its own
    adapters name per task name, and a failing task write never deletes an older task's."""
    from mlx_slm.kinds.base import TaskError
    from mlx_slm.sklearn import SLMClassifier

    est = SLMClassifier(model=str(tiny_qwen_mlx), method="finetune", epochs=1, adapt_layers=1, val_fraction=0.0,
                        learning_rate=1e-3)  # fmt: skip
    est.fit([t for t, _ in ROWS], [g for _, g in ROWS])
    want = est.predict_proba([t for t, _ in ROWS[:4]])
    est.to_task(tmp_path / "intents.v1")
    est.to_task(tmp_path / "intents.v2")
    assert _named(tmp_path / "intents.v1") != _named(tmp_path / "intents.v2")
    files = sorted(os.listdir(tmp_path))

    def eio(self, path):
        raise TaskError(f"cannot write the task file {path} ({os.strerror(errno.EIO)})")

    with monkeypatch.context() as m:
        m.setattr(Task, "save", eio)
        with pytest.raises(TaskError):
            est.to_task(tmp_path / "intents.v1")
    assert sorted(os.listdir(tmp_path)) == files
    back = SLMClassifier.from_task(tmp_path / "intents.v1")
    assert np.abs(back.predict_proba([t for t, _ in ROWS[:4]]) - want).max() < 1e-6
