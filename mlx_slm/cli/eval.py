"""`eval`: classify a labelled input (or read a classify output back) and report the figures."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import click

from ..classifier.plan import Plan
from ..classifier.task import Task
from ..files.output import OutputLock, check_run_files, files_read
from ..files.readers import gold_problem, read_rows
from ..ground.errors import UserError
from ..ground.safefs import atomic_write
from ..jobs import plan as plans
from ..jobs.evaluate import form_problem, plot, plot_paths, read_predictions
from ..jobs.evaluate_decisions import DecisionEvalSettings, evaluate_decisions
from ..jobs.plan import flag_names
from ..text.decisions.prompt import STYLES
from ..text.metrics import format_report, report
from ..text.out_of_scope import figures as oos_figures
from ..text.out_of_scope import none_answer
from .base import Command, notice, warn_blas
from .options import TASK_OPTION_NAMES, some_task_options, task_settings


@click.command(name="eval", cls=Command)
@click.argument("input")
@click.option(
    "--predictions",
    type=click.Path(exists=True, dir_okay=False),
    help="Score this classify output (row i = input row i) instead of running the model.",
)
@click.option("--json", "json_path", type=click.Path(dir_okay=False), help="Write the figures as JSON here.")
@click.option(
    "--plots", type=click.Path(file_okay=False), help="Write confusion.png and reliability.png into this folder."
)
@click.option(
    "--gold-field",
    "--gold-column",
    "gold_fields",
    multiple=True,
    default=("label",),
    show_default=True,
    help="Field (JSONL) or column (CSV) of the gold label. With several questions (--questions or a task "
    "of questions), NAME=FIELD once per question to score (NAME alone: the field of that name).",
)
@click.option(
    "--decisions",
    "decisions_file",
    type=click.Path(exists=True, dir_okay=False),
    help="Score typed decisions (as `decide` asks them): Q.json's questions, each with --gold-field KEY=FIELD; "
    "accuracy, Brier, ECE and a reliability plot per question.",
)
@click.option(
    "--fit",
    is_flag=True,
    help="--decisions: learn each scored question's bias per option and temperature on INPUT (by the gold's "
    "log-loss, cross-validated), and the style (letters, names or prompt) and option orders that answer it best; "
    "--save-task keeps them for decide --task and serve --task.",
)
@click.option(
    "--fit-prior",
    is_flag=True,
    help="--decisions: learn each question's prior from INPUT's states alone (no gold needed: the mean answer of "
    "the first --warmup states), saved with --save-task; a question with --gold-field and --fit is fitted instead.",
)
@click.option(
    "--style",
    type=click.Choice(STYLES),
    default="letters",
    show_default=True,
    help="--decisions: ask the questions in this style (letters: Transformers' prompt; names: the options' own "
    "names; prompt: each question as its own classifier's system message, the state as the user's). --fit-prior "
    "saves its prior with this style and --permute.",
)
@click.option(
    "--permute",
    type=click.Choice(["1", "2"]),
    default="1",
    show_default=True,
    callback=lambda _c, _p, v: int(v),
    help="--decisions: 2 asks each choice in both option orders and averages.",
)
@some_task_options(TASK_OPTION_NAMES - {"gold_field"})
@click.pass_context
def evaluate(
    ctx: click.Context,
    input: str,
    predictions: str | None,
    json_path: str | None,
    plots: str | None,
    gold_fields: tuple[str, ...],
    decisions_file: str | None = None,
    fit: bool = False,
    **o: Any,
) -> None:
    """Classify a labelled INPUT and report how right the labels are.

    \b
    INPUT holds a text and a gold label per row (--gold-field, default "label"):
      {"text": "I was charged twice", "label": "billing"}
    Reports accuracy, macro-F1, per-label precision/recall/F1, the confusion matrix
    (rows gold, columns predicted), expected calibration error, and accuracy at
    coverage (answer only the most confident x %: how to choose --min-confidence).
    Rows whose gold label is missing or not a label are error rows, left out of the
    figures and counted.

    \b
      mlx-slm eval tickets.jsonl --calibrate batch --plots eval/ --json eval.json
      mlx-slm eval tickets.jsonl --predictions preds.jsonl   # no model run

    \b
    Typed decisions (docs/decisions.md), each row a state and a gold answer per question:
      {"state": "I was charged twice", "team": "billing", "urgent": true}
      mlx-slm eval gold.jsonl --decisions Q.json --gold-field team --gold-field urgent \\
          --fit --save-task task.json --plots eval/
    Answers are scored raw and with a batch or contextual prior, side by side; --fit
    learns each question's bias, temperature, style and orders (cross-validated) for
    decide --task and serve --task. --predictions OUT scores a decide output.

    Docs: docs/labels.md
    """
    how = {"fit": fit, **{k: o.pop(k) for k in ("fit_prior", "style", "permute")}}
    asked = decisions_file is not None or fit or how["fit_prior"] or _decision_task(o.get("task_file"))
    if _decisions_only(ctx, asked):
        _evaluate_decisions(ctx, (input, decisions_file, predictions), how, (json_path, plots), gold_fields, o)
        return

    o["gold_field"] = gold_fields[-1]
    settings = task_settings(ctx, o)
    if ctx.get_parameter_source("gold_fields") == click.core.ParameterSource.COMMANDLINE:
        settings = type(settings)(**{**settings.__dict__, "given": settings.given | {"gold_field"}})
    inputs = files_read(settings, ("INPUT", input), ("--predictions", predictions))  # every file the run reads
    plans.check_format_fields(settings, (input, settings.calibration_data))  # a field option no file has
    check_run_files(inputs, [("--json", json_path), ("--save-task", settings.save_task)])  # before any is read
    if predictions:
        _refuse_run_options(settings.given)
    if settings.save_task:  # one writer of a task at a time (held to the end)
        ctx.with_resource(OutputLock(settings.save_task, create=False, option="--save-task"))
    plan = plans.resolve(settings, notice)
    if plan.questions is not None:
        _evaluate_questions(plan, input, (predictions, json_path, plots), gold_fields, inputs)
        return
    if len(gold_fields) > 1 or "=" in gold_fields[0]:
        raise click.UsageError(
            "--gold-field takes one field for a task with one question (NAME=FIELD pairs go with --questions)"
        )
    if plots:  # made now (parents too), so an unwritable place fails before the model runs
        _plots_folder(plots)
        check_run_files(inputs, [("--plots", plots)])
        # The files in it too (a link placed at confusion.png): refused now, not after the report.
        check_run_files(inputs, [("--plots", str(p)) for p in plot_paths(plots)])
    rows = list(read_rows(input, plan.read.with_gold().for_input(input)))
    labels = plan.labels
    if predictions:
        preds = read_predictions(predictions, rows, input)
    else:
        warn_blas()
        labels, preds = _predict(plan, rows)
    none = _none_label(plan.task)
    rep, errors = _report(rows, preds, labels, plan.read.gold_field, input, report, none)
    click.echo(format_report(rep) + format_unknown(rep))
    if "out_of_scope" in rep:
        click.echo("\n" + format_oos(rep["out_of_scope"], none))
    if errors:
        click.echo(f"\n{len(errors)} row(s) left out: " + "; ".join(errors[:5]) + (" ..." if len(errors) > 5 else ""))
    if json_path:
        atomic_write(json_path, json.dumps(rep, indent=2) + "\n", "--json")
    if plots:
        try:
            _wrote(plot(rep, plots), plan.quiet)
        except OSError as e:
            raise UserError(
                f"--plots {plots}: cannot write the plots there ({e.strerror or e}): choose another folder"
            ) from None


def _wrote(paths: list[Path], quiet: bool) -> None:
    """Each file written, said on stderr (not with -q: no progress or summary)."""
    for p in [] if quiet else paths:
        notice(f"mlx-slm: wrote {p}")


def _decision_task(path: str | None) -> bool:
    """Whether --task is a decision task (its questions scored as --decisions would: `eval GOLD --task
    T --gold-field team`); a task that cannot be read is said by the run that reads it."""
    if not path:
        return False
    try:
        return Task.load(path).for_decisions
    except (UserError, OSError):
        return False


def _decisions_only(ctx: click.Context, decisions: bool) -> bool:
    """Whether the run scores typed decisions; --style and --permute ask them, so without
    --decisions they would change nothing: refused."""
    asked = [n for n in ("style", "permute") if ctx.get_parameter_source(n) == click.core.ParameterSource.COMMANDLINE]
    if asked and not decisions:
        raise click.UsageError(f"--{asked[0]} asks typed decisions: it goes with --decisions Q.json")
    return decisions


# The task options `eval --decisions` takes (the others describe a labels task: refused there).
_DECISION_OPTIONS = {
    "model",
    "task_file",
    "save_task",
    "fmt",
    "text_field",
    "id_field",
    "text_column",
    "id_column",
    "dtype",
    "warmup",
    "quiet",
}


def _evaluate_decisions(
    ctx: click.Context,
    given: tuple[str, str | None, str | None],
    how: dict[str, Any],
    outputs: tuple[str | None, str | None],
    gold_fields: tuple[str, ...],
    o: dict[str, Any],
) -> None:
    """`eval --decisions` (`jobs.evaluate_decisions`), from the command's options: `given` holds INPUT,
    --decisions and --predictions, `outputs` --json and --plots."""
    (input, decisions, predictions), (json_path, plots) = given, outputs
    reads = files_read(o, ("INPUT", input), ("--decisions", decisions), ("--predictions", predictions))
    check_run_files(reads, [("--json", json_path), ("--save-task", o.get("save_task"))])  # before any is read
    if o.get("save_task"):  # one writer of a task at a time (held to the end)
        ctx.with_resource(OutputLock(o["save_task"], create=False, option="--save-task"))
    typed = {k for k in o if ctx.get_parameter_source(k) == click.core.ParameterSource.COMMANDLINE}
    other = sorted(typed - _DECISION_OPTIONS)
    if other:
        raise click.UsageError(
            f"--decisions scores typed decisions: {flag_names(set(other))} is for a labels task; drop it"
        )
    if decisions is None and not o.get("task_file"):
        raise click.UsageError("--fit and --fit-prior go with --decisions Q.json (or a --task holding decisions)")
    gold_typed = ctx.get_parameter_source("gold_fields") == click.core.ParameterSource.COMMANDLINE
    if not gold_typed and not how["fit_prior"]:
        what = "--decisions" if decisions else f"--task {o.get('task_file')} is a decision task"
        raise click.UsageError(f"{what}: give --gold-field KEY=FIELD (or KEY) for each question to score")
    for name in ("style", "permute"):
        if ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE:
            typed.add(name)

    if plots:
        _plots_folder(plots)
    warn_blas()
    s = DecisionEvalSettings(
        input,
        decisions,
        gold_fields if gold_typed else (),
        model=o["model"],
        task_file=o.get("task_file"),
        fit=how["fit"],
        fit_prior=how["fit_prior"],
        style=how["style"],
        permute=how["permute"],
        warmup=o["warmup"],
        predictions=predictions,
        save_task=o.get("save_task"),
        json_path=json_path,
        plots=plots,
        fmt=o.get("fmt"),
        state_field=o["text_field"] if "text_field" in typed else None,
        id_field=o["id_field"],
        state_column=o["text_column"] if "text_column" in typed else None,
        id_column=o["id_column"],
        dtype=o.get("dtype"),
        quiet=o.get("quiet", False),
        given=frozenset(typed),
    )
    # the figures on stdout; the notes ("mlx-slm: wrote ...", the task saved) on stderr, unless -q
    evaluate_decisions(s, lambda m: click.echo(m) if not m.startswith("mlx-slm:") else s.quiet or notice(m))


# What changes the predictions a model run makes: --predictions scores a classify output as it was
# written, so these would be ignored there (classify again with them instead).
_RUN_OPTIONS = (
    "calibrate",
    "calibration_data",
    "min_confidence",
    "threshold",
    "warmup",
    "save_task",
    "scoring",
    "truncate",
    "examples_file",
    "system",
    "template",
    "dtype",
    "keep_quantized",
    "batch_size",
    "max_batch_tokens",
    "window",
    "no_sort",
    "no_prefix_cache",
)


def _refuse_run_options(given: frozenset[str]) -> None:
    typed = sorted(set(_RUN_OPTIONS) & given)
    if typed:
        raise click.UsageError(
            f"--predictions scores a classify output as it was written, without running the model: "
            f"{flag_names(set(typed))} would change nothing there; drop {'it' if len(typed) == 1 else 'them'}, "
            "or classify again with them and score that output"
        )


def _predict(plan: Plan, rows: list[Any]) -> tuple[list[str], list[dict[str, Any] | None]]:
    """Run the model on the rows with a text: the labels, and one prediction (or None) a row."""
    plan, clf = plans.load_fitted(plan, notice)
    why = form_problem(clf.spec.record_shape().form)  # a multi-label or one-output head: refused, before any work
    if why:
        raise UserError(why)
    calib = plans.calibration_run(plan, clf)
    ok = [r for r in rows if r.error is None]
    run = clf.run([r.item for r in ok], window=plan.window)
    got = iter(calib(run))
    preds: list[dict[str, Any] | None] = []
    for r in rows:
        p = next(got) if r.error is None else None
        preds.append(None if p is None else {"label": p.label, "probs": p.probs, "error": p.error})
    for _ in got:  # finish the run (nothing is left but its figures): the summary counts every item
        pass
    plans.save_task(plan, clf, calib, notice)
    if not plan.quiet:
        s = run.stats
        notice(
            f"mlx-slm: {len(ok)} items in {s.seconds:.1f} s, {s.items_per_s:.2f} items/s; {plans.describe(plan, calib)}"
        )
    return list(clf.labels), preds


def _none_label(task: Any) -> str | None:
    """The gold label of out-of-scope texts for a task that answers "none of these": its learned none
    label, or the label that marked them in the held-out data its threshold was chosen on."""
    if task is None or not task.none:
        return None
    return task.none["label"] or (task.none.get("min_confidence") or {}).get("out_of_scope_label")


def _report(
    rows: list[Any], preds: list[Any], labels: Any, gold_field: str, input: str, report: Any, none: str | None = None
) -> tuple[dict[str, Any], list[str]]:
    """The figures over the rows with a gold label and a prediction, and why each other row is left out;
    with a none label (the task's "none of these"), in-scope accuracy and out-of-scope recall and precision.

    With a none label, "none of these" is an answer, not an abstention: a text answered none is
    predicted the none label (`none_answer`), so a gold none answered none is right everywhere
    (accuracy, macro-F1, the per-label table, the confusion), and the none label's row there is its
    own out-of-scope recall and precision. A task whose threshold alone answers none (the none
    label marked only its held-out texts) gets that label as one more row and column."""

    gold, pred_labels, conf, errors = [], [], [], []
    scored = [*labels, none] if none is not None and none not in labels else list(labels)
    every: tuple[list[str], list[Any]] = ([], [])  # the out-of-scope figures' rows (an answer of none: None)
    for r, p in zip(rows, preds):
        problem = r.error or gold_problem(r, scored, gold_field)
        if problem:
            errors.append(problem)
        elif p is None or p.get("error"):
            errors.append(f"line {r.line}: {p.get('error') if p else 'no prediction'}")
        else:
            label, c = none_answer(p.get("label"), p.get("probs") or {}, none)
            gold.append(str(r.gold))
            pred_labels.append(label)
            conf.append(c)
            every[0].append(gold[-1])
            every[1].append(None if label == none else label)  # the none label given as an answer: none too
    if not gold:
        raise UserError(
            f"{input}: no row has both a text and a gold label among {scored}; first problem: "
            f"{errors[0] if errors else 'the input is empty'}"
        )
    # A prediction that is none of the labels (a --predictions file of another label set) is wrong, as
    # any other wrong answer: its label is one more column (support 0), and the report names it.
    unknown = {
        lab: pred_labels.count(lab) for lab in dict.fromkeys(pred_labels) if lab is not None and lab not in scored
    }
    rep = report(gold, pred_labels, conf, [*scored, *unknown])
    rep["errors"] = len(errors)
    if unknown:
        rep["unknown_labels"] = unknown
    if none is not None:
        rep["none_label"] = none
        rep["out_of_scope"] = oos_figures(every[1], every[0], none)
    return rep, errors


def format_unknown(rep: dict[str, Any]) -> str:
    """The report's line on predicted labels that are none of the labels (counted wrong), or ""."""
    unknown = rep.get("unknown_labels") or {}
    if not unknown:
        return ""
    said = ", ".join(f"{lab!r} ({n})" for lab, n in unknown.items())
    return (
        f"\n{sum(unknown.values())} prediction(s) are not among the labels, counted wrong: {said}; "
        "check that the predictions were made with these labels"
    )


def format_oos(f: dict[str, Any], none: str) -> str:
    """The "none of these" figures in a few lines."""

    def pct(x: Any) -> str:
        return "n/a" if x is None else f"{100 * x:.2f} %"

    return (
        f"none of these (gold {none!r}: {f['out_of_scope']} texts; {f['in_scope']} in scope)\n"
        f"in-scope accuracy {pct(f['in_scope_accuracy'])} (answered {pct(f['in_scope_answered'])}; 'none' counted wrong)\n"
        f"out-of-scope recall {pct(f['oos_recall'])}  precision {pct(f['oos_precision'])}"
    )


def _gold_pairs(plan: Plan, pairs: tuple[str, ...]) -> dict[str, str]:
    """--gold-field NAME=FIELD (or NAME) once per question to score: {question: field}."""
    qs = {q.name: q for q in plan.questions or ()}
    golds: dict[str, str] = {}
    for pair in pairs:
        name, eq, fld = pair.partition("=")
        if name not in qs:
            raise click.UsageError(
                f"--gold-field {pair}: {name!r} is not a question (the questions: {', '.join(qs)}); "
                "give NAME=FIELD for each question to score"
            )
        if eq and not fld.strip():
            raise click.UsageError(f"--gold-field {pair}: the FIELD after '=' is empty: give NAME=FIELD, or NAME alone")
        if qs[name].type.many:
            raise click.UsageError(f"--gold-field {pair}: multi questions (several labels a text) are not scored yet")
        if name in golds:
            raise click.UsageError(
                f"--gold-field {pair}: question {name!r} is given twice (its field {golds[name]!r} already): "
                "give one NAME=FIELD per question"
            )
        golds[name] = fld or name
    return golds


def _evaluate_questions(
    plan: Plan,
    input: str,
    outputs: tuple[str | None, str | None, str | None],
    pairs: tuple[str, ...],
    inputs: list[Any],
) -> None:
    """One report per question named by --gold-field NAME=FIELD, from one run over the texts
    (read once, every gold field with it), calibrated and abstaining as classify's would be.
    `outputs`: --predictions, --json and --plots."""
    predictions, json_path, plots = outputs
    qs = {q.name: q for q in plan.questions or ()}
    golds = _gold_pairs(plan, pairs)
    if plots:
        for name in golds:
            _plots_folder(str(Path(plots) / name))
            check_run_files(inputs, [("--plots", str(p)) for p in plot_paths(str(Path(plots) / name))])
    fields = tuple(dict.fromkeys(golds.values()))
    rows = list(read_rows(input, plan.read.with_gold(fields)))  # stdin read once
    preds: list[Any] = []
    if not predictions:  # one run for every question
        warn_blas()
        plan, clf = plans.load_fitted(plan, notice)
        calib = plans.calibration_run(plan, clf)  # --calibrate batch and --min-confidence per question, as classify
        ok = [r for r in rows if r.error is None]
        run = clf.run([r.text for r in ok], window=plan.window)
        got = iter(calib(run))
        preds = [next(got) if r.error is None else None for r in rows]
        for _ in got:
            pass
        plans.save_task(plan, clf, calib, notice)
        if not plan.quiet:
            st = run.stats
            notice(
                f"mlx-slm: {len(ok)} items in {st.seconds:.1f} s, {st.items_per_s:.2f} items/s; "
                f"{plans.describe(plan, calib)}"
            )
    out: dict[str, Any] = {}
    for name, fld in golds.items():
        q = qs[name]
        q_rows = [replace(r, gold=None if r.gold is None else r.gold.get(fld)) for r in rows]
        if predictions:  # a classify --questions output, read back per question (no model run)
            answers = read_predictions(predictions, q_rows, input, question=name)
        else:
            answers = [
                None
                if p is None
                else {"label": p.answers[name]["label"], "probs": p.answers[name]["probs"], "error": p.error}
                if p.ok
                else {"error": p.error}
                for p in preds
            ]
        rep, errors = _report(q_rows, answers, list(q.labels), fld, input, report)
        out[name] = rep
        click.echo(f"== {name} ({q.type.name}, gold field {fld!r})\n" + format_report(rep) + format_unknown(rep))
        if errors:
            click.echo(f"{len(errors)} row(s) left out: " + "; ".join(errors[:5]) + (" ..." if len(errors) > 5 else ""))
        click.echo("")
        if plots:
            _wrote(plot(rep, str(Path(plots) / name)), plan.quiet)
    if json_path:
        atomic_write(json_path, json.dumps({"questions": out}, indent=2) + "\n", "--json")


def _plots_folder(path: str) -> None:
    """Create the --plots folder (and missing parents) and check it can be written, or a UserError says why."""
    p = Path(path)
    try:
        p.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise UserError(f"--plots {path} is a file, not a folder: give a folder for the plots") from None
    except OSError as e:
        raise UserError(
            f"--plots {path}: cannot create the folder ({e.strerror or e}): choose another folder"
        ) from None
    if not p.is_dir():
        raise UserError(f"--plots {path} is a file, not a folder: give a folder for the plots")
    if not os.access(p, os.W_OK | os.X_OK):
        raise UserError(f"--plots {path}: the folder is not writable: choose another folder, or fix its permissions")
