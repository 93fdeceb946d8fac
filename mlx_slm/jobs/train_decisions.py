"""`train DATA --decisions Q.json --gold-field KEY=FIELD`: a learned head per labelled decision
question, trained on the question's own prompt, saved in a task that `decide --task` and
`serve --task` answer that question with (through both routes, in the same pass as the
untrained questions: the head reads the branch's hidden states where the letters would be
read).

Each question's head is `train`'s (`heads.fit`): the hidden states after the candidate layers at
the question's answer position (taken by the very branch pass that answers it, `Decider.
features`), a linear head on them, its layers and estimator chosen by stratified
cross-validation (`--layers`, `--layer`, `--folds`, `--seed`). DATA holds a state per row
(`state`, else `text`) and a gold answer per trained question (`text.decisions.gold`). A row
without a question's gold field is left out of that question's head (said); a gold value that
names no option is an error naming its line and field; every option needs `min_per_label(folds)`
rows. The task records the model's weights sha256: another model refuses it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..classifier.decision_plan import DecisionPlan
from ..classifier.task import Task
from ..files.readers import ReadSpec, read_rows
from ..ground.errors import UserError
from ..text.decisions.gold import gold_index, gold_pairs
from ..text.decisions.methods import Method
from ..text.decisions.questions import DecisionQuestion
from ..text.heads import Head, format_table
from ..text.prompts import DEFAULT_LABELS, DEFAULT_SYSTEM, DEFAULT_TEMPLATE
from ..weights.convert import versions
from .decide import STATE_FIELDS, state_problem
from .labelled import check_folds
from .train import HeadOptions, Trace, TrainError, _candidate_parts, _fit_timed, _gold_indices


@dataclass(frozen=True)
class DecisionTrainRun:
    """One `train --decisions` run: DATA, the decision plan (model, questions), the questions to
    train and their gold fields (`golds`: KEY=FIELD pairs), how each head is chosen, how DATA is
    read (`read`: format, state and id fields and columns) and where the task goes."""

    data: str
    plan: DecisionPlan
    golds: tuple[str, ...]
    save_task: str
    head: HeadOptions = HeadOptions()
    read: ReadSpec | None = None


@dataclass
class _Stats:
    """The feature pass's figures, as `train._fit_timed` reads them."""

    seconds: float
    items: int


def _states(run: DecisionTrainRun, fields: Sequence[str]) -> list[Any]:
    """DATA's rows with their states checked (a row that cannot be asked is an error naming it)."""
    spec = run.read or ReadSpec(None, STATE_FIELDS[0], "id", "text", "id", states=STATE_FIELDS)
    rows = [
        r if r.error is not None else replace(r, error=state_problem(r))
        for r in read_rows(run.data, replace(spec, gold=tuple(fields)))
    ]
    bad = next((r for r in rows if r.error is not None), None)
    if bad is not None:
        raise TrainError(f"{run.data}: {bad.error}: fix or drop the row (a head is trained on every row)")
    if not rows:
        raise TrainError(f"{run.data} has no rows: give states with their gold answers")
    return rows


def _labelled(q: DecisionQuestion, fld: str, rows: list[Any], data: str) -> tuple[list[int], list[str], list[int]]:
    """The rows that train `q` (those with its gold field), each one's option as its answer name,
    and their lines; a gold value that names no option is an error naming the line and field."""
    keep, gold, lines = [], [], []
    names = q.answer_names()
    for i, r in enumerate(rows):
        value = (r.gold or {}).get(fld)
        if value is None:
            continue
        g = gold_index(q, value)
        if g is None:
            raise TrainError(
                f"{data}: line {r.line}: field {fld!r} is {value!r}, not an option of question {q.key!r} "
                f"({', '.join(names[:8])}{' ...' if len(names) > 8 else ''}): fix it, or drop the row"
            )
        keep.append(i)
        gold.append(names[g])
        lines.append(r.line)
    return keep, gold, lines


def train_question(
    decider: Any, q: DecisionQuestion, states: Sequence[Any], gold: Sequence[str], head: HeadOptions, trace: Trace
) -> Head:
    """`q`'s head: its options' classes checked (`min_per_label(folds)` rows each), the hidden
    states at its answer position for every state, then `heads.fit` by cross-validation."""
    labels, y = _gold_indices(list(gold), q.answer_names(), head.folds, trace)
    n = len(decider.engine.model.layers)
    cands, layers = _candidate_parts(n, head.layers, head.layer, ("last",))
    trace.note(
        f"{q.key!r}: features of {len(states)} states at its answer position, layers {', '.join(map(str, layers))}"
    )
    t0 = time.perf_counter()
    got = decider.features(states, q, layers)
    for i, f in enumerate(got):
        if f is None:
            raise TrainError(
                f"{trace.where(i)}: the state and question {q.key!r} are over the model's context: shorten it"
            )
    feats = {"last": np.stack(got)}  # type: ignore[arg-type]
    st = _Stats(time.perf_counter() - t0, len(states))
    return _fit_timed(feats, (layers, y, labels), cands, st, head, trace.note)


def run_train_decisions(run: DecisionTrainRun, say: Callable[[str], None] = lambda m: None) -> tuple[Task, str]:
    """The run: the questions and their gold fields checked, DATA read (before the model loads),
    a head per question, the task saved. Returns the task and each head's table as text."""
    check_folds(run.head.folds)
    golds = gold_pairs(run.plan.questions, run.golds)
    if not golds:
        raise UserError("train --decisions: give --gold-field KEY=FIELD for each question to train")
    rows = _states(run, tuple(dict.fromkeys(golds.values())))
    say(f"mlx-slm: loading {run.plan.model.name}")
    engine = run.plan.engine()
    plan = run.plan.loaded(engine)
    decider = plan.decider(engine, state_cache=0)
    methods, tables = [], []
    for q in plan.questions:
        if q.key not in golds:
            continue
        keep, gold, lines = _labelled(q, golds[q.key], rows, run.data)
        if len(keep) < len(rows):
            say(
                f"mlx-slm: {q.key!r}: {len(rows) - len(keep)} row(s) without field {golds[q.key]!r} left out of its head"
            )
        trace = Trace(source=run.data, lines=lines, log=lambda m: say(f"mlx-slm: {m}"))
        head = train_question(decider, q, [rows[i].text for i in keep], gold, run.head, trace)
        head.info.update({"gold_field": golds[q.key], "question": q.key})
        chosen = head.info.get("chosen", {})
        report = {"cv_accuracy": chosen.get("accuracy"), "cv_macro_f1": chosen.get("macro_f1"), "n": len(keep)}
        methods.append(Method(head=head, key=q.key, digest=q.digest, report=report))
        tables.append(f"== {q.key}\n{format_table(head)}")
    task = Task(
        model=plan.model.name,
        labels=tuple(DEFAULT_LABELS),
        system=DEFAULT_SYSTEM,
        template=DEFAULT_TEMPLATE,
        weights_sha256=engine.weights_sha256,
        versions=versions(),
        decisions={"questions": plan.raw_questions, "methods": [m.to_dict() for m in methods]},
    )
    task.save(run.save_task)
    return task, "\n\n".join(tables)
