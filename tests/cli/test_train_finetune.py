"""`mlx-slm train --finetune lora` through the CLI on a tiny random Qwen2 (issue 36, items 3-5
and "Bad input"): the task and its adapters file, `classify`/`eval --task` equal to
`FineTuned.predict`, seeded runs byte-identical, Ctrl-C and --max-minutes (the best finished
epoch kept as a complete task, or nothing and exit 130), `export` -> Transformers parity and
`--model DIR` back (`parity --task` is tested in tests/parity/test_finetune.py), QLoRA on a 4-bit base, and every bad input
(exit 2 naming the file, line or option and the fix, nothing written)."""

from __future__ import annotations

import hashlib
import importlib
import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from mlx_slm.cli import main
from tests.train_cli import FAST, TUNE_ROWS, run, write_rows


def _records(text: str) -> list[dict]:
    return [json.loads(x) for x in text.splitlines() if x.strip()]


def _left(folder: Path, data: Path) -> list[str]:
    """What a run left in `folder` beside its input (nothing, for a refused one)."""
    return sorted(p.name for p in folder.iterdir() if p != data)


def _side(task: Path) -> Path:
    """The adapters file a task names (beside it: `task.json.<sha256>.adapters.safetensors`)."""
    return task.parent / json.loads(task.read_text())["finetune"]["adapters"]


def _tuned(task: Path):
    from mlx_slm.classifier.task import Task

    return Task.load(task).kind.tuned


def test_train_writes_the_task_and_its_adapters_beside_it(lora_work):
    t = json.loads(lora_work.task.read_text())
    side = _side(lora_work.task)
    ft = t["finetune"]
    assert side.parent == lora_work.d and side.name == f"task.json.{ft['sha256'][:16]}.adapters.safetensors"
    assert ft["sha256"] == hashlib.sha256(side.read_bytes()).hexdigest()
    assert ft["objective"] == "score" and ft["layers"] == [1, 2] and ft["fused"] is False
    assert t["labels"] == ["account", "billing", "technical"] and t["calibration"] == "none"
    assert t["weights_sha256"] and "{text}" in t["template"]
    lines = lora_work.table.splitlines()  # the epochs' table on stdout, the kept one starred
    assert lines[0].split()[:4] == ["epoch", "steps", "train", "loss"] and lines[-1].startswith("stopped: finished")
    assert sum(x.endswith("*") for x in lines) == 1


def test_classify_and_eval_with_the_task_equal_finetuned_predict(lora_work):
    """classify --task (batched, prefix-cached, an error row in place) gives FineTuned.predict's
    probabilities on the same prompts (1e-5); eval --task scores those predictions."""
    from mlx_slm.classifier.classifier import Classifier
    from mlx_slm.classifier.task import Task
    from mlx_slm.engine.engine import Engine

    r = run(["classify", lora_work.inp, "--on-error", "skip", "--task", lora_work.task, "-q"])
    assert r.exit_code == 0, r.output
    out = _records(r.stdout)
    assert [x["id"] for x in out] == list(range(24)) and out[5]["error"] and "label" not in out[5]
    engine = Engine.load(lora_work.model)
    t = Task.load(lora_work.task)
    ft = t.kind.tuned
    texts = [t_ for i, (t_, _) in enumerate(TUNE_ROWS[:24]) if i != 5]
    ids = [it.ids for it in Classifier.from_task(t, engine=engine).prepare(texts)]
    want = np.exp(ft.predict(ft.apply(engine.model, engine.weights_sha256), ids))
    got = np.array([[x["probs"][lab] for lab in ft.labels] for x in out if "error" not in x])
    assert np.abs(got - want).max() < 1e-5
    assert [x["label"] for x in out if "error" not in x] == [ft.labels[k] for k in want.argmax(1)]
    rep = lora_work.d / "rep.json"
    r = run(["eval", lora_work.data, "--task", lora_work.task, "--json", rep, "-q"])
    assert r.exit_code == 0, r.output
    preds = Classifier.from_task(t, engine=engine).classify([x for x, _ in TUNE_ROWS])
    assert json.loads(rep.read_text())["accuracy"] == pytest.approx(np.mean([p.label == g for p, (_, g) in
                                                                            zip(preds, TUNE_ROWS)]))  # fmt: skip


