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
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from ..classifier.decider import Decider
from ..classifier.task import Task, decision_temperatures
from ..engine import Engine
from ..files.output import (
    RecordError,
    check_run_files,
    input_changed,
    input_sha256,
    output_format,
    read_manifest,
    read_records,
    same_id,
)
from ..files.readers import ReadSpec, read_rows
from ..ground.errors import UsageError, UserError
from ..ground.safefs import atomic_write
from ..text.decision_metrics import apply_temperature, fit_temperature, format_question_report, question_report
from ..text.decision_metrics import brier as brier_score
from ..text.decisions import DecisionError, DecisionQuestion, DecisionRequest, option_text, text
from ..text.metrics import ece
from ..text.prompts import DEFAULT_LABELS, DEFAULT_SYSTEM, DEFAULT_TEMPLATE
from ..weights.convert import versions
from ..weights.registry import DEFAULT_MODEL, ModelRef
from .decide import STATE_FIELDS, decision_config, read_questions, state_problem
from .evaluate import plot, plot_paths
from .plan import Say

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
    predictions: str | None = None  # a decide output, scored without running the model
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
    if s.predictions and (s.save_task or s.task_file or s.dtype):
        raise UsageError("--predictions scores a decide output as written: drop --task, --save-task and --dtype")
    files = (
        ("INPUT", s.input),
        ("--questions", s.questions_file),
        ("--task", s.task_file),
        ("--predictions", s.predictions),
    )
    reads = [(f, p) for f, p in files if p]
    writes = [("--json", s.json_path), ("--save-task", s.save_task)]
    check_run_files(reads, writes)
    task = Task.load(s.task_file) if s.task_file else None
    model = task.model if task is not None and "model" not in s.given else s.model
    engine = None if s.predictions else Engine.load(ModelRef(model, s.dtype))
    config = decision_config(model, None if engine is None else engine.path)
    qs = read_questions(s.questions_file, task, config)
    golds = gold_pairs(qs.questions, s.gold_fields)
    if s.fit and qs.temperatures:
        qs = replace(qs, temperatures={})  # fitted on the raw probabilities, not on a task's
    elif qs.applied and engine is not None:
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
    read = ReadSpec(s.fmt, states[0], s.id_field, s.state_column, s.id_column, gold=fields, states=states)
    rows = list(read_rows(s.input, read))
    rows = [r if r.error is not None else replace(r, error=state_problem(r)) for r in rows]
    if s.predictions:  # a decide output: its answers read back, row i of it input row i
        got = read_decisions(s.predictions, rows, qs.questions, s.input)
        rows = [r if p is None or isinstance(p, tuple) else replace(r, error=p) for r, p in zip(rows, got)]
    ok = [r for r in rows if r.error is None]
    if not ok:
        first = rows[0].error if rows else "the input is empty"
        raise UserError(f"{s.input}: no row has a state to ask; first problem: {first}")
    probs: list[tuple[np.ndarray, ...] | str] = []
    if s.predictions:
        probs = [p for r, p in zip(rows, got) if r.error is None]
    else:
        decider = Decider(
            engine, config, state_cache=0, calibration=qs.temperatures or None, calibration_questions=qs.own
        )
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
        atomic_write(
            s.json_path, json.dumps({"questions": {k: v["report"] for k, v in out.items()}}, indent=2) + "\n", "--json"
        )
    if s.save_task:
        temps = {k: v["report"]["temperature"]["value"] for k, v in out.items() if "temperature" in v["report"]}
        fit = {
            k: {x: v["report"]["temperature"][x] for x in ("n", "nll_raw", "nll_fitted", "ece_raw", "ece_fitted")}
            for k, v in out.items()
            if "temperature" in v["report"]
        }
        Task(
            model=model,
            labels=tuple(DEFAULT_LABELS),
            system=DEFAULT_SYSTEM,
            template=DEFAULT_TEMPLATE,
            weights_sha256=engine.weights_sha256 if engine else None,
            versions=versions(),
            decisions={"questions": qs.raw, "temperatures": temps, "fit": fit},
        ).save(s.save_task)
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
    got, gold, left = (
        [],
        [],
        [
            f"line {r.line}: {r.error}" if not r.error.startswith("line ") else r.error
            for r in rows
            if r.error is not None
        ],
    )
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
        raise UserError(
            f"question {q.key!r}: no row has both an answer and a gold option in field {fld!r}; "
            f"first problem: {left[0] if left else 'none'}"
        )
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
        rep["temperature"] = {
            "value": t,
            **info,
            "ece_raw": ece(top_raw, right),
            "ece_fitted": ece(top_fit, right),
            "brier_raw": rep["brier"],
            "brier_fitted": brier_score(hot, g, q.type == "noul"),
        }
    return {"report": rep}


