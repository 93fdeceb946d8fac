"""The saved task (`classifier/task.py`): a task file with wrong types, an unknown field or bad bytes
is a one-line error naming the field and the fix (exit 2), never a traceback (one test per class of
hostile input); task files written before the house moved (issue 41) load as their kind and save back
the same; a task with a learned head round-trips."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mlx_slm.classifier.task import Task
from tests.hostile import cli, refused, write
from tests.train_cli import ROWS, run, write_rows


def _task(**over) -> dict:
    d = {"format": "mlx-slm.task", "version": 1, "model": "m", "labels": ["billing", "technical"]}
    d.update(template="T: {text}\nC:", system=None)
    d.update(over)
    return d


@pytest.mark.parametrize(
    "bad, words",
    [
        ({"warmup": "abc"}, ["'warmup'", "integer"]),
        ({"warmup": 1}, ["'warmup'"]),
        ({"min_confidence": "high"}, ["'min_confidence'", "number from 0 to 1"]),
        ({"min_confidence": 2}, ["'min_confidence'"]),
        ({"system": 123}, ["'system'", "string or null"]),
        ({"labels": [1, 2, 3]}, ["'labels'", "strings"]),
        ({"labels": "billing"}, ["'labels'"]),
        ({"model": None}, ["'model'"]),
        ({"template": "no placeholder"}, ["'template'", "{text}"]),
        ({"version": "2"}, ["'version'", "integer"]),
        ({"scoring": 5}, ["'scoring'"]),
        ({"examples": "x"}, ["'examples'"]),
        ({"examples": [["hi", "billing"]]}, ["'examples'", "example 1"]),
        ({"examples": [{"text": "hi", "label": "zzz"}]}, ["'examples'", "'zzz'", "not one of the labels"]),
        ({"calibration": 7}, ["'calibration'"]),
        ({"calibration": {"method": "fit"}}, ["'calibration'"]),
        ({"weights_sha256": 5}, ["'weights_sha256'"]),
        ({"versions": []}, ["'versions'"]),
    ],
)
def test_task_file_with_wrong_types_names_the_field(tmp_path, bad, words):
    from mlx_slm.classifier.task import Task
    from mlx_slm.kinds.base import TaskError

    p = write(tmp_path / "task.json", json.dumps(_task(**bad)))
    with pytest.raises(TaskError) as e:
        Task.load(p)
    for w in [str(p), *words]:
        assert w in str(e.value), (w, str(e.value))


@pytest.mark.parametrize(
    "key, hint",
    [("min_confidance", "did you mean 'min_confidence'?"), ("Labels", "did you mean 'labels'?"), ("zzz", "")],
)
def test_task_file_with_an_unknown_field_names_it_and_the_closest_known_one(tmp_path, key, hint):
    """Issue 26: a misspelt field was ignored without a word (the threshold silently off)."""
    from mlx_slm.classifier.task import Task
    from mlx_slm.kinds.base import TaskError

    p = write(tmp_path / "task.json", json.dumps(_task(**{key: 0.7})))
    with pytest.raises(TaskError) as e:
        Task.load(p)
    assert str(p) in str(e.value) and f"unknown field {key!r}" in str(e.value) and hint in str(e.value)
    assert Task.load(write(tmp_path / "ok.json", json.dumps(_task(created="2026-01-01", min_confidence=0.7))))


def test_task_file_bytes_json_and_cli(tmp_path):
    from mlx_slm.classifier.task import Task
    from mlx_slm.kinds.base import TaskError

    good = json.dumps(_task())
    cases = {
        "ff.json": (good[:40] + "\udcff" + good[40:]).encode("utf-8", "surrogateescape"),  # a 0xff byte
        "deep.json": b"[" * 100_000,
        "notjson.json": b"{oops",
        "bigint.json": b'{"format": "mlx-slm.task", "version": 1' + b"1" * 5000 + b"}",
    }
    for name, data in cases.items():
        with pytest.raises(TaskError, match=name):
            Task.load(write(tmp_path / name, data))
    with pytest.raises(TaskError, match="line 1: invalid UTF-8 \\(byte 0xff at column 41\\)"):
        Task.load(tmp_path / "ff.json")
    with pytest.raises(TaskError, match="is a folder"):
        Task.load(tmp_path)
    assert Task.load(write(tmp_path / "good.json", good)).labels == ("billing", "technical")
    inp = write(tmp_path / "in.txt", "hello\n")
    bad = write(tmp_path / "t.json", json.dumps(_task(warmup="abc")))
    refused(cli("classify", str(inp), "--task", str(bad), "-o", str(tmp_path / "o.jsonl")), "'warmup'", str(bad))
    refused(cli("classify", str(inp), "--task", str(tmp_path / "ff.json")), "invalid UTF-8")
    # An example whose label is not a task label is refused, as the same example via --examples is.
    ex = write(tmp_path / "ex.json", json.dumps(_task(examples=[{"text": "hi", "label": "refund"}])))
    refused(cli("classify", str(inp), "--task", str(ex)), "'refund'", "not one of the labels")


# Task files written before the house moved (issue 41): the code in its new folders reads every kind
# of them as the same kind, and writes them back with the same fields and values.


V1 = Path(__file__).parents[1] / "data" / "tasks-v1"


KINDS = {"labels-batch": ("labels", None), "head": ("head", "learned head"), "questions": ("questions", None),
         "seqcls": ("seqcls", None), "finetune": ("finetune", "fine-tuned adapters")}  # fmt: skip


@pytest.mark.parametrize("name", sorted(KINDS))
def test_an_older_task_file_loads_as_its_kind_and_saves_back_the_same(name, tmp_path):
    path = V1 / f"{name}.json"
    task = Task.load(path)
    kind, trained = KINDS[name]
    assert task.kind.name == kind and task.trained == trained
    task.save(tmp_path / path.name)
    before, after = json.loads(path.read_text()), json.loads((tmp_path / path.name).read_text())
    if name == "finetune":  # saved elsewhere, the task names its adapters where they are
        assert Path(after["finetune"].pop("adapters")) == (V1 / before["finetune"].pop("adapters")).resolve()
    assert {k: v for k, v in after.items() if k != "created"} == {k: v for k, v in before.items() if k != "created"}
    assert Task.load(tmp_path / path.name).kind.name == kind


def test_the_older_fine_tune_reads_its_adapters_checked_by_sha256():
    task = Task.load(V1 / "finetune.json")
    tuned = task.kind.tuned
    assert tuned.labels == tuple(task.labels) and tuned.lora.layers == (2,) and tuned.objective == "score"


pytest.importorskip("sklearn")


# --------------------------------------------------------------------------- the head path
LABELS = ("billing", "technical", "account")


SYSTEM, TEMPLATE = "You classify tickets.", "Ticket: {text}\nCategory:"


def test_task_with_head_roundtrip_and_refusals(tiny_head, tiny_qwen_mlx, tmp_path):
    from mlx_slm.classifier.classifier import Classifier
    from mlx_slm.classifier.task import Task
    from mlx_slm.kinds.base import TaskError
    from mlx_slm.weights.convert import weights_sha256

    engine, head = tiny_head
    t = Task(str(tiny_qwen_mlx), LABELS, SYSTEM, TEMPLATE,
             weights_sha256=weights_sha256(tiny_qwen_mlx), head=head)  # fmt: skip
    t.save(tmp_path / "t.json")
    back = Task.load(tmp_path / "t.json")
    assert back.head is not None and back.head.sha256 == head.sha256 and back.head.layers == head.layers
    clf = Classifier.from_task(back, engine=engine)
    assert clf.mode == "head" and clf.head.sha256 == head.sha256
    d = json.loads((tmp_path / "t.json").read_text())
    with pytest.raises(TaskError, match="takes no calibration"):
        Task.from_dict(dict(d, calibration="batch"))
    with pytest.raises(TaskError, match="trained for the labels"):
        Task.from_dict(dict(d, labels=["x", "y", "z"]))
    d2 = json.loads(json.dumps(d))
    d2["head"]["sha256"] = "0" * 64
    with pytest.raises(TaskError, match="field 'head'.*sha256"):
        Task.from_dict(d2)
    with pytest.raises(TaskError, match="head was trained on weights"):
        Classifier.from_task(Task.from_dict(dict(d, weights_sha256="f" * 64)), engine=engine)
    assert "head" not in Task("m", LABELS, None, "{text}").to_dict()  # tasks without a head: unchanged


# A task follows its weights to a new place (hostile round seven, issue 47).


@pytest.fixture(scope="module")
def v1_models(tmp_path_factory, tiny_arch) -> dict[str, Path]:
    """The tiny models the tasks-v1 files were saved on, made again in new places (equal weights by
    sha256; the language model's tokenizer learned the labels and yes/no as words), and one whose
    weights differ in one number."""
    import shutil

    from safetensors.numpy import load_file, save_file

    from mlx_slm.weights.convert import convert, weights_sha256
    from tests.conftest import make_tiny

    d = tmp_path_factory.mktemp("v1")
    hf = make_tiny(d / "hf", "qwen2", ("billing", "technical", "account", "yes", "no"))
    lm = convert(hf, d / "lm", dtype="float32", progress=None)
    other = d / "other"
    shutil.copytree(lm, other)
    w = load_file(str(other / "model.safetensors"))
    name = sorted(w)[0]
    w[name] = w[name].copy()
    w[name].flat[0] += 1.0
    save_file(w, str(other / "model.safetensors"), metadata={"format": "mlx"})
    sc = tiny_arch.seqcls_mlx("qwen2", 3)
    assert weights_sha256(lm) == json.loads((V1 / "head.json").read_text())["weights_sha256"]
    assert weights_sha256(sc) == json.loads((V1 / "seqcls.json").read_text())["weights_sha256"]
    assert weights_sha256(other) != weights_sha256(lm)
    return {"lm": lm, "sc": sc, "other": other}


@pytest.mark.parametrize("name", ["labels-batch", "head", "finetune", "questions", "seqcls"])
def test_the_projects_own_v1_tasks_run_from_the_cli_with_model(tmp_path, v1_models, name):
    """Their model folders are long gone: --model at the same weights (equal sha256) runs them, head,
    fitted prior and fine-tuned adapters included (they were refused with "fine-tune again")."""
    inp = write_rows(tmp_path / "in.jsonl", [{"text": t} for t, _ in ROWS[:4]])
    out = tmp_path / "o.jsonl"
    task = V1 / f"{name}.json"
    r = run(
        ["classify", inp, "--task", task, "--model", v1_models["sc" if name == "seqcls" else "lm"], "-o", out, "-q"]
    )
    assert r.exit_code == 0, r.output
    assert len(out.read_text().splitlines()) == 4


@pytest.mark.parametrize("name", ["head", "finetune", "labels-batch"])
def test_a_task_whose_model_is_gone_names_its_model_field_and_the_fix(tmp_path, name):
    inp = write_rows(tmp_path / "in.jsonl", [{"text": "x"}])
    r = run(["classify", inp, "--task", V1 / f"{name}.json", "-o", tmp_path / "o.jsonl"])
    assert r.exit_code == 2, r.output
    assert "its model field names '/tmp/tmp_wyysdw_/lm'" in r.output and "--model PATH" in r.output
    assert "sha256 c5241112c471" in r.output


@pytest.mark.parametrize("name", ["head", "finetune", "labels-batch"])
def test_other_weights_are_still_refused_after_comparing_them(tmp_path, v1_models, name):
    inp = write_rows(tmp_path / "in.jsonl", [{"text": "x"}])
    r = run(["classify", inp, "--task", V1 / f"{name}.json", "--model", v1_models["other"], "-o", tmp_path / "o.jsonl"])
    assert r.exit_code == 2, r.output
    said = r.output.replace("\n", " ")
    assert "c5241112c471" in said and ("does not carry over" in said or "fine-tune again on this one" in said)
    assert not (tmp_path / "o.jsonl").exists()


def test_an_edited_tasks_labels_are_named_as_the_tasks_not_as_labels_given(tmp_path, v1_models):
    """It said "drop --labels" though none was given."""
    d = json.loads((V1 / "finetune.json").read_text())
    d["labels"] = ["account", "billing", "refund"]
    d["finetune"]["adapters"] = str(V1 / d["finetune"]["adapters"])
    task = tmp_path / "edited.json"
    task.write_text(json.dumps(d))
    inp = write_rows(tmp_path / "in.jsonl", [{"text": "x"}])
    r = run(["classify", inp, "--task", task, "--model", v1_models["lm"], "-o", tmp_path / "o.jsonl"])
    assert r.exit_code == 2, r.output
    said = r.output.replace("\n", " ")
    assert f"the labels of --task {task} (its labels field) are ['account', 'billing', 'refund']" in said
    assert "restore the field as it was saved" in said and "drop --labels" not in said
    r = run(["classify", inp, "--task", V1 / "finetune.json", "--model", v1_models["lm"], "--labels", "a,b",
             "-o", tmp_path / "o.jsonl"])  # fmt: skip
    assert r.exit_code == 2 and "with --labels changed they no longer apply" in r.output, r.output
