"""`eval GOLD --decisions Q.json`: how right and how calibrated each decision question is on
labelled states, every way of answering it side by side, and (`--fit`, `--fit-prior`) the way
that is best on the user's own rows, saved in a task that `decide --task` and `serve --task`
apply to that very question (by its digest, on either route).

GOLD holds a state per row (`state`, else `text`, as `decide` reads it) and a gold answer
per question to score (`--gold-field KEY=FIELD`): a noul's true/false (a JSON boolean, or
true/false/yes/no/1/0 as text), a choice's option (its name; an OpenAI choice's value, typed:
`true` and `"true"` are different options, text matching where the value is unambiguous),
a score's level (its number 0..n-1, or its description). Every state is asked every question
in one pass (a `Decider`). Per question, `text.decisions.metrics` gives accuracy, the Brier
score, ECE, the log-loss and a reliability plot of the answers as the run makes them (raw, or
a `--task`'s methods as applied), and `text.decisions.fitting.corrected` the same answers
divided by a batch prior (the first `--warmup` states', what `decide --calibrate batch` does)
and by a contextual one (content-free states), side by side.

`--fit` learns a bias per option and a temperature per question (by the gold's log-loss,
cross-validated: each state scored by a fit that never saw it), on each way of asking it
(letters or names, one or both option orders), and keeps the way with the best cross-validated
accuracy; `--fit-prior` learns only a prior, from the states alone (no gold). `--save-task T`
saves the questions and each one's method with the model's weights sha256.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from ..classifier.decision_plan import DecisionPlan
from ..classifier.task import Task, decisions_section
from ..files.output import (
    RecordError,
    check_run_files,
    output_format,
    read_manifest,
    read_records,
    same_id,
)
from ..files.readers import ReadSpec
from ..ground.errors import UsageError, UserError
from ..ground.safefs import atomic_write
from ..text.calibration import DEFAULT_WARMUP
from ..text.decisions.answers import chosen_index
from ..text.decisions.errors import DecisionError
from ..text.decisions.files import questions_of
from ..text.decisions.fitting import FitError, Way, corrected, figures, fit_question, prior_of, priors_apply
from ..text.decisions.gold import check_distinct, check_gold_fields, gold_given, gold_index, gold_pairs, gold_text
from ..text.decisions.methods import Method, Methods, trained_phrase
from ..text.decisions.metrics import format_question_report, question_report
from ..text.decisions.prompt import STYLES, names
from ..text.decisions.questions import DecisionQuestion, DecisionRequest
from ..text.decisions.settings import DecisionConfig
from ..text.out_of_scope import figures as oos_figures
from ..text.prompts import DEFAULT_LABELS, DEFAULT_SYSTEM, DEFAULT_TEMPLATE
from ..weights.convert import versions
from ..weights.registry import DEFAULT_MODEL
from .decide import STATE_FIELDS, method_words, state_problem, state_rows
from .evaluate import not_made_from, plot, plot_paths
from .plan import DecisionOptions, Say, resolve_decisions

LEFT_OUT_LISTED = 100  # rows left out that the --json report lists (the summary shows 5, and counts the rest)


@dataclass
class DecisionEvalSettings:
    """One `eval --decisions` run (`given`: the parameter names set on the command line)."""

    input: str
    questions_file: str | None
    gold_fields: tuple[str, ...]
    model: str = DEFAULT_MODEL
    task_file: str | None = None
    fit: bool = False
    fit_prior: bool = False
    predictions: str | None = None  # a decide output, scored without running the model
    save_task: str | None = None
    json_path: str | None = None
    plots: str | None = None
    fmt: str | None = None
    state_field: str | None = None
    id_field: str = "id"
    state_column: str | None = None  # CSV/TSV: None: "state" if the header has it, else "text"
    id_column: str = "id"
    dtype: str | None = None
    style: str = "letters"
    permute: int = 1
    warmup: int = DEFAULT_WARMUP
    batch: int = 32
    quiet: bool = False
    given: frozenset[str] = field(default_factory=frozenset)


def _folder(i: int, key: str) -> str:
    """A question's plot folder: its place and its key, made safe as a file name."""
    return f"{i + 1:02d}-" + (re.sub(r"[^A-Za-z0-9_.-]", "_", key)[:48] or "question")