def read_decisions(path: str, rows: list[Any], questions: Sequence[DecisionQuestion], input_path: str) -> list[Any]:
    """A decide output read back row by row: each row's probabilities per question (a tuple, in
    question order), its error text, or None for an input row that had none to read. Its rows
    must be the input's (count and ids, and the content its manifest recorded)."""
    where = f"--predictions {path}"
    m = read_manifest(path)
    if m is not None:
        st = m["settings"]
        if st.get("form") != "decisions":
            raise UserError(f"{where} is not a decide output (its manifest says form {st.get('form')!r})")
        if not m.get("complete"):
            raise UserError(f"{where} is unfinished: finish it with mlx-slm decide ... --resume")
        sha, _ = input_sha256(input_path)
        changed = input_changed(input_path, st, (sha, os.stat(input_path).st_size if sha else None))
        if changed and sha is not None:
            raise UserError(f"{where} is not the output for this input: {changed}")
    fmt = output_format(path)
    try:
        recs = [r for r in read_records(path, fmt, lenient=True) if r.row > 0 or fmt == "jsonl"]
    except RecordError as e:
        raise UserError(f"{where}: line {e.line} cannot be read ({e.why}): give the output of mlx-slm decide") from None
    if len(recs) != len(rows):
        raise UserError(f"{where} has {len(recs)} rows but the input has {len(rows)}: they must be row for row")
    out: list[Any] = []
    for i, (rec, row) in enumerate(zip(recs, rows)):
        f = rec.fields if rec.problem is None else {}
        if rec.problem is not None or not same_id(f.get("id"), row.id, fmt):
            raise UserError(
                f"{where}: row {i + 1} is not input line {row.line}'s answers (id {f.get('id')!r}, "
                f"expected {row.id!r}): give the decide output of this input"
            )
        if f.get("error"):
            out.append(str(f["error"]))
            continue
        ans = f.get("answers")
        try:
            ans = json.loads(ans) if isinstance(ans, str) else ans
            out.append(tuple(_probabilities(q, ans, k) for k, q in enumerate(questions)))
        except (KeyError, IndexError, TypeError, ValueError) as e:
            raise UserError(
                f"{where}: row {i + 1} has no answer to every question ({type(e).__name__}: {e}): "
                "give the decide output of these questions"
            ) from None
    return out


def _probabilities(q: DecisionQuestion, answers: Any, k: int) -> np.ndarray:
    """A question's probabilities in its option order, from its answer in either shape."""
    a = answers[k] if isinstance(answers, list) else answers[q.key]
    if isinstance(answers, list):
        if a["type"] == "predicate":
            p = float(a["probability"])
            return np.array([p if o == "true" else 1 - p for o in q.options])
        return np.array([float(x["probability"]) for x in a["probabilities"]])
    if a["type"] == "noul":
        p = float(a["noul"])
        return np.array([p if o == "true" else 1 - p for o in q.options])
    names = [option_text(o) for o in q.options] if q.type == "choice" else [str(i) for i in range(len(q.options))]
    return np.array([float(a["probabilities"][n]) for n in names])
