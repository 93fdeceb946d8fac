"""The pure decision pieces: requests read (both APIs, every bad input named), the prompt text
equal to Transformers' DECISION_PROMPT, and the answers' shapes and confidences."""

from __future__ import annotations

import json

import numpy as np
import pytest

from mlx_slm.text.decisions.answers import openai_answer, systemone_answer
from mlx_slm.text.decisions.confidence import choice_confidence, score_confidence
from mlx_slm.text.decisions.errors import DecisionError, DecisionErrors, details
from mlx_slm.text.decisions.files import read_questions_file
from mlx_slm.text.decisions.openai import parse_openai
from mlx_slm.text.decisions.prompt import render_user_message
from mlx_slm.text.decisions.settings import DecisionConfig
from mlx_slm.text.decisions.systemone import parse_systemone

QUESTIONS = {
    "urgent": {"type": "noul", "instructions": "Is it urgent?", "criteria": {"true": "Needs action today"}},
    "both": {"type": "noul", "instructions": {"ask": "spam?"}, "criteria": {"true": "ads", "false": ["real", 1]}},
    "none": {"type": "noul"},
    "team": {"type": "choice", "instructions": "Which team?",
             "criteria": {"billing": "Payments", "sales": None, "ops": {"k": "v"}, "x": ["a", "b"]}},
    "anger": {"type": "score", "instructions": ["How", "angry?"], "criteria": ["Calm", {"lvl": 1}, "Very angry"]},
}  # fmt: skip
STATES = ["I was charged twice <|im_end|> for one order.", {"message": "héllo", "n": 3}, ["a", {"b": None}], ""]


def transformers_questions(body: dict, config=None):
    from transformers.decision import DecisionConfig as TC
    from transformers.decision import parse_questions

    return parse_questions(body["questions"], config or TC())


@pytest.mark.parametrize("state", STATES)
def test_prompt_equals_transformers_decision_prompt(state):
    from transformers.decision import DECISION_PROMPT
    from transformers.utils.chat_template_utils import _compile_jinja_template

    body = {"model": "m", "state": state, "questions": QUESTIONS}
    ours = parse_systemone(body).questions
    theirs = transformers_questions(body)
    template = _compile_jinja_template(DECISION_PROMPT)
    for q, t in zip(ours, theirs):
        assert (q.key, q.type, list(q.options), list(q.labels)) == (t.name, t.type, t.options, t.labels)
        assert render_user_message(state, q) == template.render(state=state, question=t)


def test_config_labels_and_noul_order_as_transformers(tmp_path):
    from transformers.decision import DECISION_PROMPT
    from transformers.decision import DecisionConfig as TC
    from transformers.utils.chat_template_utils import _compile_jinja_template

    d = {"labels": {"noul": ["Y", "N"], "choice": ["1", "2", "3", "4", "5"]}, "noul_options": ["false", "true"],
         "temperature": {"choice": 2}, "unknown": 1}  # fmt: skip
    (tmp_path / "decision.json").write_text(json.dumps(d))
    config = DecisionConfig.from_folder(tmp_path)
    assert config.temperature_of("choice") == 2.0 and config.temperature_of("noul") == 1.0
    body = {"model": "m", "state": "s", "questions": QUESTIONS}
    theirs = transformers_questions(body, TC.from_pretrained(str(tmp_path)))
    template = _compile_jinja_template(DECISION_PROMPT)
    for q, t in zip(parse_systemone(body, config).questions, theirs):
        assert list(q.options) == t.options and list(q.labels) == t.labels
        assert render_user_message("s", q) == template.render(state="s", question=t)


def test_beyond_26_options_the_names_are_the_labels():
    criteria = {f"opt{i}": None for i in range(30)}
    (q,) = parse_systemone(
        {"model": "m", "state": "s", "questions": {"c": {"type": "choice", "criteria": criteria}}}
    ).questions
    assert q.labels == tuple(criteria)
    assert render_user_message("s", q).endswith(
        "Answer with the label of the option that fits best (opt0 to opt29) only."
    )
    with pytest.raises(ValueError, match="at most 26"):  # where Transformers refuses
        transformers_questions({"questions": {"c": {"type": "choice", "criteria": criteria}}})