def _check(s: DecisionEvalSettings) -> None:
    if s.save_task and not (s.fit or s.fit_prior):
        raise UsageError("--save-task with --decisions saves what was fitted: add --fit (or --fit-prior)")
    if s.predictions and (s.save_task or s.task_file or s.dtype or s.fit or s.fit_prior):
        raise UsageError(
            "--predictions scores a decide output as written: drop --task, --save-task, --fit, --fit-prior and --dtype"
            + ("" if s.questions_file else " (and give the questions decide was asked: --decisions Q.json)")
        )
    if s.fit and ({"style", "permute"} & s.given):
        raise UsageError("--fit chooses the style and the option orders itself (by cross-validation): drop them")
    if "warmup" in s.given and s.predictions:
        raise UsageError("--warmup sets the batch prior's states of a model run: drop it with --predictions")


def evaluate_decisions(s: DecisionEvalSettings, say: Say) -> dict[str, Any]:
    """Run the eval (see the module docstring); the figures per question, also printed by `say`'s caller."""
    _check(s)
    files = (("INPUT", s.input), ("--questions", s.questions_file), ("--task", s.task_file))
    reads = [(f, p) for f, p in (*files, ("--predictions", s.predictions)) if p]
    check_run_files(reads, [("--json", s.json_path), ("--save-task", s.save_task)])
    opts = DecisionOptions(s.model, s.dtype, None, s.task_file, s.questions_file, s.style, s.permute, given=s.given)
    plan = resolve_decisions(replace(opts, warmup=s.warmup, given=s.given - {"warmup"}))
    golds = gold_pairs(plan.questions, s.gold_fields)  # every check on the files before the model loads
    if s.fit:
        check_distinct(plan.questions, golds, "--fit")
    if s.save_task:
        _kept_methods(plan, s.save_task)  # a task's tuned classifier the new task could not find: refused now
    if not golds and not s.fit_prior:
        raise UsageError("--decisions: give --gold-field KEY=FIELD (or KEY) for each question to score")
    _plot_folders(s, plan.questions, golds, reads)
    rows = _rows(s, golds)
    engine = None if s.predictions else plan.engine()
    if engine is not None:
        plan = plan.loaded(engine)
    if s.fit:  # a question fitted again is asked in each way compared, not in the way --task fitted it
        plan = replace(plan, methods=_unfitted(plan, golds))
    if s.predictions:  # a decide output: its answers read back, row i of it input row i
        got = read_decisions(s.predictions, rows, plan.questions, s.input, plan.config)
        rows = [r if not isinstance(p, str) else replace(r, error=p) for r, p in zip(rows, got)]
        runs = {ways_of(plan, False)[0]: [p for r, p in zip(rows, got) if r.error is None]}
    else:
        # a fit asks in every way only where a scored question is not trained (a trained one is kept, not fitted)
        fits = s.fit and any(not plan.methods.for_question(q)[0].trained for q in plan.questions if q.key in golds)
        runs = _runs(plan, engine, [r for r in rows if r.error is None], s.batch, fits)
    return _report(s, plan, engine, golds, rows, runs, say)


def _unfitted(plan: DecisionPlan, golds: dict[str, str]) -> Methods:
    """The plan's methods without the saved ones of the questions `--fit` fits again (scored, not
    trained): each way compared asks them its own way (a saved method would answer every way
    alike, and the fit would be saved under a way it was not learned on); `_save` keeps the rest."""
    again = {q.digest for q in plan.questions if q.key in golds}
    saved = {d: m for d, m in plan.methods.saved.items() if m.trained or d not in again}
    return Methods(saved, plan.methods.default)


def _plot_folders(s: DecisionEvalSettings, questions: Sequence[DecisionQuestion], golds: dict, reads: list) -> None:
    """Each scored question's plot folder made now: an unwritable place fails before the model runs."""
    if not s.plots:
        return
    for i, q in enumerate(questions):
        if q.key in golds:
            where = Path(s.plots) / _folder(i, q.key)
            try:
                where.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise UserError(f"--plots {s.plots}: cannot create {where} ({e.strerror or e})") from None
            check_run_files(reads, [("--plots", str(p)) for p in plot_paths(where)])