def test_a_task_saved_elsewhere_names_the_adapters_and_classifies_the_same(lora_work, tmp_path, monkeypatch):
    """classify --task T --save-task OTHER/T2 names the adapters by their absolute path (they are
    not beside T2); run from another folder, T2 classifies as T does."""
    t2 = tmp_path / "t2.json"
    a = run(
        [
            "classify",
            lora_work.inp,
            "--on-error",
            "skip",
            "--task",
            lora_work.task,
            "-q",
            "--save-task",
            t2,
            "-o",
            tmp_path / "a.jsonl",
        ]
    )
    assert a.exit_code == 0, a.output
    assert json.loads(t2.read_text())["finetune"]["adapters"] == str(_side(lora_work.task).resolve())
    monkeypatch.chdir(tmp_path)
    b = run(["classify", lora_work.inp, "--on-error", "skip", "--task", t2.name, "-q"])
    assert b.exit_code == 0, b.output
    assert _records((tmp_path / "a.jsonl").read_text()) == _records(b.stdout)


def test_the_same_seed_and_data_give_the_same_adapters_file_byte_for_byte(lora_work, tmp_path):
    args = ["train", lora_work.data, "--finetune", "lora", "--model", lora_work.model, *FAST]
    assert run([*args, "--save-task", tmp_path / "again.json"]).exit_code == 0
    assert run([*args, "--save-task", tmp_path / "seed1.json", "--seed", "1"]).exit_code == 0
    mine = _side(lora_work.task).read_bytes()
    assert _side(tmp_path / "again.json").read_bytes() == mine
    assert _side(tmp_path / "seed1.json").read_bytes() != mine  # the seed does change them
    again = json.loads((tmp_path / "again.json").read_text())["finetune"]
    side = _side(tmp_path / "again.json").name
    assert side == _side(lora_work.task).name.replace("task.json.", "again.json.")
    assert again == {**json.loads(lora_work.task.read_text())["finetune"], "adapters": side}


def _interrupt(monkeypatch, when):
    """Ctrl-C where `when(progress)` is true: the CLI's progress bar raises KeyboardInterrupt."""
    tuning = importlib.import_module("mlx_slm.cli.train")  # where the command took its progress bar from

    def bar(quiet):
        def update(p):
            if when(p):
                raise KeyboardInterrupt

        return update, lambda: None

    monkeypatch.setattr(tuning, "progress_bar", bar)


def test_ctrl_c_after_an_epoch_keeps_the_best_finished_epoch_as_a_complete_task(lora_work, tmp_path, monkeypatch):
    _interrupt(monkeypatch, lambda p: p.phase == "train" and p.epoch == 2)  # in epoch 2's first step
    data = write_rows(tmp_path / "d.jsonl", _records(lora_work.data.read_text()))
    task = tmp_path / "t.json"
    r = run(["train", data, "--finetune", "lora", "--model", lora_work.model, "--save-task", task, *FAST])
    assert r.exit_code == 0, r.output
    assert _left(tmp_path, data) == sorted([_side(task).name, "t.json"])
    ft = _tuned(task)
    assert ft.stopped == "interrupted" and ft.best_epoch == 1 and len(ft.history) == 1
    assert "stopped: interrupted; kept epoch 1" in r.stdout
    c = run(["classify", lora_work.inp, "--on-error", "skip", "--task", task, "-q"])
    assert c.exit_code == 0 and len(_records(c.stdout)) == 24


