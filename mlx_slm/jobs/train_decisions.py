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

`--head-prompt question`, `--finetune lora` or `--finetune auto` train a classifier per question
instead, with classify's own machinery (`train.run_train`'s head, last or mean pooling;
`finetune.run_finetune`; `choose.run_choose`): the question as its system message (its options
listed by name, `methods.tuned_prompt`), each state as its text, the options' names as its labels.
Each classifier is a task file beside the decision task (`<task>.<question>.json`, with its head or
adapters); the decision task's method names it, and `decide`, `serve` and Ray answer the question
with it in the same call as the other questions (its own pass: the question is its cached prompt
head, so each state costs its own tokens, where a head on the decision prompt costs the question's:
with many options the question's own prompt is far cheaper, see docs/decisions.md).

"None of these" (`--none-label OPTION [--none-threshold P|auto --none-data FILE]`, one question):
OPTION is one of the choice's options, learned from its rows as any option; with a threshold the
question also answers it when no other option reaches P (`methods.NoneOf`). `auto` chooses P on
held-out labelled states as classify's does (`text.out_of_scope.choose_threshold`: the largest
that costs in-scope accuracy at most --none-target), answered by the saved task as served.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from ..classifier.decision_plan import DecisionPlan
from ..classifier.plan import Plan
from ..classifier.task import Task, decisions_section
from ..files.readers import ReadSpec
from ..ground.errors import UserError
from ..ground.safefs import atomic_write
from ..text.decisions.errors import DecisionError
from ..text.decisions.gold import check_distinct, check_gold_fields, gold_given, gold_index, gold_pairs, gold_text
from ..text.decisions.methods import Method, NoneOf, threshold_text, tuned_prompt
from ..text.decisions.questions import DecisionQuestion, DecisionRequest, text
from ..text.heads import Head, format_table, min_per_label
from ..text.out_of_scope import choose_threshold
from ..text.prompts import DEFAULT_LABELS, DEFAULT_SYSTEM, DEFAULT_TEMPLATE
from ..weights.convert import sha256_file, versions
from .choose import run_choose
from .decide import STATE_FIELDS, state_problem, state_rows
from .finetune import history_table, run_finetune
from .labelled import check_folds
from .out_of_scope import NoneRule
from .plan import DecisionOptions, resolve_decisions
from .train import HeadOptions, Trace, TrainError, TrainRun, _candidate_parts, _fit_timed, _gold_indices, run_train


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
    # a classifier of the question's own: ("head", None, False) or ("lora" | "auto", FinetuneSettings, fused)
    tuning: tuple[str, Any, bool] | None = None
    none: NoneRule = NoneRule()  # "none of these" for the one question trained (its option: `label`)
    column_given: bool = False  # `read`'s CSV column was named (else "state", or "text" where the header lacks it)


@dataclass
class _Stats:
    """The feature pass's figures, as `train._fit_timed` reads them."""

    seconds: float
    items: int


def _states(run: DecisionTrainRun, fields: Sequence[str], path: str | None = None) -> list[Any]:
    """DATA's rows (or `path`'s, read as DATA is) with their states checked (a row that cannot be
    asked is an error naming it)."""
    path = path or run.data
    spec = run.read or ReadSpec(None, STATE_FIELDS[0], "id", "state", "id", states=STATE_FIELDS)
    got, _ = state_rows(path, replace(spec, gold=tuple(fields)), run.column_given)
    rows = [r if r.error is not None else replace(r, error=state_problem(r)) for r in got]
    bad = next((r for r in rows if r.error is not None), None)
    if bad is not None:
        fix = "" if "drop the row" in bad.error else ": fix or drop the row"
        raise TrainError(f"{path}: {bad.error}{fix} (a head is trained on every row)")
    if not rows:
        raise TrainError(f"{path} has no rows: give states with their gold answers")
    return rows


# a question's head learns every one of its options (a label cannot be left out of it, as of --labels)
_OPTIONS_FIX = "or take the options too few states are labelled with out of the question (Q.json)"


def _heading(q: DecisionQuestion) -> str:
    """A question's table's heading; a score's levels named beside their positions, which its table shows."""
    legend = q.level_legend()
    return f"== {q.key}" + (f"\n({legend})" if legend else "")