def _rows(s: DecisionEvalSettings, golds: dict[str, str]) -> list[Any]:
    states = (s.state_field,) if s.state_field else STATE_FIELDS
    fields = tuple(dict.fromkeys(golds.values()))
    column = s.state_column or "state"
    read = ReadSpec(s.fmt, states[0], s.id_field, column, s.id_column, gold=fields, states=states)
    got, _ = state_rows(s.input, read, s.state_column is not None)
    rows = [r if r.error is not None else replace(r, error=state_problem(r)) for r in got]
    if not rows or (not any(r.error is None for r in rows) and not s.predictions):
        first = rows[0].error if rows else "the input is empty"
        raise UserError(f"{s.input}: no row has a state to ask; first problem: {first}")
    check_gold_fields(golds, [r.gold for r in rows if r.error is None], s.input)  # before the model runs
    return rows


def ways_of(plan: DecisionPlan, fit: bool) -> list[Way]:
    """The ways of asking the questions a run compares: every style and order count `--fit` may
    choose from (orders only where a question is a choice), else the plan's own."""
    if not fit:
        return [(plan.methods.default.style, plan.methods.default.permute)]
    orders = (1, 2) if any(q.type == "choice" for q in plan.questions) else (1,)
    # a model's own decision template asks every question its own way: no names style to compare
    styles = [st for st in STYLES if not (st == "names" and plan.config.chat_template)]
    return [(st, n) for n in orders for st in styles]


def _runs(plan: DecisionPlan, engine: Any, ok: list[Any], batch: int, fit: bool) -> dict[Way, list[Any]]:
    """Each way's results for every row with a state (a result, or why it has none)."""
    out = {}
    for style, permute in ways_of(plan, fit):
        methods = Methods(plan.methods.saved, replace(plan.methods.default, style=style, permute=permute))
        decider = replace(plan, methods=methods).decider(engine, state_cache=0)
        got: list[Any] = []
        for k in range(0, len(ok), batch):
            got += _decide(decider, [r.text for r in ok[k : k + batch]], plan.questions)
        out[(style, permute)] = got
    return out


def _decide(decider: Any, states: list[Any], questions: tuple[DecisionQuestion, ...]) -> list[Any]:
    """Each state's result, or why it has none. A question over the context is refused alone (its
    answer None: that row left out of that question, said so), so one question too long for the model
    never takes the others' rows with it, as decide's System One shape refuses the whole row."""
    try:
        return decider.decide([DecisionRequest(st, questions, refusal="question") for st in states])
    except DecisionError as e:
        if len(states) == 1:
            return [str(getattr(e, "msg", e))]
        return [p for st in states for p in _decide(decider, [st], questions)]


def _report(
    s: DecisionEvalSettings,
    plan: DecisionPlan,
    engine: Any,
    golds: dict[str, str],
    rows: list[Any],
    runs: dict[Way, list[Any]],
    say: Say,
) -> dict[str, Any]:
    """Every scored question's figures printed, plotted and written; the fitted methods saved."""
    decider = None if engine is None else plan.decider(engine, state_cache=0)
    scored = _Scored(s, rows, [r for r in rows if r.error is None], runs, ways_of(plan, False)[0], decider)
    main = scored.main
    out: dict[str, Any] = {}
    saved: list[Method] = []
    refit: set[str | None] = set()  # the questions fitted here (a fit not kept: raw, as the report says)
    unscored: list[str] = []  # questions no row scores: said after the others' figures, which are shown
    fits_here = {q.digest for q in plan.questions if s.fit and q.key in golds}
    for i, q in enumerate(plan.questions):
        if q.key in golds:
            try:
                out[q.key] = _question(q, i, golds[q.key], scored)
            except NothingScored as e:
                out[q.key] = {"error": str(e)}
                unscored.append(str(e))
                continue
            say(_format(q, golds[q.key], out[q.key]))
            if s.plots:
                for p in plot(out[q.key], Path(s.plots) / _folder(i, q.key)):
                    say(f"mlx-slm: wrote {p}")
            fitted = out[q.key].get("fit")
            if fitted is not None:
                method = fitted.pop("method")
                refit.add(q.digest)
                if fitted["kept"]:  # a fit no better than the raw answers is not saved: the question goes raw
                    saved.append(method)
        # --fit-prior: every question --fit does not fit (scored or not: its states' answers, not their gold),
        # once a question (its wording under a second id is that question: its one method answers both)
        if s.fit_prior and q.digest not in fits_here and not plan.methods.for_question(q)[0].trained:
            saved.append(_prior_method(q, i, runs[main], s.warmup, plan.methods.for_question(q)[0]))
            fits_here.add(q.digest)
    if s.json_path:
        atomic_write(s.json_path, json.dumps({"questions": out}, indent=2) + "\n", "--json")
    if unscored:  # no task saved from a run that could not score every question it was given
        raise NothingScored("; ".join(unscored) + (f" (no task saved to {s.save_task})" if s.save_task else ""))
    if s.save_task:
        _save(s, plan, engine, saved, refit, say)
    return out


