"""`eval GOLD --decisions Q.json`: how right and how calibrated each decision question is on
labelled states, and (`--fit`) a temperature per question learned from them.

GOLD holds a state per row (`state`, else `text`, as `decide` reads it) and a gold answer
per question to score (`--gold-field KEY=FIELD`): a noul's true/false (a JSON boolean, or
true/false/yes/no/1/0 as text), a choice's option (its name; an OpenAI choice's value, typed:
`true` and `"true"` are different options, text matching where the value is unambiguous),
a score's level (its number 0..n-1, or its description). Every state is asked every question
in one pass (a `Decider`, the raw probabilities: a task's temperatures are applied only to
score that task, `--task T` without `--fit`); per question, `text.decision_metrics` gives
accuracy, the Brier score, ECE, the log-loss, and `evaluate.plot` a reliability diagram.

`--fit` learns each question's temperature by the gold's NLL (`fit_temperature`, on the raw
probabilities) and reports its figures before and after, measured on the same states (so
optimistic: evaluate the saved task on held-out states, `eval HELDOUT --decisions Q --task
T`); `--save-task T` saves the questions, the temperatures and the model's weights sha256 in
a task that `decide --task` and `serve --task` apply. Raw answers stay the default.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from ..classifier.decider import Decider
from ..classifier.task import Task, decision_temperatures
from ..engine import Engine
from ..files.output import check_run_files
from ..files.readers import read_rows
from ..ground.errors import UsageError, UserError
from ..ground.safefs import atomic_write
from ..text.decision_metrics import apply_temperature, fit_temperature, format_question_report, question_report
from ..text.decision_metrics import brier as brier_score
from ..text.decisions import DecisionError, DecisionQuestion, DecisionRequest, option_text, text
from ..text.metrics import ece
from ..text.prompts import DEFAULT_LABELS, DEFAULT_SYSTEM, DEFAULT_TEMPLATE
from ..weights.convert import versions
from ..weights.registry import DEFAULT_MODEL
from .decide import STATE_FIELDS, decision_config, read_questions, state_problem
from .evaluate import plot, plot_paths
from .setup import Say

_TRUE, _FALSE = ("true", "yes", "1"), ("false", "no", "0")


@dataclass
class DecisionEvalSettings:
    """One `eval --decisions` run (`given`: the parameter names set on the command line)."""

    input: str
    questions_file: str | None
    gold_fields: tuple[str, ...]
    model: str = DEFAULT_MODEL
    task_file: str | None = None
    fit: bool = False
    save_task: str | None = None
    json_path: str | None = None
    plots: str | None = None
    fmt: str | None = None
    state_field: str | None = None
    id_field: str = "id"
    state_column: str = "text"
    id_column: str = "id"
    dtype: str | None = None
    batch: int = 32
    quiet: bool = False
    given: frozenset[str] = field(default_factory=frozenset)


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
    loose = [
        i for i, o in enumerate(q.options) if option_text(o) == (value if isinstance(value, str) else json.dumps(value))
    ]
    return loose[0] if len(loose) == 1 else None


def _folder(i: int, key: str) -> str:
    """A question's plot folder: its place and its key, made safe as a file name."""
    return f"{i + 1:02d}-" + (re.sub(r"[^A-Za-z0-9_.-]", "_", key)[:48] or "question")