@pytest.mark.parametrize("phase", ["encode", "train"])
def test_ctrl_c_before_any_finished_epoch_writes_nothing_and_exits_130(lora_work, tmp_path, monkeypatch, phase):
    _interrupt(monkeypatch, lambda p: p.phase == phase)
    data = write_rows(tmp_path / "d.jsonl", _records(lora_work.data.read_text()))
    r = CliRunner().invoke(main, ["train", str(data), "--finetune", "lora", "--model", lora_work.model, "--save-task",
                                  str(tmp_path / "t.json"), *FAST])  # fmt: skip
    assert r.exit_code == 130 and "interrupted" in r.output
    assert _left(tmp_path, data) == []  # no task, no adapters, no temporary file


def test_max_minutes_keeps_the_epoch_it_reached_as_a_complete_task(lora_work, tmp_path):
    """--max-minutes ran out in the first epoch (after one step: the frozen pass alone takes
    longer): that epoch, cut short, is the task; it classifies."""
    task = tmp_path / "t.json"
    r = run(["train", lora_work.data, "--finetune", "lora", "--model", lora_work.model, "--save-task", task, *FAST,
             "--max-minutes", "1e-6"])  # fmt: skip
    assert r.exit_code == 0, r.output
    ft = _tuned(task)
    assert ft.stopped == "max_minutes" and ft.best_epoch == 1 and not ft.history[0].complete
    assert ft.history[0].steps == 1
    assert run(["classify", lora_work.inp, "--on-error", "skip", "--task", task, "-q"]).exit_code == 0


# --------------------------------------------------------------------------- export, --model DIR, parity


def _seqcls_probs(folder: Path, prompts) -> np.ndarray:
    import torch
    from transformers import AutoModelForSequenceClassification

    m = AutoModelForSequenceClassification.from_pretrained(str(folder), dtype=torch.float32).eval()
    with torch.no_grad():
        return np.stack([m(torch.tensor([list(p)])).logits.softmax(-1)[0].numpy() for p in prompts])


def test_export_gives_transformers_the_tasks_probabilities_and_model_dir_loads_it_back(
    lora_work, tmp_path, monkeypatch
):
    """export -> AutoModelForSequenceClassification on our prompt ids: the task's probabilities
    within 1e-4 (float32). `classify --model DIR` reads the prompt recorded in the export: a
    float32 conversion of it gives the task's probabilities within 1e-4 and its labels; the
    default (the cache's float16 conversion) within 1e-2."""
    pytest.importorskip("torch")
    from mlx_slm.classifier.classifier import Classifier

    monkeypatch.setenv("MLX_SLM_HOME", str(tmp_path / "home"))  # the float16 conversion goes there
    out = tmp_path / "exp"
    r = run(["export", lora_work.task, "-o", out, "-q"])
    assert r.exit_code == 0, r.output
    cfg = json.loads((out / "config.json").read_text())
    t = json.loads(lora_work.task.read_text())
    assert cfg["architectures"] == ["Qwen2ForSequenceClassification"] and list(cfg["id2label"].values()) == t["labels"]
    assert cfg["mlx_slm"]["prompt"] == {"system": t["system"], "template": t["template"]}
    texts = [x for x, _ in TUNE_ROWS[:24]]
    clf = Classifier.from_task(lora_work.task)
    ours = np.array([[p.probs[lab] for lab in clf.labels] for p in clf.classify(texts)])
    ids = [it.ids for it in clf.prepare(texts)]
    assert np.abs(_seqcls_probs(out, ids) - ours).max() < 1e-4
    f32 = tmp_path / "exp32"
    assert run(["convert", out, "-o", f32, "--dtype", "float32"]).exit_code == 0
    inp = write_rows(tmp_path / "in.jsonl", [{"id": i, "text": x} for i, x in enumerate(texts)])
    for model, tol in ((f32, 1e-4), (out, 1e-2)):
        r = run(["classify", inp, "--model", model, "-q"])
        assert r.exit_code == 0, r.output
        back = _records(r.stdout)
        got = np.array([[x["probs"][lab] for lab in clf.labels] for x in back])
        assert np.abs(got - ours).max() < tol, (model, np.abs(got - ours).max())
        if tol == 1e-4:
            assert [x["label"] for x in back] == [clf.labels[k] for k in ours.argmax(1)]