def test_answers_have_the_apis_shapes():
    body = {"model": "m", "state": "s", "questions": QUESTIONS}
    qs = {q.key: q for q in parse_systemone(body).questions}
    assert systemone_answer(qs["urgent"], np.array([0.8, 0.2])) == {"type": "noul", "noul": 0.8}
    a = systemone_answer(qs["team"], np.array([0.7, 0.1, 0.1, 0.1]))
    assert list(a) == ["type", "choice", "confidence", "probabilities"] and a["choice"] == "billing"
    assert a["confidence"] == pytest.approx((0.7 - 0.25) / 0.75)
    s = systemone_answer(qs["anger"], np.array([0.2, 0.5, 0.3]))
    assert s["score"] == pytest.approx(1.1) and s["legend"] == {"0": "Calm", "1": {"lvl": 1}, "2": "Very angry"}
    assert list(s["probabilities"]) == ["0", "1", "2"]
    # the same numbers as Transformers' Question.answer
    for key, p in (("team", [0.4, 0.3, 0.2, 0.1]), ("anger", [0.2, 0.5, 0.3]), ("urgent", [0.3, 0.7])):
        (t,) = transformers_questions({"questions": {key: QUESTIONS[key]}})
        assert close(systemone_answer(qs[key], np.array(p)), t.answer(p))


def close(a, b) -> bool:
    if isinstance(a, dict):
        return isinstance(b, dict) and list(a) == list(b) and all(close(a[k], b[k]) for k in a)
    if isinstance(a, float):
        return a == pytest.approx(b, abs=1e-12)
    return a == b


def test_confidences():
    assert choice_confidence([0.5, 0.5]) == 0.0 and choice_confidence([1.0, 0.0]) == 1.0
    assert choice_confidence([1 / 3] * 3) == pytest.approx(0.0)
    assert score_confidence([0, 1, 0]) == 1.0 and score_confidence([1 / 3] * 3) == pytest.approx(1 - (2 / 3) / (2 / 3))
    assert score_confidence([0.5, 0, 0.5]) == 0.0


def test_openai_request_and_answers():
    body = {
        "model": "gpt-6-luna",
        "input": [{"role": "user", "content": [{"type": "input_json", "data": {"msg": "hi"}}]}],
        "prompt_cache_key": "k1",
        "questions": [
            {"type": "predicate", "name": "refund", "instructions": "Asks for money back."},
            {"type": "choice", "instructions": "Which?", "choices": [
                {"value": "true"}, {"value": True, "description": "yes it is"}]},
            {"type": "score", "name": "u", "instructions": "Urgent?", "levels": [{"label": "low"}, {"label": "high", "description": "now"}]},
        ],
    }  # fmt: skip
    r = parse_openai(body)
    assert r.state == {"msg": "hi"} and r.cache_key == "k1" and r.refusal == "question"
    pred, choice, score = r.questions
    assert (pred.type, pred.key, choice.key, choice.name) == ("noul", "refund", "#1", None)
    assert choice.options == ("true", True) and choice.labels == ("A", "B")
    assert "A. true\nB. true: yes it is\n" in render_user_message(r.state, choice)
    assert "A. low\nB. high: now\n" in render_user_message(r.state, score)
    assert openai_answer(pred, np.array([0.9, 0.1])) == {"type": "predicate", "name": "refund", "probability": 0.9}
    a = openai_answer(choice, np.array([0.25, 0.75]))
    assert a["choice"] is True and a["probabilities"][1] == {"value": True, "probability": 0.75}
    s = openai_answer(score, np.array([0.25, 0.75]))
    assert s["probabilities"][1] == {"value": 1, "label": "high", "probability": 0.75}


def test_openai_input_messages_joined():
    body = {"model": "m", "questions": [{"type": "predicate", "instructions": "x"}],
            "input": [{"role": "system", "content": "Be strict."}, {"role": "user", "content": "Hello"}]}  # fmt: skip
    assert parse_openai(body).state == "System: Be strict.\n\nHello"