@dataclass(frozen=True)
class _Scored:
    """What every question's report reads: the run's settings, the input's rows and those with a
    state (`ok`), each way's results for `ok` (`runs`), the way the run answers with (`main`) and
    its decider (None: a decide output scored as written)."""

    s: DecisionEvalSettings
    rows: list[Any]
    ok: list[Any]
    runs: dict[Way, list[Any]]
    main: Way
    decider: Any


class NothingScored(UserError):
    """A question no row scores (every gold value missing or no option, every answer refused): the
    other questions' figures are shown and written first, then the run exits 2 naming it."""


def _question(q: DecisionQuestion, i: int, fld: str, scored: _Scored) -> dict[str, Any]:
    """One question's report: its answers' figures, the corrected ones beside them, and its fit."""
    s, runs, main, decider = scored.s, scored.runs, scored.main, scored.decider
    keep, gold, left = _gold_rows(q, fld, scored.ok, scored.rows, runs[main], i)
    labels = q.answer_names()
    final = np.stack([_final(runs[main][j], i) for j in keep])
    raw = np.stack([_raw(runs[main][j], i) for j in keep])
    applied = [_applied(runs[main][j], i) for j in keep]
    chosen = [chosen_index(q, p, a) for p, a in zip(final, applied)]
    conf = [_confidence(q, p, a, c) for p, a, c in zip(final, applied, chosen)]
    rep = question_report(final, gold, labels, binary=q.type == "noul", chosen=chosen, confidence=conf)
    rep["left_out"], rep["left_out_examples"] = len(left), left[:LEFT_OUT_LISTED]
    if q.level_names():  # its table keys the levels by position (System One's keys): their names beside them
        rep["level_names"] = list(q.level_names() or ())
    rep["applied"] = _how(applied[0]) or {"as": "written by decide"}
    none = rep["applied"].get("none_of_these")
    if none:  # "none of these": its option marks the out-of-scope states, as classify's eval reads a none label
        said = [None if labels[c] == none["option"] else labels[c] for c in chosen]
        rep["out_of_scope"] = oos_figures(said, [labels[g] for g in gold], none["option"])
    method = None if decider is None else decider.method(q)[0]
    if method is not None and method.trained:  # a trained question's answer: no prior to divide out
        rep["corrected"] = {"raw": figures(raw, gold, q.type == "noul")}
    else:
        contextual = None if method is None or not priors_apply(labels) else decider.contextual_prior(q, method)
        states = np.stack([_raw(r, i) for r in runs[main] if _answered(r, i)])  # labelled or not, as decide's prior
        rep["corrected"] = corrected(raw, gold, labels, s.warmup, contextual, q.type == "noul", states)
        if not priors_apply(labels):
            rep["corrected_note"] = (
                "no prior: options that differ only in surrounding spaces cannot be told apart by one"
            )
    if s.fit and method is not None and method.trained:  # its trained answers are kept, not fitted over
        rep["fit_skipped"] = f"{trained_phrase(rep['applied']['trained'])}: kept as the task has it, not fitted"
    elif s.fit:
        # only a choice's options are reordered; the names style is the letters' where it does not apply (a noul)
        ways = [w for w in runs if (q.type == "choice" or w[1] == 1) and (w[0] != "names" or names(q) is not None)]
        # a way that refused a row the run's own way answers (its longer prompt over the context, say) is
        # left out: chosen, it would refuse such states where the plain way answers them
        partial = [w for w in ways if not all(_answered(runs[w][j], i) for j in keep)]
        per_way = {w: np.stack([_raw(runs[w][j], i) for j in keep]) for w in ways if w not in partial}
        try:
            fitted = fit_question(per_way, gold, labels, q.key)
        except FitError as e:  # rows left out may be why: a gold value that is no option, say
            if not left:
                raise
            shown = "; ".join(left[:5]) + (" ..." if len(left) > 5 else "")
            raise FitError(f"{e} ({len(left)} row(s) left out: {shown})") from None
        if partial:
            said = "left out (some of the rows refused or failed): " + ", ".join(f"{w[0]} x{w[1]}" for w in partial)
            fitted = replace(fitted, note=f"{fitted.note}; {said}" if fitted.note else said)
        method = Method(fitted.style, fitted.permute, "none", fitted.calibrator, None, q.key, q.digest, fitted.report())
        rep["fit"] = {**fitted.report(), "method": method}
    elif s.fit_prior:
        rep["fit_prior"] = True
    return rep