# --------------------------------------------------------------------------- a quantized base: QLoRA


def test_a_4_bit_base_fine_tunes_end_to_end_as_qlora(lora_work, tiny_arch, tmp_path):
    """A 4-bit conversion kept packed (--keep-quantized) trains mlx-lm's LoRA layers over the
    packed projections; the task runs kept packed or dequantized (the CPU's default) to the same
    probabilities (1e-4): QLoRA works through the CLI, nothing is refused."""
    q = tmp_path / "q4"
    assert run(["convert", tiny_arch.hf("qwen2"), "-o", q, "--quantize", "4", "--group-size", "32",
                "--dtype", "float32"]).exit_code == 0  # fmt: skip
    task = tmp_path / "q.json"
    r = run(
        ["train", lora_work.data, "--finetune", "lora", "--model", q, "--save-task", task, "--keep-quantized", *FAST]
    )
    assert r.exit_code == 0, r.output
    kept = run(["classify", lora_work.inp, "--on-error", "skip", "--task", task, "--keep-quantized", "-q"])
    dense = run(["classify", lora_work.inp, "--on-error", "skip", "--task", task, "--dequantize", "-q"])
    assert kept.exit_code == dense.exit_code == 0
    a, b = _records(kept.stdout), _records(dense.stdout)
    assert [x.get("label") for x in a] == [x.get("label") for x in b]
    assert max(abs(x["probs"][k] - y["probs"][k]) for x, y in zip(a, b) if "probs" in x for k in x["probs"]) < 1e-4


# --------------------------------------------------------------------------- bad input


def _data_with(tmp_path: Path, case: str) -> Path:
    rows = [{"text": t, "label": g} for t, g in TUNE_ROWS[:30]]
    if case == "rare":  # one 'account' left: nothing to hold out for validation
        rows = [r for r in rows if r["label"] != "account"] + [{"text": "my login fails", "label": "account"}]
    elif case == "one":
        rows = [{"text": r["text"], "label": "billing"} for r in rows]
    elif case == "empty":
        rows = []
    elif case == "long":  # line 31: over the tiny model's 1,024 tokens
        rows = rows + [{"text": "word " * 3000, "label": "billing"}]
    return write_rows(tmp_path / "d.jsonl", rows)


@pytest.mark.parametrize(
    "case, extra, want",
    [
        ("rare", [], ["d.jsonl", "'account' has 1", "--val-fraction 0.2", "each needs 2", "--val-fraction 0"]),
        ("one", [], ["d.jsonl", "every row has the label 'billing'", "at least two labels"]),
        ("fewer", ["--labels", "billing,technical"], ["d.jsonl", "'account' (line 3)", "not in --labels", "add them"]),
        ("empty", [], ["d.jsonl is empty", "give it labelled texts"]),
        ("long", [], ["d.jsonl: line 31", "over the model's context of 1024", "--truncate"]),
        ("ok", ["--layer", "2"], ["--layer chooses a learned head's", "--adapt-layers", "drop it"]),
        ("ok", ["--layers", "all"], ["--layers chooses a learned head's", "drop it"]),
        ("ok", ["--pooling", "mean"], ["--pooling chooses a learned head's", "drop it"]),
        ("ok", ["--folds", "3"], ["--folds cross-validates a learned head", "--val-fraction", "drop --folds"]),
        ("ok", ["--examples", "EX"], ["--examples goes with zero-shot labels", "drop --examples"]),
        ("ok", ["--label-field", "label", "--label-field", "x"], ["--finetune trains one classifier"]),
    ],
)
def test_bad_training_input_exits_2_naming_the_fix_and_writes_nothing(lora_work, tmp_path, case, extra, want):
    data = _data_with(tmp_path, case)
    if "EX" in extra:
        extra[extra.index("EX")] = str(write_rows(tmp_path / "ex.jsonl", [{"text": "a", "label": "billing"}]))
    r = run(["train", data, "--finetune", "lora", "--model", lora_work.model, "--save-task", tmp_path / "t.json", *FAST,
             *extra])  # fmt: skip
    assert r.exit_code == 2, r.output
    for w in want:
        assert w in r.output, (w, r.output)
    assert not (tmp_path / "t.json").exists() and not list(tmp_path.glob("*.adapters.safetensors"))