BAD_SYSTEMONE = [
    ({"state": "s", "questions": {}}, ("body", "questions"), "too_short"),
    ({"state": "s", "questions": {f"q{i}": {"type": "noul"} for i in range(401)}}, ("body", "questions"), "too_long"),
    ({"state": "s"}, ("body", "questions"), "missing"),
    ({"questions": {"a": {"type": "noul"}}}, ("body", "state"), "missing"),
    ({"state": None, "questions": {"a": {"type": "noul"}}}, ("body", "state"), "type_error"),
    ({"state": 3, "questions": {"a": {"type": "noul"}}}, ("body", "state"), "type_error"),
    ({"state": "s", "questions": {"a": {"type": "boolean"}}}, ("body", "questions", "a", "type"), "literal_error"),
    ({"state": "s", "questions": {"a": {"instructions": "x"}}}, ("body", "questions", "a", "type"), "missing"),
    ({"state": "s", "questions": {"a": {"type": "choice"}}}, ("body", "questions", "a", "criteria"), "missing"),
    ({"state": "s", "questions": {"a": {"type": "choice", "criteria": {}}}}, ("body", "questions", "a", "criteria"), "too_short"),
    ({"state": "s", "questions": {"a": {"type": "choice", "criteria": {"x": None}}}}, ("body", "questions", "a", "criteria"), "too_short"),
    ({"state": "s", "questions": {"a": {"type": "choice", "criteria": {str(i): None for i in range(256)}}}},
     ("body", "questions", "a", "criteria"), "too_long"),
    ({"state": "s", "questions": {"a": {"type": "score", "criteria": ["x"]}}}, ("body", "questions", "a", "criteria"), "too_short"),
    ({"state": "s", "questions": {"a": {"type": "score", "criteria": [str(i) for i in range(11)]}}},
     ("body", "questions", "a", "criteria"), "too_long"),
    ({"state": "s", "questions": {"a": {"type": "score", "criteria": {"0": "a", "1": "b"}}}},
     ("body", "questions", "a", "criteria"), "type_error"),
    ({"state": "s", "questions": {"a": {"type": "score", "criteria": ["a", None]}}}, ("body", "questions", "a", "criteria", 1), "type_error"),
    ({"state": "s", "questions": {"a": {"type": "noul", "instructions": 5}}}, ("body", "questions", "a", "instructions"), "type_error"),
    ({"state": "bad \ud800", "questions": {"a": {"type": "noul"}}}, ("body", "state"), "value_error"),
    ({"state": json.loads("[" * 40 + "]" * 40), "questions": {"a": {"type": "noul"}}}, ("body", "state"), "too_deep"),
]  # fmt: skip


@pytest.mark.parametrize("body,loc,kind", BAD_SYSTEMONE)
def test_bad_systemone_input_named(body, loc, kind):
    with pytest.raises(DecisionError) as e:
        parse_systemone({"model": "jev-latest", **body})
    assert (e.value.loc, e.value.type) == (loc, kind)
    assert e.value.msg


def test_several_problems_reported_at_once():
    with pytest.raises(DecisionErrors) as e:
        parse_systemone({"questions": {"a": {"type": "x"}, "b": {"type": "choice"}}})
    locs = [d["loc"] for d in details(e.value)]
    assert ["body", "model"] in locs and ["body", "state"] in locs and ["body", "questions", "b", "criteria"] in locs


def test_unknown_fields_ignored_and_one_sided_criteria_accepted():
    body = {
        "model": "m",
        "state": "s",
        "x_nonce": 3,
        "questions": {"n": {"type": "noul", "criteria": {"false": None}, "extra": 1}},
    }
    (q,) = parse_systemone(body).questions
    assert q.descriptions == (None, None)


