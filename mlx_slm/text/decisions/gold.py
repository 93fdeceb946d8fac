"""Gold answers of decision questions, as a labelled file gives them: which question each
`--gold-field KEY=FIELD` scores or trains, and which option a gold value names. What `eval
--decisions` scores and `train --decisions` trains read them here, one rule.

A noul's gold is true/false (a JSON boolean, or true/false/yes/no/1/0 as text); a choice's its
option (the name; an OpenAI choice's value, typed: `true` and `"true"` are different options,
the text matching where the value is unambiguous, and an output's key `"\"true\""` naming the
string); a score's its level (its number 0..n-1, or its description or label)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ...ground.errors import UsageError
from .questions import DecisionQuestion, option_text, text

_TRUE, _FALSE = ("true", "yes", "1"), ("false", "no", "0")


def gold_pairs(questions: Sequence[DecisionQuestion], pairs: Sequence[str]) -> dict[str, str]:
    """--gold-field KEY=FIELD (or KEY: the field of that name) once per question to score: {key: field}."""
    keys = {q.key for q in questions}
    golds: dict[str, str] = {}
    for pair in pairs:
        key, _, fld = pair.partition("=")
        if key not in keys:
            raise UsageError(
                f"--gold-field {pair}: {key!r} is not a question key (the questions: {', '.join(keys)}); give "
                "KEY=FIELD for each question to score"
            )
        if key in golds:
            raise UsageError(f"--gold-field {pair}: question {key!r} is given twice: one KEY=FIELD per question")
        golds[key] = fld or key
    return golds


def gold_index(q: DecisionQuestion, value: Any) -> int | None:
    """The option a gold value names (see the module docstring), or None when it names none."""
    if value is None:
        return None
    if q.type == "noul":
        if isinstance(value, bool):
            return list(q.options).index("true" if value else "false")
        word = str(value).strip().lower()
        side = "true" if word in _TRUE else "false" if word in _FALSE else None
        return None if side is None else list(q.options).index(side)
    if q.type == "score":
        if isinstance(value, int) and not isinstance(value, bool):
            return value if 0 <= value < len(q.options) else None
        if isinstance(value, str) and value.strip().isdigit():
            i = int(value.strip())
            return i if 0 <= i < len(q.options) else None
        names = [text(d) for d in q.descriptions] + list(q.levels)
        hits = [i % len(q.options) for i, n in enumerate(names) if n == value]
        return hits[0] if len(set(hits)) == 1 else None
    exact = [i for i, o in enumerate(q.options) if type(o) is type(value) and o == value]
    if exact:
        return exact[0]
    if isinstance(value, str) and value in q.answer_names():  # an output's key: '"true"' for the string
        return q.answer_names().index(value)
    loose = [
        i for i, o in enumerate(q.options) if option_text(o) == (value if isinstance(value, str) else json.dumps(value))
    ]
    return loose[0] if len(loose) == 1 else None