@pytest.mark.parametrize("option", [["--epochs", "3"], ["--lr", "1e-3"], ["--head-lr", "1e-3"], ["--adapt-layers", "2"], ["--fused"],
                                    ["--objective", "labels"], ["--max-minutes", "1"]])  # fmt: skip
def test_a_fine_tuning_option_without_finetune_is_refused(lora_work, tmp_path, option):
    r = run(["train", lora_work.data, "--model", lora_work.model, "--save-task", tmp_path / "t.json", *option])
    assert r.exit_code == 2 and f"{option[0]} is a fine-tuning option: add --finetune lora" in r.output
    assert not (tmp_path / "t.json").exists()


def _copy_task(lora_work, tmp_path: Path, adapters: bytes | None = None, **fields) -> Path:
    """The task and its adapters copied to `tmp_path` (the adapters replaced by `adapters`, fields set)."""
    t = json.loads(lora_work.task.read_text())
    side = _side(lora_work.task)
    data = side.read_bytes() if adapters is None else adapters
    (tmp_path / side.name).write_bytes(data)
    for k, v in fields.items():
        if k == "sha256":
            t["finetune"]["sha256"] = v
        else:
            t[k] = v
    out = tmp_path / "task.json"
    out.write_text(json.dumps(t))
    return out


def _refused(lora_work, tmp_path: Path, task: Path, *extra) -> str:
    out = tmp_path / "out.jsonl"
    r = run(["classify", lora_work.inp, "--on-error", "skip", "--task", task, "-o", out, "-q", *extra])
    assert r.exit_code == 2, r.output
    assert not out.exists()
    return r.output


def test_adapters_for_other_weights_are_refused_at_load(lora_work, tmp_path):
    """A task whose weights_sha256 is not the model's, and adapters trained on another model
    (their own record of the base): exit 2, naming the hashes or the adapters file and the fix."""
    from dataclasses import replace

    other = "0" * 64
    task = _copy_task(lora_work, tmp_path, weights_sha256=other)
    msg = _refused(lora_work, tmp_path, task)
    assert "adapters were trained on weights sha256 000000000000" in msg and "fine-tune again" in msg
    ft = _tuned(lora_work.task)
    wrong = replace(ft, base={**ft.base, "sha256": other}).to_bytes()
    task = _copy_task(lora_work, tmp_path, adapters=wrong, sha256=hashlib.sha256(wrong).hexdigest())
    msg = _refused(lora_work, tmp_path, task)
    assert str(tmp_path / _side(lora_work.task).name) in msg and "were trained on another model (sha256" in msg
    assert "fine-tune again on this one" in msg


def test_a_changed_or_missing_adapters_file_is_refused(lora_work, tmp_path):
    side = _side(lora_work.task).read_bytes()
    task = _copy_task(lora_work, tmp_path, adapters=side[:-1] + bytes([side[-1] ^ 1]))
    msg = _refused(lora_work, tmp_path, task)
    assert f"{_side(lora_work.task).name} has sha256" in msg and "changed since it was saved" in msg
    (tmp_path / _side(lora_work.task).name).unlink()
    msg = _refused(lora_work, tmp_path, task)
    assert "adapters file" in msg and "is missing: put it back beside the task" in msg


@pytest.mark.parametrize(
    "extra, want",
    [
        (["--labels", "a,b,c"], "--labels changed they no longer apply"),
        (["--calibrate", "batch"], "calibration does not apply to a task with fine-tuned adapters"),
        (["--template", "Q: {text}"], "--template changed they no longer apply"),
    ],
)
def test_a_fine_tuned_task_refuses_what_would_change_what_it_was_trained_on(lora_work, tmp_path, extra, want):
    assert want in _refused(lora_work, tmp_path, lora_work.task, *extra)