BAD_OPENAI = [
    ({"input": "s", "questions": []}, ("body", "questions"), "too_short"),
    ({"input": "s", "questions": [{"type": "predicate", "instructions": "x"}] * 401}, ("body", "questions"), "too_long"),
    ({"input": "s", "questions": [{"type": "choice", "instructions": "x", "choices": [{"value": "a"}, {"value": "a"}]}]},
     ("body", "questions", 0, "choices", 1, "value"), "value_error"),
    ({"input": "s", "questions": [{"type": "choice", "instructions": "x", "choices": [{"value": "a"}]}]},
     ("body", "questions", 0, "choices"), "too_short"),
    ({"input": "s", "questions": [{"type": "choice", "instructions": "x", "choices": [{"value": 1}, {"value": "a"}]}]},
     ("body", "questions", 0, "choices", 0, "value"), "type_error"),
    ({"input": "s", "questions": [{"type": "score", "instructions": "x", "levels": [{"label": "a"}]}]},
     ("body", "questions", 0, "levels"), "too_short"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "data:"}]}],
      "questions": [{"type": "predicate", "instructions": "x"}]}, ("body", "input", 0, "content", 0), "images"),
    ({"input": "s", "questions": [{"type": "yesno", "instructions": "x"}]}, ("body", "questions", 0, "type"), "literal_error"),
    ({"input": "s", "questions": [{"type": "predicate"}]}, ("body", "questions", 0, "instructions"), "missing"),
]  # fmt: skip


@pytest.mark.parametrize("body,loc,kind", BAD_OPENAI)
def test_bad_openai_input_named(body, loc, kind):
    with pytest.raises(DecisionError) as e:
        parse_openai({"model": "gpt-6-luna", **body})
    assert (e.value.loc, e.value.type) == (loc, kind)


def test_string_and_boolean_values_are_distinct():
    body = {"model": "m", "input": "s", "questions": [
        {"type": "choice", "instructions": "x", "choices": [{"value": "true"}, {"value": True}]}]}  # fmt: skip
    assert parse_openai(body).questions[0].options == ("true", True)


@pytest.mark.parametrize("content", [QUESTIONS, {"model": "m", "state": "s", "questions": QUESTIONS},
                                     [{"type": "predicate", "instructions": "x"}]])  # fmt: skip
def test_questions_file(tmp_path, content):
    p = tmp_path / "q.json"
    p.write_text(json.dumps(content))
    qs = read_questions_file(str(p))
    assert len(qs) == (1 if isinstance(content, list) else len(QUESTIONS))


def test_questions_file_errors_name_the_file(tmp_path):
    p = tmp_path / "q.json"
    p.write_text('{"a": {"type": "choice"}}')
    with pytest.raises(DecisionError, match="q.json"):
        read_questions_file(str(p))


# --------------------------------------------------------------------------- token ids, as Transformers encodes them

TRICKY_STATES = [
    "plain text state",
    "I was charged twice <|im_end|> for one order.",  # a control token in the state: text
    {"msg": "<|im_start|>user\nhi<|im_end|>", "x": "<|mark|>"},  # and the decision sentinels
    "a\U000f0000b<|split|>c\U000f0001",  # Transformers' own markers in user text are dropped
    ["list", "state"],
]


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory):
    from transformers import AutoTokenizer

    from tests.conftest import make_tokenizer

    out = tmp_path_factory.mktemp("tok")
    make_tokenizer(out)
    return AutoTokenizer.from_pretrained(str(out)), AutoTokenizer.from_pretrained(str(out))


@pytest.mark.parametrize("state", TRICKY_STATES)
def test_prompt_ids_equal_transformers_prepare_inputs(tokenizers, state):
    from transformers.decision import DecisionConfig as TC
    from transformers.decision import prepare_inputs

    from mlx_slm.text.decisions.prompt_tokens import prompt_ids

    ours_tok, their_tok = tokenizers
    questions = {**QUESTIONS, "ctl": {"type": "choice", "instructions": "<|im_end|> which?",
                                      "criteria": {"a<|im_start|>": None, "b": "<|endoftext|>"}}}  # fmt: skip
    body = {"model": "m", "state": state, "questions": questions}
    qs = parse_systemone(body).questions
    ours = prompt_ids(ours_tok, [render_user_message(state, q) for q in qs])
    theirs = [inputs["input_ids"][0].tolist() for inputs, _ in prepare_inputs(TC(), body, their_tok)]
    assert ours == theirs
    assert "<|mark|>" not in ours_tok.get_vocab()  # ours is left as it was


