"""Gold answers of decision questions, as a labelled file gives them: which question each
`--gold-field KEY=FIELD` scores or trains, and which option a gold value names. What `eval
--decisions` scores and `train --decisions` trains read them here, one rule.

A noul's gold is true/false (a JSON boolean, or true/false/yes/no/1/0 as text); a choice's its
option (the name; an OpenAI choice's value, typed: `true` and `"true"` are different options,
the text matching where the value is unambiguous, and an output's key `"\"true\""` naming the
string; its text set apart from spaces and case where that names one option); a score's its
level (its description or label, then its number 0..n-1; levels named by numbers are read by
name). A whole number given as 1.0 or "1.0" (a CSV export) is the number."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from ...ground.errors import UsageError
from .questions import DecisionQuestion, option_text, text

_TRUE, _FALSE = ("true", "yes", "1"), ("false", "no", "0")


def gold_pairs(questions: Sequence[DecisionQuestion], pairs: Sequence[str]) -> dict[str, str]:
    """--gold-field KEY=FIELD (or KEY: the field of that name) once per question to score: {key: field}."""
    keys = list(dict.fromkeys(q.key for q in questions))  # in the questions' own order (said in a message)
    golds: dict[str, str] = {}
    for pair in pairs:
        key, eq, fld = pair.partition("=")
        if key not in keys:
            raise UsageError(
                f"--gold-field {pair}: {key!r} is not a question key (the questions: {', '.join(keys)}); give "
                "KEY=FIELD for each question to score"
            )
        if eq and not fld.strip():
            raise UsageError(f"--gold-field {pair}: the FIELD after '=' is empty: give KEY=FIELD, or KEY alone")
        if key in golds:
            raise UsageError(f"--gold-field {pair}: question {key!r} is given twice: one KEY=FIELD per question")
        golds[key] = fld or key
    return golds


def check_distinct(questions: Sequence[DecisionQuestion], golds: Mapping[str, str], what: str) -> None:
    """The questions a run fits or trains (`golds`' keys) are distinct questions: a saved method is
    bound to the question itself (its digest), not its id, so two ids of one question fitted apart
    (two annotators' fields, say) would leave one method answering both."""
    seen: dict[str, str] = {}
    for q in questions:
        if q.key not in golds:
            continue
        if q.digest in seen:
            raise UsageError(
                f"--gold-field {q.key}: questions {seen[q.digest]!r} and {q.key!r} are the same question (the same "
                f"wording and options), and {what} binds its method to the question, not its id: give one of them "
                "a --gold-field (or score them both without saving a task)"
            )
        seen[q.digest] = q.key


def gold_given(value: Any) -> bool:
    """A row gives a gold value: not a missing field, a null, or an empty CSV cell (such a row is
    left out of what its question scores or trains, never read as an answer)."""
    return value is not None and not (isinstance(value, str) and not value.strip())


def check_gold_fields(golds: Mapping[str, str], values: Sequence[Mapping[str, Any] | None], source: str) -> None:
    """Each --gold-field's field is given by some row (`values`: each readable row's gold fields):
    a field in no row is a typo, said before the model runs, not as "too few examples" after."""
    for key, fld in golds.items():
        if not any(gold_given((v or {}).get(fld)) for v in values):
            raise UsageError(
                f"--gold-field {key}={fld}: no row of {source} has a field {fld!r} (or every one is empty): give "
                f"the field that holds question {key!r}'s gold answers"
            )


def _number(value: Any) -> int | None:
    """A JSON number or a text of digits that is a whole number (1, 1.0, "1", " 1.0 "), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        try:
            value = float(value.strip()) if value.strip() else None
        except ValueError:
            return None
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value if isinstance(value, int) else None


def _named(names: Sequence[str], value: str) -> list[int]:
    """The positions whose name is `value`: exactly, else once spaces and case are set aside."""
    hits = [i for i, n in enumerate(names) if n == value]
    return hits or [i for i, n in enumerate(names) if n.strip().casefold() == value.strip().casefold()]


def gold_index(q: DecisionQuestion, value: Any, where: str = "") -> int | None:
    """The option a gold value names (see the module docstring), or None when it names none. A
    score whose levels are named by numbers reads a number as a level's NAME (stars "1" to "5":
    gold 1 is the level named "1", never level number 1); a number that is no level's name is
    then refused (`where`: the file, line and field a message names), not read as a position."""
    if not gold_given(value):
        return None
    if q.type == "noul":
        if isinstance(value, bool):
            return list(q.options).index("true" if value else "false")
        n = _number(value)
        word = str(n if n is not None else value).strip().lower()
        side = "true" if word in _TRUE else "false" if word in _FALSE else None
        return None if side is None else list(q.options).index(side)
    if q.type == "score":
        k = len(q.options)
        levels = [[text(d) for d in q.descriptions], list(q.levels)]
        numbered = [ns for ns in levels if ns and all(_number(n) is not None for n in ns)]
        n = _number(value)
        if numbered and n is not None:  # the levels' names are numbers: a number is a name
            hits = sorted({i for ns in numbered for i, x in enumerate(ns) if _number(x) == n})
            if len(hits) == 1:
                return hits[0]
            raise UsageError(
                f"{where}gold {json.dumps(value, default=str)} is no level of question {q.key!r}, whose levels are named by "
                f"numbers ({', '.join(numbered[0])}): a number is read as a level's name, not its position; give "
                "the level's name"
            )
        if isinstance(value, str):
            hits = sorted({i % k for i in _named([*levels[0], *levels[1]], value)})
            if len(hits) == 1:
                return hits[0]
        return n if n is not None and 0 <= n < k else None
    exact = [i for i, o in enumerate(q.options) if type(o) is type(value) and o == value]
    if exact:
        return exact[0]
    if isinstance(value, str) and value in q.answer_names():  # an output's key: '"true"' for the string
        return q.answer_names().index(value)
    want = value if isinstance(value, str) else json.dumps(value, default=str)
    loose = [i for i, o in enumerate(q.options) if option_text(o) == want]
    if not loose and isinstance(value, str):
        loose = _named([option_text(o) for o in q.options], value)
    if len(loose) > 1:  # options apart only in case or spaces: which one is meant cannot be told
        both = " and ".join(repr(option_text(q.options[i])) for i in loose[:3])
        raise UsageError(
            f"{where}gold {gold_text(value)} matches the options {both} of question {q.key!r} apart from case or "
            "spaces: give one of them exactly"
        )
    return loose[0] if loose else None


def gold_text(value: Any) -> str:
    """A gold value as the user wrote it in JSON (true, null, NaN, ["x"]), not as Python shows it."""
    return json.dumps(value, ensure_ascii=False, default=str)[:200]