def _gold_rows(
    q: DecisionQuestion, fld: str, ok: list[Any], rows: list[Any], results: list[Any], i: int
) -> tuple[list[int], np.ndarray, list[str]]:
    """The rows scored (indices into `ok`), their gold options, and why the others are left out."""
    why = [
        (r.line, f"line {r.line}: {r.error}" if not r.error.startswith("line ") else r.error) for r in rows if r.error
    ]
    keep, gold = [], []
    for j, (r, res) in enumerate(zip(ok, results)):
        g = gold_index(q, (r.gold or {}).get(fld), f"line {r.line}: field {fld!r}: ")
        if isinstance(res, str):
            why.append((r.line, f"line {r.line}: {res}"))
        elif _raw(res, i) is None:
            why.append((r.line, f"line {r.line}: question {q.key!r} was refused (over the model's context)"))
        elif not gold_given((r.gold or {}).get(fld)):  # unlabelled for this question: left out, as train does
            why.append((r.line, f"line {r.line}: no gold answer in field {fld!r}"))
        elif g is None:
            value = gold_text((r.gold or {}).get(fld))
            why.append((r.line, f"line {r.line}: field {fld!r} is {value}, not an option of {q.key!r}"))
        else:
            keep.append(j)
            gold.append(g)
    left = [w for _, w in sorted(why, key=lambda x: x[0] if isinstance(x[0], int) else 0)]  # in the input's order
    if not keep:
        raise NothingScored(
            f"question {q.key!r}: no row has both an answer and a gold option in field {fld!r}; "
            f"first problem: {left[0] if left else 'none'}"
        )
    return keep, np.asarray(gold, dtype=np.int64), left


@dataclass(frozen=True)
class Written:
    """A decide output's row read back: each question's probabilities and what made its answer
    (its `x_method`, or None where nothing beyond the raw letters did), as written."""

    probabilities: tuple[np.ndarray, ...]
    applied: tuple[dict[str, Any] | None, ...]
    raw: tuple = ()  # the raw answers are not read back: `_raw` takes the written ones


def _confidence(q: DecisionQuestion, p: np.ndarray, applied: dict[str, Any] | None, chosen: int) -> float:
    """How sure an answer is, as eval scores it: its option's probability; for "none of these"
    chosen by the threshold, the probability that the state is not its likeliest other option
    (1 - that option's), as `classify`'s eval reads a none answer (`out_of_scope.none_answer`)."""
    if not ((applied or {}).get("none_of_these") or {}).get("answered_none"):
        return float(p[chosen])
    return 1.0 - float(np.max(np.delete(p, chosen)))


def _how(applied: dict[str, Any] | None) -> dict[str, Any] | None:
    """How a question's answers were made, as the report says it: an answer's record without what
    is its own (whether "none of these" chose it)."""
    if not applied or "none_of_these" not in applied:
        return applied
    rule = {k: v for k, v in applied["none_of_these"].items() if k != "answered_none"}
    return {**applied, "none_of_these": rule}


def _applied(res: Any, i: int) -> dict[str, Any] | None:
    """What made question `i`'s answer in a result (its `x_method`), or None."""
    got = getattr(res, "applied", None)
    return dict(got[i]) if got and got[i] is not None else None


