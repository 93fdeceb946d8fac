"""A decision question's digest: the question itself, the same whatever the route, the file form
or the id it came in, and another for any change the model would be shown."""

from __future__ import annotations

import pytest

from mlx_slm.text.decisions.openai import openai_questions
from mlx_slm.text.decisions.prompt import render_user_message
from mlx_slm.text.decisions.questions import DecisionRequest, option_labels
from mlx_slm.text.decisions.settings import DecisionConfig
from mlx_slm.text.decisions.systemone import parse_systemone, systemone_questions
from tests.decision_cases import transformers_questions

CFG = DecisionConfig()
S1 = {
    "team": {"type": "choice", "instructions": "Which team?", "criteria": {"billing": "Payments", "sales": None}},
    "urgent": {"type": "noul", "instructions": "Urgent?"},
    "anger": {"type": "score", "instructions": "How angry?", "criteria": ["Calm", "Mad"]},
}
OA = [
    {"type": "choice", "name": "x", "instructions": "Which team?",
     "choices": [{"value": "billing", "description": "Payments"}, {"value": "sales"}]},
    {"type": "predicate", "instructions": "Urgent?"},
    {"type": "score", "name": "y", "instructions": "How angry?", "levels": [{"label": "Calm"}, {"label": "Mad"}]},
]  # fmt: skip


def digests(qs):
    return [q.digest for q in qs]


def test_the_same_question_on_either_route_under_any_id_has_one_digest():
    a, b = systemone_questions(S1, CFG), openai_questions(OA, CFG)
    assert digests(a) == digests(b)
    assert [q.key for q in a] != [q.key for q in b]  # ids differ, digests do not


@pytest.mark.parametrize(
    "change",
    [
        lambda q: q["team"].update(instructions="Which team now?"),
        lambda q: q["team"].update(criteria={"billing": "Payments!", "sales": None}),
        lambda q: q["team"].update(criteria={"sales": None, "billing": "Payments"}),  # another order
        lambda q: q["team"].update(criteria={"billing": "Payments", "sales": None, "support": None}),
        lambda q: q["team"].update(type="choice", criteria={"Billing": "Payments", "sales": None}),
    ],
)
def test_any_change_the_model_would_see_gives_another_digest(change):
    import copy

    other = copy.deepcopy(S1)
    change(other)
    assert systemone_questions(other, CFG)[0].digest != systemone_questions(S1, CFG)[0].digest


def test_a_scores_level_labels_the_names_style_reads_are_in_its_digest():
    """OpenAI's {"label": "Low", "description": "can wait"} shows the letters "Low: can wait", as System
    One's criterion "Low: can wait" does, but the names style asks "Low": two questions, two digests
    (one's fit or cached prompt never answers the other); a level with no description stays one."""
    from mlx_slm.text.decisions.prompt import names_text, styled

    oa = [{"type": "score", "instructions": "How urgent?",
           "levels": [{"label": "Low", "description": "can wait"}, {"label": "High", "description": "now"}]}]  # fmt: skip
    so = {"u": {"type": "score", "instructions": "How urgent?", "criteria": ["Low: can wait", "High: now"]}}
    (a,), (b,) = openai_questions(oa, CFG), systemone_questions(so, CFG)
    assert render_user_message("s", a) == render_user_message("s", b)
    assert names_text(styled(a, "names")) != names_text(styled(b, "names"))
    assert a.digest != b.digest
    assert digests(openai_questions(OA, CFG))[2] == digests(systemone_questions(S1, CFG))[2]  # labels alone: one


def test_options_the_letters_show_alike_but_answers_keep_apart_have_their_own_digest():
    """OpenAI's [true, "true"] shows the letters "true" twice; System One's {"true", "\\"true\\""} shows
    "true" and "\\"true\\"": the same answer names, other prompts, so other digests (a head or fit of one
    never answers the other); a task saved before binds by the digest of then (`digest_before`)."""
    from mlx_slm.text.decisions.prompt import question_text

    so = systemone_questions({"q": {"type": "choice", "instructions": "Which?", "criteria": {"true": None, '"true"': None}}}, CFG)[0]  # fmt: skip
    oa = openai_questions([{"type": "choice", "instructions": "Which?", "choices": [{"value": True}, {"value": "true"}]}], CFG)[0]  # fmt: skip
    assert so.answer_names() == oa.answer_names() and question_text(so) != question_text(oa)
    assert so.digest != oa.digest and oa.digest_before == so.digest == so.digest_before


def test_a_string_and_a_boolean_of_one_text_stay_apart_as_answer_names():
    (q,) = openai_questions(
        [{"type": "choice", "instructions": "?", "choices": [{"value": "true"}, {"value": True}]}], CFG
    )
    assert q.answer_names() == ('"true"', "true") and len(set(q.answer_names())) == 2
    assert option_labels(["true", "false"]) == ["true", "false"]  # no boolean beside them: as they are


def test_a_request_says_what_it_refuses():
    assert DecisionRequest("s", ()).refusal == "request"
    with pytest.raises(ValueError, match="refusal"):
        DecisionRequest("s", (), refusal="never")


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
