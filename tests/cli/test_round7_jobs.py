"""Issue 47 (hostile round seven), the jobs / CLI / train / task part, on tiny random models: one
writer of a task at a time, a chat template that refuses a system turn, a task that follows its
weights to a new place, and the options and messages that misled."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from mlx_slm.cli import main
from mlx_slm.files.output import OutputLock
from mlx_slm.text.workload import tickets

ROWS = tickets(24)


def run(args, **kw):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False, **kw)


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return _jsonl(tmp_path_factory.mktemp("r7") / "train.jsonl", [{"text": t, "label": g} for t, g in ROWS])


# --------------------------------------------------------------------------- a lost task
@pytest.mark.parametrize("command", ["train", "classify", "eval"])
def test_a_second_writer_of_a_task_fails_naming_the_file_and_the_other_writer(tmp_path, data, tiny_qwen_mlx, command):
    """Two runs saving one --save-task at once both said "task saved" and one was lost: the task is
    locked as an output is, so the second stops at once (exit 2) naming the file and the holder."""
    task = tmp_path / "task.json"
    task.write_text("the first writer's")
    args = {
        "train": ["train", data, "--model", tiny_qwen_mlx, "--folds", "2", "--layers", "1", "--save-task", task],
        "classify": ["classify", data, "--model", tiny_qwen_mlx, "-o", tmp_path / "o.jsonl", "--save-task", task],
        "eval": ["eval", data, "--model", tiny_qwen_mlx, "--save-task", task],
    }[command]
    with OutputLock(str(task), create=False, option="--save-task"):  # another run holds it
        r = run(args)
    assert r.exit_code == 2, r.output
    assert f"{task} is being written by another mlx-slm run (pid {os.getpid()}" in r.output
    assert "choose another --save-task" in r.output
    assert task.read_text() == "the first writer's"


def test_the_task_lock_is_let_go_when_the_run_ends(tmp_path, data, tiny_qwen_mlx):
    task = tmp_path / "task.json"
    for _ in range(2):  # the second run finds no holder: the first let go
        r = run(["train", data, "--model", tiny_qwen_mlx, "--folds", "2", "--layers", "1", "--save-task", task, "-q"])
        assert r.exit_code == 0, r.output
    assert json.loads(task.read_text())["labels"] and not Path(str(task) + ".lock").exists()


@pytest.mark.slow
def test_two_train_processes_on_one_task_one_fails(tmp_path, data, tiny_qwen_mlx):
    """The reported case, as two processes: exactly one saves the task, the other exits 2."""
    task = tmp_path / "task.json"
    cmd = [sys.executable, "-m", "mlx_slm.cli", "train", str(data), "--model", str(tiny_qwen_mlx), "--folds", "2",
           "--layers", "1,2", "--save-task", str(task)]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for _ in range(2)]  # fmt: skip
    got = [(p.wait(timeout=600), p.stderr.read()) for p in procs]
    codes = sorted(c for c, _ in got)
    if codes == [0, 0]:  # the first finished before the second began: nothing was lost
        pytest.skip("the runs did not overlap")
    assert codes == [0, 2], got
    err = next(e for c, e in got if c == 2)
    assert "is being written by another mlx-slm run" in err and str(task) in err


# --------------------------------------------------------------------------- a chat template that refuses a system turn
# Mistral-v0.1's template (less its bos_token, which the tiny tokenizer has not): user and assistant
# turns alternating, anything else raised.
MISTRAL_V01 = (
    "{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token }}"
    "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}"
)


@pytest.fixture(scope="module")
def mistral_style(tmp_path_factory, tiny_qwen_mlx) -> Path:
    """The tiny model with a chat template that raises on a system message."""
    import shutil

    out = tmp_path_factory.mktemp("mistral") / "m"
    shutil.copytree(tiny_qwen_mlx, out)
    (out / "chat_template.jinja").write_text(MISTRAL_V01)
    return out


def test_the_system_text_goes_into_the_user_turn_where_the_template_refuses_it(mistral_style):
    from transformers import AutoTokenizer

    from mlx_slm.text.prompts import PromptFormat, prompt_messages, refuses_system, render, tokenize

    tok = AutoTokenizer.from_pretrained(str(mistral_style))
    assert refuses_system(tok)
    fmt = PromptFormat("Answer with one of: a, b.", "Ticket: {text}\nCategory:", examples=(("x", "a"),))
    msgs = prompt_messages(tok, fmt, "my card")
    assert [m["role"] for m in msgs] == ["user", "assistant", "user"]
    assert msgs[0]["content"] == "Answer with one of: a, b.\n\nTicket: x\nCategory:"
    assert render(tok, fmt, "my card").startswith("[INST] Answer with one of: a, b.\n\nTicket: x")
    # The reference path (Transformers' own apply_chat_template on the same messages) gets the same ids.
    ref = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
    ref = list(ref["input_ids"] if hasattr(ref, "keys") else ref)
    assert tokenize(tok, [render(tok, fmt, "my card")])[0] == ref


def test_a_template_that_takes_a_system_turn_is_left_alone(tiny_qwen_mlx):
    from transformers import AutoTokenizer

    from mlx_slm.text.prompts import PromptFormat, prompt_messages, refuses_system

    tok = AutoTokenizer.from_pretrained(str(tiny_qwen_mlx))
    assert not refuses_system(tok)
    assert prompt_messages(tok, PromptFormat("S", "{text}"), "t")[0] == {"role": "system", "content": "S"}


def test_classify_and_train_on_such_a_model_run_and_record_it(tmp_path, data, mistral_style, monkeypatch):
    from mlx_slm.text import prompts

    monkeypatch.setattr(prompts, "_NOTED", set())  # said once a process: this run says it again
    out = tmp_path / "o.jsonl"
    r = run(["classify", data, "--model", mistral_style, "-o", out, "--save-task", tmp_path / "zs.json"])
    assert r.exit_code == 0, r.output
    assert "refuses a system message" in r.stderr
    assert json.loads(Path(str(out) + ".mlx-slm.json").read_text())["settings"]["system_in_user_turn"] is True
    assert json.loads((tmp_path / "zs.json").read_text())["system_in_user_turn"] is True
    task = tmp_path / "head.json"
    r = run(["train", data, "--model", mistral_style, "--folds", "2", "--layers", "1", "--save-task", task, "-q"])
    assert r.exit_code == 0, r.output
    assert json.loads(task.read_text())["system_in_user_turn"] is True
    r = run(["classify", data, "--task", task, "-o", tmp_path / "o2.jsonl", "-q"])
    assert r.exit_code == 0, r.output


def test_a_template_that_refuses_the_user_turn_too_exits_2_saying_so(tmp_path, data, tiny_qwen_mlx):
    import shutil

    m = tmp_path / "m"
    shutil.copytree(tiny_qwen_mlx, m)
    (m / "chat_template.jinja").write_text("{{ raise_exception('no conversation suits me') }}")
    r = run(["classify", data, "--model", m, "-o", tmp_path / "o.jsonl"])
    assert r.exit_code == 2, r.output
    assert "the model's chat template refused the prompt (no conversation suits me)" in r.output


# --------------------------------------------------------------------------- a task follows its weights
V1 = Path(__file__).parents[1] / "data" / "tasks-v1"


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
    inp = _jsonl(tmp_path / "in.jsonl", [{"text": t} for t, _ in ROWS[:4]])
    out = tmp_path / "o.jsonl"
    task = V1 / f"{name}.json"
    r = run(
        ["classify", inp, "--task", task, "--model", v1_models["sc" if name == "seqcls" else "lm"], "-o", out, "-q"]
    )
    assert r.exit_code == 0, r.output
    assert len(out.read_text().splitlines()) == 4


@pytest.mark.parametrize("name", ["head", "finetune", "labels-batch"])
def test_a_task_whose_model_is_gone_names_its_model_field_and_the_fix(tmp_path, name):
    inp = _jsonl(tmp_path / "in.jsonl", [{"text": "x"}])
    r = run(["classify", inp, "--task", V1 / f"{name}.json", "-o", tmp_path / "o.jsonl"])
    assert r.exit_code == 2, r.output
    assert "its model field names '/tmp/tmp_wyysdw_/lm'" in r.output and "--model PATH" in r.output
    assert "sha256 c5241112c471" in r.output


@pytest.mark.parametrize("name", ["head", "finetune", "labels-batch"])
def test_other_weights_are_still_refused_after_comparing_them(tmp_path, v1_models, name):
    inp = _jsonl(tmp_path / "in.jsonl", [{"text": "x"}])
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
    inp = _jsonl(tmp_path / "in.jsonl", [{"text": "x"}])
    r = run(["classify", inp, "--task", task, "--model", v1_models["lm"], "-o", tmp_path / "o.jsonl"])
    assert r.exit_code == 2, r.output
    said = r.output.replace("\n", " ")
    assert f"the labels of --task {task} (its labels field) are ['account', 'billing', 'refund']" in said
    assert "restore the field as it was saved" in said and "drop --labels" not in said
    r = run(["classify", inp, "--task", V1 / "finetune.json", "--model", v1_models["lm"], "--labels", "a,b",
             "-o", tmp_path / "o.jsonl"])  # fmt: skip
    assert r.exit_code == 2 and "with --labels changed they no longer apply" in r.output, r.output


# --------------------------------------------------------------------------- options and messages
FT = ["--finetune", "lora", "--epochs", "1", "--adapt-layers", "1", "--val-fraction", "0", "-q"]


def test_head_init_words_works_from_the_cli(tmp_path, data, tiny_qwen_mlx):
    """It always exited 2 with a Python-API message about label_tokens."""
    task = tmp_path / "t.json"
    r = run(["train", data, "--model", tiny_qwen_mlx, "--save-task", task, "--head-init", "words", *FT])
    assert r.exit_code == 0, r.output
    assert json.loads(task.read_text())["finetune"]["objective"] == "score"


def test_none_data_with_a_bad_row_is_refused_before_the_training(tmp_path, data, tiny_qwen_mlx):
    held = _jsonl(tmp_path / "held.jsonl", [{"text": t, "label": g} for t, g in tickets(30)[24:]] +
                  [{"text": "weather", "label": "oos"}, {"text": "no label here"}])  # fmt: skip
    task = tmp_path / "t.json"
    r = run(["train", data, "--model", tiny_qwen_mlx, "--save-task", task, *FT[:-1], "--none-label", "oos",
             "--none-threshold", "auto", "--none-data", held])  # fmt: skip
    assert r.exit_code == 2, r.output
    assert f"{held}: line 8: no gold label" in r.output
    assert "epoch" not in r.output and not task.exists()  # nothing trained first


def test_adapt_layers_over_the_models_blocks_names_the_option_and_the_blocks(tmp_path, data, tiny_qwen_mlx):
    r = run(["train", data, "--model", tiny_qwen_mlx, "--save-task", tmp_path / "t.json", *FT, "--adapt-layers", "5"])
    assert r.exit_code == 2, r.output
    assert "(--adapt-layers 5): this model has 3 blocks: adapt at most 3" in r.output


@pytest.mark.parametrize("finetune", [False, True], ids=["head", "finetune"])
def test_a_lone_surrogate_in_a_training_label_exits_2_naming_the_row(tmp_path, tiny_qwen_mlx, finetune):
    bad = tmp_path / "bad.jsonl"
    bad.write_text("".join(json.dumps({"text": t, "label": g}) + "\n" for t, g in ROWS[:12])
                   + '{"text": "hi", "label": "bil\\ud800"}\n')  # fmt: skip
    extra = FT if finetune else ["--folds", "2", "-q"]
    r = run(["train", bad, "--model", tiny_qwen_mlx, "--save-task", tmp_path / "t.json", *extra])
    assert r.exit_code == 2, r.output
    assert f"{bad}: line 13: gold label" in r.output and "unpaired surrogate" in r.output


@pytest.mark.parametrize("scorer", [[], ["--reranker", "qwen3"], ["--reranker", "question"]])
def test_rerank_on_an_embedding_model_says_it_is_one_and_what_works(tmp_path, tiny_arch, scorer):
    """`--reranker qwen3`, which the first refusal suggested, said "features_only: not a setting of rerank"."""
    q = _jsonl(tmp_path / "q.jsonl", [{"query": "card charged", "documents": ["refund please", "reset password"]}])
    r = run(["rerank", q, "--model", tiny_arch.st_mlx("qwen2"), *scorer])
    assert r.exit_code == 2, r.output
    assert "is an embedding model" in r.output and "cosine of their embeddings" in r.output
    assert "features_only" not in r.output


def test_dir_and_help_of_the_package_list_the_public_names_without_importing_mlx():
    code = (
        "import sys, pydoc, mlx_slm\n"
        "d = dir(mlx_slm)\n"
        "assert {'Classifier', 'Embedder', 'Task', 'Engine', 'train_head'} <= set(d), d\n"
        "assert set(mlx_slm.__all__) <= set(d)\n"
        "assert 'mlx.core' not in sys.modules and 'mlx_slm.classifier' not in sys.modules\n"
        "text = pydoc.render_doc(mlx_slm, renderer=pydoc.plaintext)\n"
        "assert all(f'class {n}' in text for n in ('Classifier', 'Embedder', 'Task')), text[:2000]\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert got.returncode == 0, got.stderr


@pytest.mark.slow
def test_parity_agrees_on_a_model_whose_template_refuses_a_system_turn(tmp_path, tiny_arch):
    """The reference path renders the same folded prompt (84 s on 2 cores: the reference runs twice)."""
    import shutil

    hf = tmp_path / "hf"
    shutil.copytree(tiny_arch.hf("qwen2"), hf)
    (hf / "chat_template.jinja").write_text(MISTRAL_V01)
    r = run(["parity", "--model", hf, "--reference", hf, "--n", "6"])
    assert r.exit_code == 0, r.output
    assert "labels agree        6/6" in r.output and "-> PASS" in r.output


def test_fine_tune_and_serve_on_such_a_model(tmp_path, data, mistral_style):
    """`train --finetune` renders the same folded prompts; `serve` starts and answers (it refused to start)."""
    pytest.importorskip("starlette")
    httpx = pytest.importorskip("httpx")
    task = tmp_path / "ft.json"
    r = run(["train", data, "--model", mistral_style, "--save-task", task, *FT])
    assert r.exit_code == 0, r.output
    assert json.loads(task.read_text())["system_in_user_turn"] is True
    from mlx_slm.jobs import plan as plans
    from mlx_slm.jobs.plan import TaskOptions
    from mlx_slm.server import Loaded, ServeOptions, Service
    from tests.server.test_app import ThreadServer

    plan = plans.resolve(TaskOptions(model=str(mistral_style), given=frozenset({"model"})), lambda _m: None)

    def load():  # as `mlx-slm serve --model` loads
        p, clf = plans.load_fitted(plan, lambda _m: None)
        return Loaded(clf, p.calibration, p.min_confidence, p.warmup, model=p.model.name,
                      weights_sha256=clf.engine.weights_sha256)  # fmt: skip

    srv = ThreadServer(Service(load, ServeOptions(max_wait_ms=5))).start()
    try:
        got = httpx.post(srv.url + "/v1/classify", json={"texts": ["my card was charged twice"]}, timeout=60)
        assert got.status_code == 200, got.text
        assert got.json()["results"][0]["label"] in ("billing", "technical", "account")
    finally:
        srv.stop()
