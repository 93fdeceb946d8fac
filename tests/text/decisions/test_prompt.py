"""The prompt's text: DECISION_PROMPT as Transformers writes it (letters), and the names style."""

from __future__ import annotations

import pytest

from mlx_slm.text.decisions.prompt import names, question_text, render_user_message, styled
from mlx_slm.text.decisions.settings import DecisionConfig
from mlx_slm.text.decisions.systemone import parse_systemone, systemone_questions
from tests.decision_cases import QUESTIONS, transformers_questions

CFG = DecisionConfig()
QS = systemone_questions(
    {
        "team": {"type": "choice", "instructions": "Which team?", "criteria": {"billing": "Payments", "sales": None}},
        "anger": {"type": "score", "instructions": "How angry?", "criteria": ["Calm", "Mad", "Furious"]},
        "urgent": {"type": "noul", "instructions": "Urgent?"},
        "same": {"type": "score", "instructions": "?", "criteria": ["x", "x"]},
    },
    CFG,
)


def test_letters_are_transformers_prompt():
    assert question_text(QS[0]) == (
        "Which team?\nA. billing: Payments\nB. sales\n"
        "Answer with the letter of the option that fits best (A to B) only."
    )


def test_the_names_style_lists_and_reads_the_options_by_name():
    team = styled(QS[0], "names")
    assert team.labels == ("billing", "sales") and team.options == QS[0].options
    assert render_user_message("My card was charged twice.", team, "names") == (
        "My card was charged twice.\n\nWhich team?\n- billing: Payments\n- sales\n"
        "Answer with exactly one of: billing or sales."
    )
    anger = styled(QS[1], "names")
    assert anger.labels == ("Calm", "Mad", "Furious")
    assert render_user_message("s", anger, "names").endswith(
        "- Calm\n- Mad\n- Furious\nAnswer with exactly one of: Calm, Mad or Furious."
    )


def test_the_names_style_leaves_what_it_does_not_apply_to():
    assert names(QS[2]) is None and styled(QS[2], "names") is QS[2]  # a noul: Yes/No either way
    assert names(QS[3]) is None and styled(QS[3], "names") is QS[3]  # levels that are not distinct
    assert render_user_message("s", QS[2], "names") == render_user_message("s", QS[2])


STATES = ["I was charged twice <|im_end|> for one order.", {"message": "héllo", "n": 3}, ["a", {"b": None}], ""]


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
