"""Gold answers of decision questions (`text/decisions/gold.py`): which question each
`--gold-field KEY=FIELD` scores, and which option a gold value names (a noul's true/false, a
choice's typed value or its text, a score's number or level name)."""

from __future__ import annotations

import pytest

from mlx_slm.ground.errors import UsageError
from mlx_slm.text.decisions.gold import check_distinct, gold_index, gold_pairs
from mlx_slm.text.decisions.openai import parse_openai
from mlx_slm.text.decisions.systemone import parse_systemone

BODY = {
    "model": "m",
    "state": "s",
    "questions": {
        "urgent": {"type": "noul"},
        "team": {"type": "choice", "criteria": {"billing": None, "technical": None}},
        "anger": {"type": "score", "criteria": ["Calm", "Annoyed", "Very angry"]},
    },
}


def test_gold_fields_name_each_question_once():
    qs = parse_systemone(BODY).questions
    assert gold_pairs(qs, ["urgent=is_urgent", "team"]) == {"urgent": "is_urgent", "team": "team"}
    with pytest.raises(UsageError, match="'mood' is not a question key"):
        gold_pairs(qs, ["mood=m"])
    with pytest.raises(UsageError, match="given twice"):
        gold_pairs(qs, ["team=a", "team=b"])
    with pytest.raises(UsageError, match="the FIELD after '=' is empty"):  # not read as KEY alone, unseen
        gold_pairs(qs, ["team="])
    with pytest.raises(UsageError, match=r"the questions: urgent, team, anger\)"):  # the questions' own order
        gold_pairs(qs, ["mood=m"])


def test_one_question_under_two_ids_is_fitted_once():
    """Two annotators' fields for one question under two ids: scored, fine; fitted or trained (a method
    bound to the question, not its id), refused naming both, before any model runs."""
    team = BODY["questions"]["team"]
    qs = parse_systemone({**BODY, "questions": {"team_a": team, "team_b": team, "urgent": {"type": "noul"}}}).questions
    golds = gold_pairs(qs, ["team_a=ann1", "team_b=ann2", "urgent"])
    with pytest.raises(UsageError, match=r"questions 'team_a' and 'team_b' are the same question .* --fit binds"):
        check_distinct(qs, golds, "--fit")
    check_distinct(qs, gold_pairs(qs, ["team_a=ann1", "urgent"]), "--fit")  # one of them: fine


def test_a_gold_value_two_options_share_apart_from_case_is_refused_naming_both():
    """Options 'billing' and 'Billing', gold "BILLING": which one is meant cannot be told; said, not
    read as "not an option"."""
    (q,) = parse_systemone(
        {"model": "m", "state": "s",
         "questions": {"t": {"type": "choice", "instructions": "?", "criteria": {"billing": None, "Billing": None}}}}
    ).questions  # fmt: skip
    assert gold_index(q, "Billing") == 1 and gold_index(q, "billing") == 0
    with pytest.raises(UsageError, match=r"line 3: gold \"BILLING\" matches the options 'billing' and 'Billing'"):
        gold_index(q, "BILLING", "line 3: ")


def test_a_gold_value_names_its_option():
    urgent, team, anger = parse_systemone(BODY).questions
    t, f = urgent.options.index("true"), urgent.options.index("false")
    assert [gold_index(urgent, v) for v in (True, "yes", " 1 ", False, "No", "maybe", None)] == [
        t,
        t,
        t,
        f,
        f,
        None,
        None,
    ]
    assert [gold_index(team, v) for v in ("billing", "technical", "sales")] == [0, 1, None]
    assert [gold_index(anger, v) for v in (2, "1", "Very angry", 3, "7", True)] == [2, 1, 2, None, None, None]


def test_a_typed_choice_keeps_true_and_the_string_true_apart():
    (choice,) = parse_openai({"model": "m", "input": "s", "questions": [
        {"type": "choice", "instructions": "x", "choices": [{"value": "true"}, {"value": True}, {"value": "b"}]}]}).questions  # fmt: skip
    assert gold_index(choice, "true") == 0 and gold_index(choice, True) == 1 and gold_index(choice, "b") == 2
    assert gold_index(choice, '"true"') == 0  # an output's key names the string
    assert gold_index(choice, "c") is None


def test_levels_named_by_numbers_are_read_by_name_never_by_position():
    """Stars "1" to "5": gold 1 (or "1", 1.0, "1.0" from a CSV) is the level NAMED 1, not level
    number 1 (the "2" star); a number that names no level is refused, naming the fix, not read as
    a position (where it would silently mean another level)."""
    body = {
        "model": "m",
        "state": "s",
        "questions": {"stars": {"type": "score", "criteria": ["1", "2", "3", "4", "5"]}},
    }
    (stars,) = parse_systemone(body).questions
    assert [gold_index(stars, v) for v in (1, "1", 1.0, " 1.0 ", 5, "5", 3)] == [0, 0, 0, 0, 4, 4, 2]
    for v in (0, "0", 6):
        with pytest.raises(UsageError, match=r"line 3: field 'stars': gold .* is no level .* give the level's name"):
            gold_index(stars, v, "line 3: field 'stars': ")
    assert gold_index(stars, "five") is None


def test_a_whole_number_written_as_a_float_and_text_set_apart_from_spaces_and_case():
    urgent, team, anger = parse_systemone(BODY).questions
    assert gold_index(urgent, 1.0) == urgent.options.index("true")
    assert gold_index(urgent, "0.0") == urgent.options.index("false")
    assert gold_index(urgent, 0.5) is None
    assert [gold_index(anger, v) for v in (2.0, "2.0", 1.5, " calm ", "VERY ANGRY")] == [2, 2, None, 0, 2]
    assert [gold_index(team, v) for v in (" Billing", "TECHNICAL ", "bill")] == [0, 1, None]


def test_a_missing_null_or_empty_gold_is_no_answer():
    from mlx_slm.text.decisions.gold import gold_given

    urgent, team, anger = parse_systemone(BODY).questions
    assert [gold_given(v) for v in (None, "", "  ", 0, False, "0")] == [False, False, False, True, True, True]
    assert [gold_index(q, v) for q in (urgent, team, anger) for v in ("", " ")] == [None] * 6


@pytest.mark.parametrize(
    "value",
    ["\ud800", b"x", float("nan"), float("inf"), -0.0, 1e300, "1e400", "nan", [], {}, {"a": 1}, [1], "\x00", "\u00a0"],
)
def test_an_odd_gold_value_names_no_option_or_is_refused_never_a_crash(value):
    """Whatever a reader hands over (a Parquet byte string, NaN, a lone surrogate, a nested value)."""
    stars = {"type": "score", "criteria": ["1", "2", "3"]}
    body = {**BODY, "questions": {**BODY["questions"], "stars": stars}}
    for q in parse_systemone(body).questions:
        try:
            assert gold_index(q, value) in (None, *range(len(q.options)))
        except UsageError as e:
            assert "is no level" in str(e)