def _options_said(q: DecisionQuestion) -> str:
    """A question's options as a message lists them: a score's levels by name where they have names."""
    names = q.level_names() or q.answer_names()
    return f"{', '.join(names[:8])}{' ...' if len(names) > 8 else ''}"


def _options_fix(q: DecisionQuestion) -> str:
    """How a question with too few states of an option can be fixed besides labelling more: a choice's
    or a score's option taken out of Q.json; a noul's two answers are both learned (none to take out)."""
    if q.type == "noul":
        return "as a yes/no question's head learns both of its answers"
    legend = q.level_legend()
    return _OPTIONS_FIX + (f" ({legend})" if legend else "")


def _labelled(q: DecisionQuestion, fld: str, rows: list[Any], data: str) -> tuple[list[int], list[str], list[int]]:
    """The rows that train `q` (those with its gold field), each one's option as its answer name,
    and their lines; a gold value that names no option is an error naming the line and field."""
    keep, gold, lines = [], [], []
    names = q.answer_names()
    for i, r in enumerate(rows):
        value = (r.gold or {}).get(fld)
        if not gold_given(value):
            continue
        g = gold_index(q, value, f"{data}: line {r.line}: field {fld!r}: ")
        if g is None:
            raise TrainError(
                f"{data}: line {r.line}: field {fld!r} is {gold_text(value)}, not an option of question {q.key!r} "
                f"({_options_said(q)}): fix it, or drop the row"
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
    labels, y = _gold_indices(list(gold), q.answer_names(), head.folds, trace, _options_fix(q))
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
        if not np.all(np.isfinite(f)):  # a head fitted on NaN answers NaN (or one class) for everything
            raise TrainError(
                f"{trace.where(i)}: question {q.key!r}: the model's hidden states are not finite (NaN or "
                "infinity): its weights overflow or hold non-finite values; run it in float32 (--dtype float32), "
                "or fix the model"
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
    check_distinct(run.plan.questions, golds, "a trained task")
    rows = _states(run, tuple(dict.fromkeys(golds.values())))
    held = _none_held_out(run, golds)  # "none of these": checked, and its held-out states read, before any work
    check_gold_fields(golds, [r.gold for r in rows], run.data)  # a typo: said as one, before the model loads
    labelled = {q.key: _labelled(q, golds[q.key], rows, run.data) for q in run.plan.questions if q.key in golds}
    own = own_files(run.save_task, [q.key for q in run.plan.questions if q.key in golds]) if run.tuning else {}
    with _kept_unless_saved(list(own.values())):
        return _train_all(run, golds, rows, held, labelled, say)


def _train_all(
    run: DecisionTrainRun, golds: dict[str, str], rows: list[Any], held: Any, labelled: dict[str, Any], say: Any
) -> tuple[Task, str]:
    """The rest of `run_train_decisions`: a cross-validated head's examples counted per option (before
    the model loads), the model loaded, each labelled question trained, the task saved."""
    if run.tuning is None or OWN[run.tuning[0]].folds_every_row:  # every head's examples counted before the model loads
        for q in run.plan.questions:
            if q.key in golds:
                _, gold, lines = labelled[q.key]
                fix = _options_fix(q)
                none = run.none.label if run.none.asked else None
                if none is not None and gold.count(none) < min_per_label(run.head.folds):
                    # the none option is learned from its states, as any option: not one to take out
                    fix = f"{none!r} among them (out-of-scope states, for --none-label), {fix}"
                left = len(rows) - len(lines)  # rows without a gold answer: not counted, and said
                out = f"; {left} row(s) without it left out" if left else ""
                where = f"{run.data}: question {q.key!r} (field {golds[q.key]!r}{out})"
                _gold_indices(list(gold), q.answer_names(), run.head.folds, Trace(source=where, lines=lines), fix)
    say(f"mlx-slm: loading {run.plan.model.name}")
    engine = run.plan.engine()
    plan = run.plan.loaded(engine)
    decider = plan.decider(engine, state_cache=0)
    methods, tables = [], []
    for q in plan.questions:
        if q.key not in golds:
            continue
        keep, gold, lines = labelled[q.key]
        if len(keep) < len(rows):
            say(
                f"mlx-slm: {q.key!r}: {len(rows) - len(keep)} row(s) without field {golds[q.key]!r} left out of its head"
            )
        states = [rows[i].text for i in keep]
        if run.tuning is not None:
            method, table = tune_question(run, plan, q, (states, gold, lines), say, engine)
            methods.append(method)
            tables.append(f"{_heading(q)}\n{table}")
            continue
        trace = Trace(source=run.data, lines=lines, log=lambda m: say(f"mlx-slm: {m}"))
        head = train_question(decider, q, states, gold, run.head, trace)
        head.info.update({"gold_field": golds[q.key], "question": q.key})
        chosen = head.info.get("chosen", {})
        report = {"cv_accuracy": chosen.get("accuracy"), "cv_macro_f1": chosen.get("macro_f1"), "n": len(keep)}
        methods.append(Method(head=head, key=q.key, digest=q.digest, report=report))
        tables.append(f"{_heading(q)}\n{format_table(head)}")
    if run.none.asked:
        threshold = None if run.none.threshold in (None, "auto") else float(run.none.threshold)  # type: ignore[arg-type]
        methods = [replace(m, none=NoneOf(str(run.none.label), threshold)) for m in methods]
    if held is not None:  # --none-threshold auto: chosen on the held-out states, answered as the task serves them
        # a draft beside --save-task (its tuned classifiers are found there), gone whatever happens
        fd, draft = tempfile.mkstemp(dir=Path(run.save_task).resolve().parent, prefix=".draft-", suffix=".json")
        os.close(fd)
        try:
            _decision_task(run, plan, engine.weights_sha256, methods, draft)
            methods = [replace(m, none=_chosen_none(run, engine, held, draft, say, str(m.key))) for m in methods]
        finally:
            Path(draft).unlink(missing_ok=True)
    task = _decision_task(run, plan, engine.weights_sha256, methods, run.save_task)
    return task, "\n\n".join(tables)


def _decision_task(run: DecisionTrainRun, plan: DecisionPlan, weights: str, methods: list[Method], path: str) -> Task:
    """The decision task with these methods, saved to `path` (--save-task, or a draft)."""
    task = Task(
        model=plan.model.name,
        labels=tuple(DEFAULT_LABELS),
        system=DEFAULT_SYSTEM,
        template=DEFAULT_TEMPLATE,
        weights_sha256=weights,
        versions=versions(),
        decisions=decisions_section(plan.raw_questions, [m.to_dict() for m in methods], plan.config),
    )
    task.save(path)
    return task


def _none_held_out(run: DecisionTrainRun, golds: dict[str, str]) -> tuple[list[Any], list[str], list[int]] | None:
    """ "None of these" checked against its question before any work: one question trained, a
    choice, the option one of its; with `auto`, the held-out states and their gold options
    (--none-data, read as DATA is: in-scope rows and rows of the none option both needed)."""
    rule = run.none
    if not rule.asked:
        return None
    if len(golds) != 1 or rule.label is None:
        raise UserError(
            "--none-label names the option of ONE trained question that means 'none of these' "
            "(--none-threshold answers it): give one --gold-field and --none-label OPTION"
        )
    (q,) = [q for q in run.plan.questions if q.key in golds]
    try:
        NoneOf(rule.label).check(q)
    except DecisionError as e:
        raise UserError(f"--none-label: {e.msg}: name the option that means none (add one to the question)") from None
    if rule.threshold != "auto":
        return None
    assert rule.data is not None  # the front end asks --none-data with auto
    fld = golds[q.key]
    rows = _states(run, (fld,), rule.data)
    keep, gold, lines = _labelled(q, fld, rows, rule.data)
    n_none = sum(g == rule.label for g in gold)
    if n_none == len(gold) or not gold:
        raise UserError(
            f"--none-data {rule.data}: {len(gold)} row(s) with field {fld!r}, {n_none} of them {rule.label!r}: the "
            "threshold is chosen on in-scope states too: give held-out states of the other options as well"
        )
    return [rows[i].text for i in keep], gold, lines


def _chosen_none(
    run: DecisionTrainRun,
    engine: Any,
    held: tuple[list[Any], list[str], list[int]],
    draft: str,
    say: Callable,
    key: str,
) -> NoneOf:
    """--none-threshold auto: the saved task (read back as `decide --task` reads it) answers the held-out states
    of question `key` (the trained one: its wording under another id is that question too), and
    `choose_threshold` picks the largest threshold within --none-target of no threshold."""
    served = resolve_decisions(DecisionOptions(task_file=draft)).loaded(engine)
    decider = served.decider(engine, state_cache=0)
    q = next(q for q in served.questions if q.key == key)
    states, gold, lines = held
    say(f"mlx-slm: 'none of these': answering {len(states)} held-out states to choose the threshold")
    results = decider.decide([DecisionRequest(st, (q,), refusal="question") for st in states])
    bad = next((i for i, r in enumerate(results) if r.probabilities[0] is None), None)
    if bad is not None:
        raise TrainError(
            f"{run.none.data}: line {lines[bad]}: the state and question {q.key!r} are over the model's context: "
            "shorten it or drop the row"
        )
    probs = np.stack([np.asarray(r.probabilities[0], dtype=np.float64) for r in results])
    t, figs = choose_threshold(probs, gold, q.answer_names(), str(run.none.label), run.none.target)
    figs = {**figs, "data": Path(str(run.none.data)).name, "data_rows": len(states)}
    say(
        f"mlx-slm: 'none of these' below {t if t is None else threshold_text(t)}: in-scope accuracy "
        f"{figs['in_scope_accuracy']}, out-of-scope recall {figs['oos_recall']} on the held-out states"
    )
    return NoneOf(str(run.none.label), t, figs)


def tuned_task_name(save_task: str, key: str) -> str:
    """The file name of question `key`'s classifier beside the decision task (a safe name)."""
    stem = Path(save_task).name.removesuffix(".json")
    return f"{stem}.{re.sub(r'[^A-Za-z0-9_.-]', '_', key)[:48] or 'question'}.json"


def own_files(save_task: str, keys: Sequence[str]) -> dict[str, Path]:
    """Each trained question's classifier file beside the task (`tuned_task_name`), by key. Two
    keys whose files would be one (their safe names alike, or apart only in case: one file on a
    disk that ignores case, macOS's default) are refused: one question would answer with the
    other's classifier."""
    out: dict[str, Path] = {}
    seen: dict[str, str] = {}
    for key in keys:
        name = tuned_task_name(save_task, key)
        other = seen.setdefault(name.casefold(), key)
        if other != key:
            raise UserError(
                f"questions {other!r} and {key!r} would keep their classifiers in one file, {name} (its name keeps "
                "a key's letters, digits, '_', '.' and '-', and a disk may ignore case): rename one of them"
            )
        out[key] = Path(save_task).resolve().parent / name
    ours = _classifiers_of(save_task)
    for key, path in out.items():
        if path.exists() and path.name not in ours:  # another task of that name (router.v2.json beside router.json)
            raise UserError(
                f"question {key!r}'s classifier would be written to {path.name}, which exists and is not a question "
                f"classifier of --save-task {save_task} (another file of that name): move it, or save the task under "
                "another name"
            )
    return out


def _classifiers_of(save_task: str) -> set[str]:
    """The question classifier files an existing decision task at `save_task` names (trained again,
    each is replaced), or none."""
    try:
        sec = Task.load(save_task).decisions if Path(save_task).is_file() else None
    except (UserError, OSError, ValueError):
        return set()
    methods = (sec or {}).get("methods") or []
    return {m["tuned"] for m in methods if isinstance(m, dict) and isinstance(m.get("tuned"), str)}


@contextmanager
def _kept_unless_saved(paths: Sequence[Path]) -> Iterator[None]:
    """The question classifiers' files as they were, put back if the run stops before its task is
    saved (an error, Ctrl-C): a failed run leaves the task it would replace answering as before.
    (A fine-tune's adapters are a new file of their own name: the old ones are never touched.)"""
    before = {p: p.read_bytes() if p.is_file() else None for p in paths}
    try:
        yield
    except BaseException:
        for p, data in before.items():
            if data is None:
                if p.is_file() or p.is_symlink():  # what the run made (a folder there was never replaced)
                    p.unlink()
            elif not p.is_file() or p.read_bytes() != data:
                atomic_write(p, data, "a question's classifier")
        raise


def _own_head(trun: TrainRun, settings: Any, fused: bool, say: Any, engine: Any) -> tuple[str, str]:
    return run_train(trun, say=say, engine=engine)[1], "learned head"


def _own_lora(trun: TrainRun, settings: Any, fused: bool, say: Any, engine: Any) -> tuple[str, str]:
    return history_table(run_finetune(trun, settings, fused=fused, say=say)[1]), "fine-tuned"


def _own_choice(trun: TrainRun, settings: Any, fused: bool, say: Any, engine: Any) -> tuple[str, str]:
    task, _choice, table = run_choose(trun, settings, fused=fused, say=say)
    return table, "fine-tuned" if task.trained == "fine-tuned adapters" else "learned head"


@dataclass(frozen=True)
class OwnClassifier:
    """How `tune_question` trains a question's own classifier (`run.tuning`'s mode): what it is
    doing (said); the job ((run, settings, fused, say, the run's engine) -> (its table, what an
    answer's x_method "trained" says): a head reads the engine that will answer with it, a
    fine-tune loads its own, its adapters applied to it); and whether it cross-validates a head
    on every row (then every option's examples are counted before the model loads, as for a head
    on the decision prompt)."""

    doing: str
    train: Callable[[TrainRun, Any, bool, Any, Any], tuple[str, str]]
    folds_every_row: bool = False


OWN = {
    "head": OwnClassifier("a head on its own prompt", _own_head, folds_every_row=True),
    "lora": OwnClassifier("fine-tuning", _own_lora),
    "auto": OwnClassifier("a head or a fine-tune", _own_choice),
}


def tune_question(
    run: DecisionTrainRun,
    plan: DecisionPlan,
    q: DecisionQuestion,
    rows: tuple[list[Any], list[str], list[int]],
    say: Any,
    engine: Any = None,
) -> tuple[Method, str]:
    """Question `q`'s classifier (`run.tuning`: "head" fits classify's head, "lora" fine-tunes,
    "auto" measures a head against a fine-tune on held-out states and keeps the better), trained
    by classify's own jobs on the states as texts and the options' names as labels (the head's
    layers and poolings chosen as `train` chooses them, from `run.head`), saved beside the
    decision task. `rows`: the states, their gold names and their lines in DATA (an error of the
    classifier's job names DATA and those lines, not the file it was handed). The method records
    the classifier file's sha256: a task whose classifier was replaced is refused, not answered by
    it, and a resumed run under a task trained again is refused as other settings."""
    states, gold, lines = rows
    mode, settings, fused = run.tuning  # type: ignore[misc]
    system, labels = tuned_prompt(q)
    by_name = dict(zip(q.answer_names(), labels))
    name = tuned_task_name(run.save_task, q.key)
    target = str(Path(run.save_task).resolve().parent / name)
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data.jsonl"
        data.write_text(
            "".join(
                json.dumps({"text": text(st), "label": by_name[g]}, ensure_ascii=False) + "\n"
                for st, g in zip(states, gold)
            ),
            encoding="utf-8",
        )
        # DATA's states read as a client's are served: a control token in one is text (`OwnClassifiers`)
        tplan = Plan(model=plan.model, system=system, template="{text}", read=ReadSpec(), save_task=target, quiet=True,
                     controls_as_text=True)  # fmt: skip
        trun = TrainRun(str(data), tplan, labels=labels, head=run.head)
        own = OWN[mode]
        say(f"mlx-slm: {q.key!r}: {own.doing} on {len(states)} states")
        try:
            table, trained = own.train(trun, settings, fused, say, engine)
        except UserError as e:
            raise type(e)(_in_data(str(e), str(data), run.data, lines, _options_fix(q))) from None
    report = {"trained": trained, "n": len(states), "classifier": name, "classifier_sha256": sha256_file(Path(target))}
    return Method(key=q.key, digest=q.digest, report=report, tuned=name), table


def _in_data(message: str, handed: str, data: str, lines: Sequence[int], fix: str = _OPTIONS_FIX) -> str:
    """A classifier job's message about the file it was handed (`handed`: DATA's labelled rows, one a
    line) said of DATA: its path, each row's own line, and no fix this command does not take."""
    where = re.compile(re.escape(handed) + r": line (\d+)")
    message = where.sub(lambda m: f"{data}: line {lines[int(m.group(1)) - 1]}", message)
    message = message.replace(handed, data).replace(", or pass --truncate head|tail|middle", "")
    # the labels are the question's options: no --labels to leave one out of
    message = re.sub(r",? leave them out of --labels and the data,", ",", message)
    return re.sub(r",? or leave them out of --labels( and the data| \(or --labels-file\))?", f", {fix}", message)