def _final(res: Any, i: int) -> np.ndarray:
    return np.asarray(res.probabilities[i], dtype=np.float64)


def _answered(res: Any, i: int) -> bool:
    """Whether a result answers question i (not an error row's text, not refused)."""
    return not isinstance(res, str) and _raw(res, i) is not None


def _raw(res: Any, i: int) -> np.ndarray | None:
    """A result's raw answer to question i (a decide output read back: as written)."""
    got = res.raw[i] if res.raw else res.probabilities[i]
    return None if got is None else np.asarray(got, dtype=np.float64)


def _prior_method(q: DecisionQuestion, i: int, results: list[Any], warmup: int, asked: Method) -> Method:
    """`--fit-prior` for a question without gold: the batch prior of the states' raw answers, saved
    with the way they were asked (`asked`: the run's --style and --permute, or the question's saved
    method), so that a task divides it out of answers asked that way, never another's."""
    got = [_raw(r, i) for r in results if _answered(r, i)]
    probs = np.stack(got) if got else np.zeros((0, len(q.options)))
    cal = prior_of(probs, q.answer_names(), q.key, warmup)
    report = {"prior_from_states": cal.n}
    return Method(style=asked.style, permute=asked.permute, calibrator=cal, key=q.key, digest=q.digest, report=report)


def _format(q: DecisionQuestion, fld: str, rep: dict[str, Any]) -> str:
    """A question's report: its headline and table, the corrected figures side by side, its fit."""
    head, _, rest = format_question_report(q.key, q.type, fld, rep).partition("\n")
    applied = rep["applied"]
    how = "as written by decide" if "as" in applied else method_words(applied)
    legend = q.level_legend()
    out = f"{head}\nanswers: {how}\n" + (f"({legend})\n" if legend else "") + rest
    lines = ["", "way                 accuracy  macro-F1     ECE   Brier  log-loss"]
    for name, f in rep["corrected"].items():
        what = {
            "raw": trained_phrase(rep["applied"]["trained"]) if "trained" in rep["applied"] else "raw",
            "batch": "batch prior",
            "contextual": "contextual prior",
        }[name]
        lines.append(
            f"{what:<18} {100 * f['accuracy']:8.2f} % {f['macro_f1']:8.4f} {f['ece']:7.4f} {f['brier']:7.4f}"
            f" {max(0.0, f['log_loss']):9.4f}"
        )
    if rep.get("corrected_note"):
        lines.append(f"({rep['corrected_note']})")
    fit = rep.get("fit")
    if fit is not None:
        for w in fit["ways"]:
            cv = "n/a" if w["cv_accuracy"] is None else f"{100 * w['cv_accuracy']:.2f} %"
            lines.append(f"fit {w['style']}, {w['permute']} order(s): cross-validated accuracy {cv}")
        ch = fit["chosen"]
        best = f"{ch['style']}, {ch['permute']} order(s); temperature {fit['temperature']:.4f}"
        lines.append(f"fit: chose {best}" if fit["kept"] else f"fit: none kept ({best}: not applied)")
        if fit.get("cv_accuracy_of_choice") is not None and len(fit["ways"]) > 1:
            lines.append(
                f"fit: the choice of way, cross-validated (each fold answered by the way best on the others alone): "
                f"{100 * fit['cv_accuracy_of_choice']:.2f} %, against {100 * fit['raw_accuracy']:.2f} % raw"
            )
        if fit.get("note"):
            lines.append(f"fit: {fit['note']}")
    if rep.get("fit_skipped"):
        lines.append(f"fit: {rep['fit_skipped']}")
    oos, none = rep.get("out_of_scope"), (rep["applied"] or {}).get("none_of_these")
    if oos is not None and none is not None:
        lines.append(
            f"none of these ({none['option']!r}, min confidence {none['min_confidence']}): "
            f"{oos['out_of_scope']} out-of-scope state(s), recall {_pct(oos['oos_recall'])}, "
            f"precision {_pct(oos['oos_precision'])}; in scope {oos['in_scope']}: accuracy "
            f"{_pct(oos['in_scope_accuracy'])}, answered {_pct(oos['in_scope_answered'])}"
        )
    if rep.get("left_out"):
        shown, n = rep["left_out_examples"][:5], rep["left_out"]
        more = (
            f"; and {n - len(shown)} more (the --json report lists up to {LEFT_OUT_LISTED})" if n > len(shown) else ""
        )
        lines.append(f"{n} row(s) left out: " + "; ".join(shown) + more)
    return out + "\n".join(lines)


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.2f} %"