def evaluate_decisions(s: DecisionEvalSettings, say: Say) -> dict[str, Any]:
    """Run the eval (see the module docstring); the figures per question, also printed by `say`'s caller."""
    if s.save_task and not s.fit:
        raise UsageError("--save-task with --decisions saves the fitted temperatures: add --fit")
    reads = [(f, p) for f, p in (("INPUT", s.input), ("--questions", s.questions_file), ("--task", s.task_file)) if p]
    writes = [("--json", s.json_path), ("--save-task", s.save_task)]
    check_run_files(reads, writes)
    task = Task.load(s.task_file) if s.task_file else None
    model = task.model if task is not None and "model" not in s.given else s.model
    engine = Engine.load(model, s.dtype)
    config = decision_config(model, engine.path)
    qs = read_questions(s.questions_file, task, config)
    golds = gold_pairs(qs.questions, s.gold_fields)
    if s.fit and qs.temperatures:
        qs = replace(qs, temperatures={})  # fitted on the raw probabilities, not on a task's
    elif qs.temperatures:
        decision_temperatures(task, engine.weights_sha256)
    if s.plots:
        for i, q in enumerate(qs.questions):
            if q.key in golds:  # each question's folder made now: an unwritable place fails before the model runs
                where = Path(s.plots) / _folder(i, q.key)
                try:
                    where.mkdir(parents=True, exist_ok=True)
                except OSError as e:
                    raise UserError(f"--plots {s.plots}: cannot create {where} ({e.strerror or e})") from None
                check_run_files(reads, [("--plots", str(p)) for p in plot_paths(where)])
    states = (s.state_field,) if s.state_field else STATE_FIELDS
    fields = tuple(dict.fromkeys(golds.values()))
    rows = list(read_rows(s.input, s.fmt, states[0], s.id_field, s.state_column, s.id_column, gold=fields,
                          states=states))  # fmt: skip
    rows = [r if r.error is not None else replace(r, error=state_problem(r)) for r in rows]
    ok = [r for r in rows if r.error is None]
    if not ok:
        first = rows[0].error if rows else "the input is empty"
        raise UserError(f"{s.input}: no row has a state to ask; first problem: {first}")
    decider = Decider(engine, config, state_cache=0, calibration=qs.temperatures or None)
    probs: list[tuple[np.ndarray, ...] | str] = []
    for k in range(0, len(ok), s.batch):
        probs += _decide(decider, [r.text for r in ok[k : k + s.batch]], qs.questions)
    out: dict[str, Any] = {}
    index = {q.key: i for i, q in enumerate(qs.questions)}
    for key, fld in golds.items():
        q = qs.questions[index[key]]
        out[key] = _question(q, fld, ok, probs, index[key], s.fit, rows)
        rep = out[key]["report"]
        left = f"{rep['left_out']} row(s) left out: " + "; ".join(rep["left_out_examples"]) if rep["left_out"] else ""
        say(format_question_report(key, q.type, fld, rep) + left)
        if s.plots:
            for p in plot(out[key]["report"], Path(s.plots) / _folder(index[key], key)):
                say(f"mlx-slm: wrote {p}")
    if s.json_path:
        atomic_write(s.json_path, json.dumps({"questions": {k: v["report"] for k, v in out.items()}}, indent=2) + "\n",
                     "--json")  # fmt: skip
    if s.save_task:
        temps = {k: v["report"]["temperature"]["value"] for k, v in out.items() if "temperature" in v["report"]}
        fit = {k: {x: v["report"]["temperature"][x] for x in ("n", "nll_raw", "nll_fitted", "ece_raw", "ece_fitted")}
               for k, v in out.items() if "temperature" in v["report"]}  # fmt: skip
        Task(model=model, labels=tuple(DEFAULT_LABELS), system=DEFAULT_SYSTEM, template=DEFAULT_TEMPLATE,
             weights_sha256=engine.weights_sha256, versions=versions(),
             decisions={"questions": qs.raw, "temperatures": temps, "fit": fit}).save(s.save_task)  # fmt: skip
        say(f"mlx-slm: task saved to {s.save_task} (a temperature for {len(temps)} question(s))")
    return {k: v["report"] for k, v in out.items()}


def _decide(decider: Any, states: list[Any], questions: tuple[DecisionQuestion, ...]) -> list[Any]:
    """Each state's probabilities per question, or why it has none (a state over the context)."""
    try:
        return [r.probabilities for r in decider.decide([DecisionRequest(st, questions) for st in states])]
    except DecisionError as e:
        if len(states) == 1:
            return [str(getattr(e, "msg", e))]
        return [p for st in states for p in _decide(decider, [st], questions)]


def _question(
    q: DecisionQuestion, fld: str, ok: list[Any], probs: list[Any], i: int, fit: bool, rows: list[Any]
) -> dict[str, Any]:
    """One question's report (and fitted temperature), from the rows with an answer and a gold option."""
    got, gold, left = [], [], [f"line {r.line}: {r.error}" if not r.error.startswith("line ") else r.error
                                for r in rows if r.error is not None]  # fmt: skip
    for r, p in zip(ok, probs):
        g = gold_index(q, (r.gold or {}).get(fld))
        if isinstance(p, str):
            left.append(f"line {r.line}: {p}")
        elif g is None:
            left.append(f"line {r.line}: field {fld!r} is {(r.gold or {}).get(fld)!r}, not an option of {q.key!r}")
        else:
            got.append(np.asarray(p[i], dtype=np.float64))
            gold.append(g)
    if not got:
        raise UserError(f"question {q.key!r}: no row has both an answer and a gold option in field {fld!r}; "
                        f"first problem: {left[0] if left else 'none'}")  # fmt: skip
    names = [option_text(o) for o in q.options]
    pr, g = np.stack(got), np.asarray(gold, dtype=np.int64)
    rep = question_report(pr, g, names, binary=q.type == "noul")
    rep["left_out"] = len(left)
    rep["left_out_examples"] = left[:5]
    if fit:
        t, info = fit_temperature(pr, g)
        hot = apply_temperature(pr, t)
        top_raw, top_fit = pr.max(1), hot.max(1)
        right = pr.argmax(1) == g  # a temperature keeps every argmax
        rep["temperature"] = {"value": t, **info, "ece_raw": ece(top_raw, right), "ece_fitted": ece(top_fit, right),
                              "brier_raw": rep["brier"], "brier_fitted": brier_score(hot, g, q.type == "noul")}  # fmt: skip
    return {"report": rep}
