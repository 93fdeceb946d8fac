"""Property-based fuzzing (Hypothesis) of the hostile classes round seven found in the jobs, the CLI,
training and task files (issue 47), kept in the suite as tests/suites/test_fuzz.py keeps the readers':

* eval's figures with a none label: any answer set scores "none of these" as an answer, the same in
  accuracy, the per-label table, the confusion and the none section; a perfect one scores 1 in all;
* chat templates: any template (refusing a system turn, every turn, or with a syntax error) renders
  a prompt or is a clean `PromptError`; one that refuses only the system turn gets it in the user turn;
* training data labels (surrogates, spaces, blanks, non-strings) and `--none-data` rows: read, or a
  `TrainError` naming the line, never another exception;
* fine-tuning settings: any value is taken or refused naming the setting and its option;
* every numeric option: what --help shows is what the check takes;
* task files with the new `system_in_user_turn` field of any JSON value: a task or a `TaskError`.

Budget: `MLX_SLM_FUZZ_EXAMPLES` examples per property (default 100; 25 in the quick loop)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, assume, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from mlx_slm.ground.errors import UserError  # noqa: E402

EXAMPLES = int(os.environ.get("MLX_SLM_FUZZ_EXAMPLES", "100"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.filter_too_much],
)
LABELS = ["billing", "technical", "account"]
HOSTILE_LABELS = ["billing", " billing", "", " ", "\ud800", "bil\udfffling", "oos", "none", "{text}", "x" * 300]
json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True), st.text(max_size=20),
    st.sampled_from(HOSTILE_LABELS),
)  # fmt: skip
json_values = st.recursive(
    json_scalars, lambda kids: st.one_of(st.lists(kids, max_size=4), st.dictionaries(st.text(max_size=8), kids)),
    max_leaves=12,
)  # fmt: skip


# ----------------------------------------------------------------------------- eval with a none label
def _row(i: int, gold: str) -> SimpleNamespace:
    return SimpleNamespace(line=i + 1, id=i + 1, text="t", error=None, gold=gold, pair=None)


@FUZZ
@given(
    pairs=st.lists(
        st.tuples(st.sampled_from([*LABELS, "oos"]), st.sampled_from([*LABELS, None])), min_size=1, max_size=40
    ),
    learned=st.booleans(),
)
def test_eval_scores_none_of_these_as_an_answer_everywhere(pairs, learned):
    from mlx_slm.cli.eval import _report
    from mlx_slm.text.metrics import report

    labels = [*LABELS, "oos"] if learned else list(LABELS)
    rows = [_row(i, g) for i, (g, _) in enumerate(pairs)]
    preds = []
    for _, p in pairs:
        probs = {lab: 1.0 / len(labels) for lab in labels}
        if p is not None:
            probs = {lab: (0.7 if lab == p else 0.3 / (len(labels) - 1)) for lab in labels}
        preds.append({"label": p, "probs": probs, "error": None})
    try:
        rep, errors = _report(rows, preds, labels, "label", "in.jsonl", report, "oos")
    except UserError:
        return
    assert not errors and rep["labels"].count("oos") == 1 and rep["abstained"] == 0
    right = sum(g == (p or "oos") for g, p in pairs)
    assert rep["accuracy"] == pytest.approx(right / len(pairs))
    k = rep["labels"].index("oos")
    cm = rep["confusion"]
    assert sum(map(sum, cm)) == len(pairs) and cm[k][k] == sum(g == "oos" and p is None for g, p in pairs)
    none, f = rep["per_label"]["oos"], rep["out_of_scope"]
    if f["oos_recall"] is not None:
        assert none["recall"] == pytest.approx(f["oos_recall"], abs=1e-4)
    if f["oos_precision"] is not None:
        assert none["precision"] == pytest.approx(f["oos_precision"], abs=1e-4)
    if right == len(pairs):  # a perfect answer set scores 1 everywhere
        assert rep["accuracy"] == rep["accuracy_all"] == rep["macro_f1"] == 1.0
    assert 0.0 <= rep["macro_f1"] <= 1.0 and 0.0 <= rep["ece"] <= 1.0


# ----------------------------------------------------------------------------- chat templates
TEMPLATES = [
    # Mistral-v0.1: roles alternate from a user turn, a system turn raised
    "{% for m in messages %}{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{{ '[INST] ' + m['content'] + ' [/INST]' if m['role'] == 'user' else m['content'] }}{% endfor %}",
    # Gemma-1 style: a system turn refused outright
    "{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
    "{% endif %}<start_of_turn>{{ m['role'] }}\n{{ m['content'] }}<end_of_turn>\n{% endfor %}",
    "{{ raise_exception('no conversation suits me') }}",  # refuses every conversation
    "{% for m in messages %}{{ m['content'] }}{% endfor %}",  # takes anything
    "{% for m in messages %}{{ m['content'] }",  # a syntax error
    "{{ messages[0]['content'] + 1 }}",  # a Python error inside an expression (TypeError)
    "{{ messages[0].nope.deeper }}",  # an undefined name used
    "{% if messages[0]['role'] == 'user' %}{{ raise_exception('a system turn first, please') }}{% endif %}"
    "{% for m in messages %}{{ m['content'] }}{% endfor %}",  # refuses the folded prompt, takes the system
]


@pytest.fixture(scope="module")
def tokenizer(tiny_qwen_mlx):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_qwen_mlx))


@FUZZ
@given(
    template=st.one_of(st.sampled_from(TEMPLATES), st.text(max_size=60)),
    system=st.one_of(st.none(), st.sampled_from(["", "Answer with one word.", "{labels}", "\u2028sys"])),
    text=st.text(min_size=1, max_size=30),
    examples=st.lists(st.tuples(st.sampled_from(["x", "y z"]), st.sampled_from(LABELS)), max_size=2),
)
def test_any_chat_template_renders_a_prompt_or_is_a_clean_prompt_error(tokenizer, template, system, text, examples):
    import copy

    from mlx_slm.text.prompts import PromptError, PromptFormat, prompt_messages, render

    assume("\ud800" not in text)
    tok = copy.copy(tokenizer)  # a fresh tokenizer: what `refuses_system` found is kept on it
    tok.chat_template = template or None
    for attr in ("_mlx_slm_refuses_system",):
        tok.__dict__.pop(attr, None)
    fmt = PromptFormat(system, "T: {text}", examples=tuple(examples))
    try:
        out = render(tok, fmt, text)
    except PromptError as e:
        assert "the model's chat template refused the prompt" in str(e)
        return
    assert isinstance(out, str)
    msgs = prompt_messages(tok, fmt, text)
    if system and msgs[0]["role"] != "system":  # folded: the system text opens the first user turn
        assert msgs[0]["role"] == "user" and msgs[0]["content"].startswith(system + "\n\n")


# ----------------------------------------------------------------------------- training data labels
@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fuzz-jobs")


@FUZZ
@given(golds=st.lists(json_scalars, min_size=1, max_size=12), n=st.integers(0, 10_000))
def test_training_labels_read_or_refused_naming_the_line(work, golds, n):
    from mlx_slm.jobs.train import TrainError, read_training_data

    path = work / f"d{n}.jsonl"
    lines = [json.dumps({"text": f"text {i}", "label": g}) for i, g in enumerate(golds)]
    lines += [json.dumps({"text": f"more {i}", "label": lab}) for i, lab in enumerate(LABELS * 2)]
    path.write_text("\n".join(lines) + "\n")
    try:
        data = read_training_data(str(path), None, need=(0, ""))
    except TrainError as e:
        assert str(path) in str(e)
        return
    for lab in data.labels:  # every label read is one a tokenizer can encode
        lab.encode("utf-8")


@FUZZ
@given(rows=st.lists(st.dictionaries(st.sampled_from(["text", "label", "id"]), json_scalars), max_size=6))
def test_none_data_is_read_or_refused_before_any_training(work, rows):
    from mlx_slm.jobs.out_of_scope import check_none_data
    from mlx_slm.jobs.train import TrainError

    data = work / "data.jsonl"
    data.write_text("".join(json.dumps({"text": f"t{i}", "label": lab}) + "\n" for i, lab in enumerate(LABELS * 2)))
    held = work / "held.jsonl"
    held.write_text("".join(json.dumps(r) + "\n" for r in rows))
    try:
        check_none_data(str(held), str(data), "oos")
    except (TrainError, UserError) as e:
        assert str(held) in str(e) or "held-out" in str(e)


# ----------------------------------------------------------------------------- fine-tuning settings
SETTINGS = ["layers", "rank", "epochs", "batch_size", "learning_rate", "head_learning_rate", "scale", "dropout",
            "val_fraction", "label_smoothing", "contrastive", "patience", "objective", "head_init", "keep"]  # fmt: skip


@FUZZ
@given(name=st.sampled_from(SETTINGS), value=json_scalars)
def test_fine_tuning_settings_taken_or_refused_naming_setting_and_option(engine, name, value):
    from dataclasses import replace

    from mlx_slm.weights.adapters import FinetuneError
    from mlx_slm.weights.finetune import OPTIONS, FinetuneSettings

    model = engine.model  # the tiny model: 3 blocks
    try:
        replace(FinetuneSettings(), **{name: value}).check(model)  # type: ignore[arg-type]
    except FinetuneError as e:
        said = str(e)
        assert said.startswith(f"{name}=") or said.split("=")[0] in SETTINGS, said
        if said.startswith(f"{name}=") and name in OPTIONS:
            assert OPTIONS[name] in said
    except (TypeError, ValueError) as e:  # a value of another type may fail inside the check: never a crash
        assert isinstance(e, UserError), repr(e)


# ----------------------------------------------------------------------------- numeric options
def _numeric_options():
    import click

    from mlx_slm.cli import main

    out = []
    for cname, cmd in sorted(main.commands.items()):
        for p in cmd.params:
            if isinstance(p, click.Option) and getattr(p.type, "range_name", None):
                out.append((cname, p))
    return out


@FUZZ
@given(
    pick=st.integers(0, 10_000),
    value=st.one_of(st.floats(allow_nan=True), st.integers(-(10**12), 10**12), st.sampled_from(["1", "0", "1.0"])),
)
def test_a_numeric_options_help_range_is_what_its_check_takes(pick, value):
    import click

    from mlx_slm.ground.ranges import RANGES

    options = _numeric_options()
    cname, p = options[pick % len(options)]
    r = RANGES[p.type.range_name]
    try:
        got = p.type.convert(str(value), p, None)
    except click.BadParameter:
        got = None
    v = float(value) if not r.integer else None
    if r.integer:
        try:
            v = int(str(value))
        except ValueError:
            return
    shown_ok = all(
        (
            v == v,  # not NaN
            abs(v) != float("inf"),
            p.type.min is None or (v > p.type.min if p.type.min_open else v >= p.type.min),
            p.type.max is None or (v < p.type.max if p.type.max_open else v <= p.type.max),
        )
    )
    assert (got is not None) == shown_ok, (cname, p.opts, value)


# ----------------------------------------------------------------------------- task files
TASK = {"format": "mlx-slm.task", "version": 1, "model": "m", "labels": LABELS, "system": None,
        "template": "T: {text}", "system_in_user_turn": True}  # fmt: skip


@FUZZ
@given(value=json_values, model=st.one_of(st.sampled_from(["m", "/gone/away", "\ud800", ""]), json_scalars))
def test_task_files_with_any_new_field_value_load_or_are_refused(value, model):
    from mlx_slm.classifier.task import Task
    from mlx_slm.kinds.base import TaskError

    d = {**TASK, "system_in_user_turn": value, "model": model}
    try:
        t = Task.from_dict(json.loads(json.dumps(d)), "task file t.json")
    except TaskError:
        return
    assert t.system_in_user_turn is value and "system_in_user_turn" in t.to_dict() or not value