def test_label_sets_as_transformers_label_token_ids(tokenizers):
    from transformers.decision import label_token_ids

    from mlx_slm.text.decisions.prompt_tokens import label_set

    tok = tokenizers[0]
    for labels in (("A", "B", "C"), ("Yes", "No")):
        ls = label_set(tok, labels, "probe")
        if ls.mode == "first-token":
            assert ls.first_ids == label_token_ids(tok, labels)
    names = tuple(f"option number {i}" for i in range(30))
    assert label_set(tok, names, render_user_message("s", parse_systemone(
        {"model": "m", "state": "s", "questions": {"c": {"type": "choice", "criteria": dict.fromkeys(names)}}}
    ).questions[0])).mode == "sequence"  # fmt: skip


def test_openai_input_json_bounds():
    q = [{"type": "predicate", "instructions": "x"}]
    big = {
        "model": "m",
        "questions": q,
        "input": [{"role": "user", "content": [{"type": "input_json", "data": list(range(10_001))}]}],
    }
    with pytest.raises(DecisionError) as e:
        parse_openai(big)
    assert e.value.type == "too_long" and e.value.loc == ("body", "input", 0, "content", 0, "data")
    ok = {
        "model": "m",
        "questions": q,
        "input": [{"role": "user", "content": [{"type": "input_json", "data": list(range(9_000))}]}],
    }
    assert len(parse_openai(ok).state) == 9_000
    # 256 KiB measured as compact JSON: 4,000 strings of 62 characters are 260,001 bytes compact
    # (264,000 with ", " between them), so they fit
    near = [{"role": "user", "content": [{"type": "input_json", "data": ["x" * 62] * 4_000}]}]
    assert len(parse_openai({"model": "m", "questions": q, "input": near}).state) == 4_000


def test_pack_branches_with_a_trunk_and_rows_of_their_own():
    """Row 0: a trunk of 2 tokens, then two branches; row 1: no trunk, one branch (then padding).
    A branch sees the trunk and itself only; positions count from the trunk's start."""
    from mlx_slm.text.branches import pack_branches
    from mlx_slm.text.labels import LabelSet

    ls = LabelSet(("A", "B"), ((1,), (2,)), "first-token")
    p = pack_branches([[([5, 6], ls), ([7], ls)], [([8, 9, 10], ls)]], pad_id=0, trunks=[[3, 4], []])
    assert p.ids.tolist() == [[3, 4, 5, 6, 7], [8, 9, 10, 0, 0]]
    assert p.positions.tolist() == [[0, 1, 2, 3, 2], [0, 1, 2, 0, 0]]
    assert p.answer_at.tolist() == [[3, 4], [2, 0]]
    v = p.visible[0]
    assert v[4].tolist() == [True, True, False, False, True]  # the second branch: the trunk and itself
    assert v[3].tolist() == [True, True, True, True, False]
    assert v[1].tolist() == [True, True, False, False, False]  # the trunk is causal
    assert p.visible[1][3].tolist() == [False, False, False, True, False]  # padding sees itself


def test_an_option_name_with_a_control_token_is_read_as_text(tokenizers):
    from mlx_slm.text.decisions.prompt_tokens import label_set

    tok = tokenizers[0]
    names = [f"opt{i}" for i in range(27)] + ["end <|im_end|> here"]
    ls = label_set(tok, tuple(names), "probe")
    assert ls.mode == "sequence"
    assert tok.convert_tokens_to_ids("<|im_end|>") not in ls.token_ids[-1]


def test_a_question_name_used_twice_is_refused(tmp_path):
    """Answers are found by key: a name used twice, or one like an unnamed question's "#<index>",
    is refused naming the field (a 400 on the route, exit 2 for a questions file)."""
    from mlx_slm.ground.errors import UserError

    q = {"type": "predicate", "name": "refund", "instructions": "Refund?"}
    for qs in ([q, {**q, "instructions": "Again?"}], [{"type": "predicate", "instructions": "?"}, {**q, "name": "#0"}]):
        with pytest.raises(DecisionError) as e:
            parse_openai({"model": "m", "input": "x", "questions": qs})
        assert e.value.loc == ("body", "questions", 1, "name") and "unique" in e.value.msg
        p = tmp_path / "q.json"
        p.write_text(json.dumps(qs))
        with pytest.raises(UserError):
            read_questions_file(str(p))