def _kept_methods(plan: DecisionPlan, save_task: str) -> list[Method]:
    """The methods of `--task` (its questions' that this run asks) a new task keeps where this run
    fits nothing better. A tuned question's classifier is a file beside its task: kept only by a
    task saved in the same folder (a task elsewhere could not find it)."""
    home = Path(save_task).resolve().parent
    out, seen = [], set()
    for q in plan.questions:
        m = plan.methods.saved.get(q.digest)
        if m is None or q.digest in seen:  # a question asked under two ids: its one method, once
            continue
        seen.add(q.digest)
        if m.tuned is not None:
            if Path(m.tuned).resolve().parent != home:
                raise UsageError(
                    f"--save-task {save_task}: question {q.key!r} is answered by a classifier of its own "
                    f"({trained_phrase(str((m.report or {}).get('trained', 'classifier')))}) beside "
                    f"--task ({m.tuned}), which a task in another folder cannot find: save the new task beside it"
                )
            m = replace(m, tuned=Path(m.tuned).name)
        out.append(m)
    return out


def _save(
    s: DecisionEvalSettings, plan: DecisionPlan, engine: Any, fitted: list[Method], refit: set[str | None], say: Say
) -> None:
    """The task: --task's methods of these questions, but where this run fitted one (`refit`), in
    the questions' order."""
    new = refit | {m.digest for m in fitted}
    kept = [m for m in _kept_methods(plan, s.save_task or "") if m.digest not in new]
    order = {q.digest: i for i, q in enumerate(plan.questions)}
    saved = sorted([*kept, *fitted], key=lambda m: order.get(m.digest, len(order)))
    if not saved:  # a task that changes no answer would be served as if fitted: nothing is written
        raise UserError(  # (the options went together: no usage line after the run's figures)
            f"--save-task {s.save_task}: no question was fitted, so nothing was saved: a fit is kept only where it "
            "could be cross-validated (two or more labelled states per option) and its cross-validated accuracy "
            "beats the raw answers' (each question's note above says which it missed); label more states, or "
            "answer raw without a task"
        )
    Task(
        model=plan.model.name,
        labels=tuple(DEFAULT_LABELS),
        system=DEFAULT_SYSTEM,
        template=DEFAULT_TEMPLATE,
        weights_sha256=engine.weights_sha256 if engine else None,
        versions=versions(),
        decisions=decisions_section(plan.raw_questions, [m.to_dict() for m in saved], plan.config),
    ).save(s.save_task)
    from_task = f", {len(kept)} kept from {s.task_file}" if kept else ""
    say(
        f"mlx-slm: task saved to {s.save_task} ({len(fitted)} question(s) fitted{from_task}: decide --task and "
        "serve --task apply them)"
    )


def read_decisions(
    path: str,
    rows: list[Any],
    questions: Sequence[DecisionQuestion],
    input_path: str,
    config: DecisionConfig | None = None,
) -> list[Any]:
    """A decide output read back row by row: each row's answers (`Written`: probabilities per
    question, in question order, and what made each), or its error text. Its rows must be the
    input's (count and ids, and the content its manifest recorded), its questions these (where
    its manifest records them: the same wording and options, read with `config`)."""
    where = f"--predictions {path}"
    m = read_manifest(path)
    if m is not None:
        st = m["settings"]
        if st.get("form") != "decisions":
            raise UserError(f"{where} is not a decide output (its manifest says form {st.get('form')!r})")
        _same_questions(where, st.get("decision_questions"), questions, config or DecisionConfig())
        if not m.get("complete"):
            raise UserError(f"{where} is unfinished: finish it with mlx-slm decide ... --resume")
        why = not_made_from(where, input_path, st, f"mlx-slm decide {input_path} --questions Q.json -o {path}")
        if why:
            raise UserError(why)
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
        ans = json.loads(ans) if isinstance(ans, str) else ans
        probs = tuple(_probabilities(q, ans, k, where, i + 1) for k, q in enumerate(questions))
        out.append(Written(probs, tuple(_x_method(q, ans, k, where, i + 1) for k, q in enumerate(questions))))
    return out


