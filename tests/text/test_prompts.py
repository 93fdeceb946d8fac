import pytest
from transformers import AutoTokenizer

from mlx_slm.text.labels import LabelError, build_labelset, parse_labels, softmax
from mlx_slm.text.prompts import PromptError, PromptFormat, common_prefix, render, shared_prefix, starts_with, tokenize


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


def test_labels_first_token_mode(tok):
    ls = build_labelset(tok, ["a", "b", "c"], render(tok, PromptFormat(), "x"))
    assert ls.mode == "first-token" and all(len(t) == 1 for t in ls.token_ids)


def test_labels_sequence_mode_when_first_tokens_are_shared(tok):
    ls = build_labelset(tok, ["refund request", "refund status"], render(tok, PromptFormat(), "x"))
    assert ls.mode == "sequence"
    assert ls.token_ids[0][0] == ls.token_ids[1][0]


@pytest.mark.parametrize(
    "labels, msg",
    [(["a", ""], "empty"), (["a", "a"], "twice"), (["a"], "at least two"), ([" a", "  "], "empty")],
)
def test_bad_labels_refused(tok, labels, msg):
    with pytest.raises(LabelError, match=msg):
        build_labelset(tok, labels, render(tok, PromptFormat(), "x"))


def test_first_token_mode_refused_for_multi_token_labels(tok):
    with pytest.raises(LabelError, match="sequence"):
        build_labelset(tok, ["refund request", "refund status"], render(tok, PromptFormat(), "x"), "first-token")


def test_parse_labels_and_softmax():
    assert parse_labels(" billing, technical ,account") == ["billing", "technical", "account"]
    p = softmax([1.0, 1.0])
    assert p.tolist() == [0.5, 0.5]


def test_base_model_labels_follow_the_prompt_after_a_space(tmp_path):
    """Without a chat template the prompt ends "Category:", and a model writes " billing"."""
    from mlx_slm.text.labels import build_labelset
    from tests.conftest import make_tokenizer

    tok = make_tokenizer(tmp_path)
    tok.chat_template = None
    probe = render(tok, PromptFormat("Sort.", "Ticket: {text}\nCategory:"), "example")
    assert probe.endswith("Category:")
    ls = build_labelset(tok, ["billing", "technical"], probe)
    for lab, ids in zip(ls.labels, ls.token_ids):
        assert tok.decode(list(ids)) == " " + lab


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


def test_one_home_for_label_and_gold_rules():
    """labels.py holds the rules every caller words its own way: a label, a label set, a gold label."""
    from mlx_slm.text.labels import (
        GOLD_MISSING,
        GOLD_NOT_STRING,
        LABEL_EMPTY,
        LABEL_NOT_STRING,
        MIN_LABELS,
        gold_problem,
        label_problem,
    )

    assert MIN_LABELS == 2
    assert (
        label_problem("billing") is None and label_problem(" ") == LABEL_EMPTY and label_problem(3) == LABEL_NOT_STRING
    )
    labels = ["billing", "technical"]
    assert gold_problem("billing", labels) is None and gold_problem(None, labels) == GOLD_MISSING
    assert gold_problem(["billing"], labels) == GOLD_NOT_STRING
    for bad in ("", " billing", "account"):
        assert gold_problem(bad, labels) is not None
    assert gold_problem("anything", None) is None and gold_problem(" x", None) is not None
