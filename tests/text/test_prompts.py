"""The prompt (`text/prompts.py`): rendered with the chat template, its shared prefix, placeholders
filled or refused, braces kept, typed --system and --template."""

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from transformers import AutoTokenizer

from mlx_slm.cli import main
from mlx_slm.text.prompts import (
    PromptError,
    PromptFormat,
    common_prefix,
    fill_labels,
    render,
    shared_prefix,
    starts_with,
    tokenize,
)
from tests.conftest import MISTRAL_V01
from tests.train_cli import FT, run, train_file


@pytest.fixture(scope="module")
def tok(tiny_qwen_hf):
    return AutoTokenizer.from_pretrained(str(tiny_qwen_hf))


def test_render_uses_chat_template(tok):
    p = render(tok, PromptFormat(), "hello")
    assert p.startswith("<|im_start|>system\n") and p.endswith("<|im_start|>assistant\n")
    assert "Ticket: hello\nCategory:" in p


def test_template_without_placeholder_refused():
    with pytest.raises(PromptError, match=r"\{text\}"):
        PromptFormat(template="Ticket:")


def test_braces_in_text_and_template_are_kept(tok):
    p = render(tok, PromptFormat(system=None, template="{json} {text}"), "{x}")
    assert "{json} {x}" in p


def test_common_prefix():
    assert common_prefix([[1, 2, 3], [1, 2, 4], [1, 2]]) == [1, 2]
    assert common_prefix([]) == []


def test_shared_prefix_is_a_prefix_of_real_prompts(tok):
    fmt = PromptFormat()
    head = shared_prefix(tok, fmt)
    assert len(head) > 10
    texts = ["My card was charged twice", ":: odd start", "x", "\u00fcber"]
    for ids in tokenize(tok, [render(tok, fmt, t) for t in texts]):
        assert starts_with(ids, head)
    assert not starts_with(head, head)  # no suffix token left: not usable


def test_typed_system_and_template_refuse_unknown_placeholders_and_unescape_braces():
    """Issue 26: `{label}` in --system reached the model literally (a typo of `{labels}`)."""
    from mlx_slm.text.prompts import check_template, fill_system

    labels = ["a", "b"]
    assert fill_system('One of {labels}. Reply {{"label": {{"x": 1}}}}, {"k": 1}', labels) == (
        'One of a, b. Reply {"label": {"x": 1}}, {"k": 1}'
    )
    assert fill_system("{{{labels}}}", labels) == "{a, b}"
    assert fill_system("{label_descriptions}", labels, {"a": "the {first}"}) == "- a: the {first}\n- b"
    assert check_template("Id {{n}}: {text}") == "Id {n}: {text}"
    for bad, words in [
        ("Use {label}", ["--system holds {label}", "did you mean {labels}?", "{{label}}"]),
        ("x {foo}", ["{foo}", "not a placeholder", "{labels}, {label_descriptions}"]),
        ("x {text}", ["{text}", "the template"]),
        ("x {{labels}}", ["escaped {labels}"]),
    ]:
        with pytest.raises(PromptError) as e:
            fill_system(bad, labels)
        assert all(w in str(e.value) for w in words), str(e.value)
    for bad, words in [
        ("{txt}", ["the template holds {txt}", "did you mean {text}?"]),
        ("{labels} {text}", ["--system"]),
    ]:
        with pytest.raises(PromptError) as e:
            check_template(bad)
        assert all(w in str(e.value) for w in words), str(e.value)


def test_cli_refuses_an_unknown_placeholder_before_work_and_keeps_braces_in_texts(tiny_qwen_mlx, tmp_path):
    import json

    from click.testing import CliRunner

    from mlx_slm.cli import main
    from mlx_slm.files.output import manifest_path

    inp = tmp_path / "in.jsonl"
    inp.write_text(json.dumps({"id": 1, "text": 'json {"label": {foo}} here'}) + "\n")
    shots = tmp_path / "shots.jsonl"
    shots.write_text(json.dumps({"text": "{label} {{x}}", "label": "a"}) + "\n")
    out = tmp_path / "o.jsonl"
    base = ["classify", str(inp), "-o", str(out), "--model", str(tiny_qwen_mlx), "--labels", "a,b", "-q"]
    r = CliRunner().invoke(main, [*base, "--system", "Pick one of {label}."])
    assert r.exit_code == 2 and "did you mean {labels}?" in r.output and not out.exists()
    r = CliRunner().invoke(main, [*base, "--template", "T: {txt}"])
    assert r.exit_code == 2 and "did you mean {text}?" in r.output and not out.exists()
    system = 'Pick one of {labels}; reply as {{"label": ...}}.'
    r = CliRunner().invoke(main, [*base, "--system", system, "--examples", str(shots)])
    assert r.exit_code == 0, r.output
    settings = json.loads(manifest_path(str(out)).read_text())["settings"]
    assert settings["system"] == 'Pick one of a, b; reply as {"label": ...}.'
    assert settings["examples"] == [["{label} {{x}}", "a"]]


# Labels with descriptions: the `{labels}` / `{label_descriptions}` placeholders, and the CLI end to end
# (the saved task holds the message the model saw).


def test_placeholders_filled_and_other_braces_kept():
    labels = ["card arrival", "refund"]
    system = "Route {this}. One of: {labels}.\nMeanings:\n{label_descriptions}"
    got = fill_labels(system, labels, {"card arrival": "the card has not come"})
    assert (
        got == "Route {this}. One of: card arrival, refund.\nMeanings:\n- card arrival: the card has not come\n- refund"
    )
    assert fill_labels(None, labels) is None and fill_labels("plain", labels) == "plain"
    with pytest.raises(PromptError, match="not among the labels"):
        fill_labels(system, labels, {"other": "x"})


def test_cli_descriptions_reach_the_prompt_and_the_task(tiny_qwen_mlx, tmp_path):
    labels = tmp_path / "labels.tsv"
    labels.write_text("ab\tthe first kind\nac\tthe second kind\nb\n")
    task = tmp_path / "task.json"
    args = ["classify", "--model", str(tiny_qwen_mlx), "--labels-file", str(labels), "-q"]
    sys_msg = "Answer with one of: {labels}.\n{label_descriptions}"
    r = CliRunner().invoke(main, [*args, "--system", sys_msg, "--save-task", str(task)], input="hello there\n")
    assert r.exit_code == 0, r.output
    row = json.loads(r.stdout.splitlines()[0])
    assert set(row["probs"]) == {"ab", "ac", "b"}  # scored on the names
    saved = json.loads(task.read_text())
    assert saved["system"] == "Answer with one of: ab, ac, b.\n- ab: the first kind\n- ac: the second kind\n- b"
    # The same run from the saved task gives the same row: the filled message is what was saved.
    r2 = CliRunner().invoke(main, ["classify", "--task", str(task), "-q"], input="hello there\n")
    assert r2.exit_code == 0, r2.output
    assert r2.stdout == r.stdout


# A chat template that refuses a system turn (hostile round seven, issue 47): the system text goes into the
# user turn, in every path (classify, train, fine-tune, serve), and is recorded.


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return train_file(tmp_path_factory)


# --------------------------------------------------------------------------- a chat template that refuses a system turn
# Mistral-v0.1's template: tests.conftest.MISTRAL_V01.


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


# --------------------------------------------------------------------------- options and messages


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