def _same_questions(where: str, recorded: Any, questions: Sequence[DecisionQuestion], config: DecisionConfig) -> None:
    """The questions a decide output's manifest records are the ones scored: answers to another
    wording or other options would be scored as these (same keys, other questions)."""
    if recorded is None:
        return
    try:
        made = {q.key: q.digest for q in questions_of(recorded, config)}
    except DecisionError:
        return  # a manifest of an older form: the answers' own checks stand
    for q in questions:
        if q.key in made and made[q.key] != q.digest:
            raise UserError(
                f"{where}: question {q.key!r} is not the one its answers were made for (its wording, options or "
                "descriptions differ from the questions its manifest records): give the questions decide was run "
                "with, or run decide again with these"
            )


def _x_method(q: DecisionQuestion, answers: Any, k: int, where: str, row: int) -> dict[str, Any] | None:
    """A written answer's `x_method` (what made it, "none of these" included), or None; a none
    rule that names no option of `q` (another question's output) says so."""
    a = answers[k] if isinstance(answers, list) else answers[q.key]
    got = a.get("x_method") if isinstance(a, dict) else None
    if not isinstance(got, dict):
        return None
    none = got.get("none_of_these")
    if none is not None and not (
        isinstance(none, dict) and q.type == "choice" and none.get("option") in q.answer_names()
    ):
        raise UserError(
            f"{where}: row {row}: the answer to question {q.key!r} says 'none of these' answered with {none!r:.80}, "
            "which names none of its options: give the decide output of these questions"
        )
    return got


def _probabilities(q: DecisionQuestion, answers: Any, k: int, where: str, row: int) -> np.ndarray:
    """A question's probabilities in its option order, from its answer in either shape; an answer
    that is not this question's (another question, other options), or whose probabilities are no
    probabilities (NaN, negative, above 1), says which row and question, and what to do."""
    p = _read_probabilities(q, answers, k, where, row)
    if not (np.all(np.isfinite(p)) and np.all(p >= 0) and np.all(p <= 1 + 1e-6)):
        raise UserError(
            f"{where}: row {row}: question {q.key!r}: its probabilities {[round(float(x), 6) for x in p][:8]} are not "
            "finite numbers in [0, 1] (an edited or damaged output?): give the output as decide wrote it"
        )
    return p


def _read_probabilities(q: DecisionQuestion, answers: Any, k: int, where: str, row: int) -> np.ndarray:
    fix = "give the decide output of these questions (--decisions must be the questions decide was asked)"
    try:
        a = answers[k] if isinstance(answers, list) else answers[q.key]
        if isinstance(answers, list):
            named = a.get("name") if isinstance(a, dict) else None
            if named is not None and named not in (q.name, q.key):  # read by position: the question it answers
                raise UserError(
                    f"{where}: row {row}: answer {k + 1} is question {str(named)[:60]!r}'s, not {q.key!r}'s: give "
                    "the questions in the order decide asked them (--decisions must be the questions decide was asked)"
                )
            if a["type"] == "predicate":
                p = float(a["probability"])
                return np.array([p if o == "true" else 1 - p for o in q.options])
            got = [float(x["probability"]) for x in a["probabilities"]]
            if len(got) != len(q.options):
                raise KeyError(f"{len(got)} options")
            return np.array(got)
        if a["type"] == "noul":
            p = float(a["noul"])
            return np.array([p if o == "true" else 1 - p for o in q.options])
        names = q.answer_names() if q.type == "choice" else tuple(str(i) for i in range(len(q.options)))
        return np.array([float(a["probabilities"][n]) for n in names])
    except KeyError as e:
        raise UserError(f"{where}: row {row}: question {q.key!r} has no answer for {e.args[0]!r}: {fix}") from None
    except (IndexError, TypeError, ValueError) as e:
        raise UserError(f"{where}: row {row}: question {q.key!r}'s answer cannot be read ({e}): {fix}") from None
