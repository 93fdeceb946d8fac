"""Evaluation against gold labels: accuracy, per-label P/R/F1, confusion, calibration, coverage.

The metrics (`metrics.py`, re-exported here) are pure numpy functions on label indices: gold (n,) in [0, k), predicted (n,) in [-1, k)
where -1 means the item was not answered (abstained, or it failed), and confidences (n,)
(the max calibrated probability of each answered item). `report` takes label names,
builds everything into one JSON-safe dict, `format_report` prints it and `plot` draws it
(matplotlib is needed only there).

Why the confidence figures: a classifier that may abstain is tuned by a confidence
threshold, and a threshold means something only if confidences are calibrated (ECE,
reliability) and if one can read off what each threshold buys (the coverage curve,
`threshold_for_accuracy`).
"""

from __future__ import annotations

import io
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..files.output import (
    RecordError,
    input_changed,
    input_sha256,
    manifest_path,
    output_format,
    read_manifest,
    read_records,
    same_id,
)
from ..ground.errors import MissingExtra, OutputError
from ..ground.safefs import atomic_write, refuse_symlink
from ..text.metrics import EvaluationError


# ---------------------------------------------------------------------------- what eval scores
def form_problem(form: str | None) -> str | None:
    """Why eval cannot score a run whose records have `form` (`records.FORMS`), or None: it
    scores one label per text against a gold label (a multi-label head's several labels, or a
    one-output head's score, would need other measures)."""
    if form in (None, "label"):
        return None
    what = {
        "multi": "a multi-label head: several labels a text, each at or above its threshold",
        "score": "a one-output head (a reranker, a reward model): a score, not a label",
    }.get(form, f"records of the form {form!r}")
    return (
        f"eval scores one label per text against its gold label; this model's is {what}: classify the file "
        "(mlx-slm classify -o out.jsonl) and measure its probabilities with your own metric"
    )


# ---------------------------------------------------------------------------- reading predictions
def check_predictions_source(path: str, input_path: str) -> None:
    """Refuse predictions whose manifest (`<path>.mlx-slm.json`, when there is one) says they
    were made from other input content than `input_path`, or by a run that did not finish.
    Ids alone cannot tell: line numbers are the same in any input of that length."""

    m = read_manifest(path)
    if m is None:
        return  # predictions made otherwise (by hand, by another tool): checked row by row only
    where = f"--predictions {path}"
    if not m.get("complete"):
        raise EvaluationError(
            f"{where} is unfinished ({manifest_path(path).name} says its run did not complete): "
            "finish it with mlx-slm classify ... --resume, then evaluate"
        )
    settings = m["settings"]
    why = form_problem(settings.get("form"))
    if why:
        raise EvaluationError(f"{where}: {why}")
    why = not_made_from(where, input_path, settings, f"mlx-slm classify {input_path} -o {path}")
    if why:
        raise EvaluationError(why)


def not_made_from(where: str, input_path: str, settings: dict[str, Any], again: str) -> str | None:
    """Why an output (its manifest's `settings`) is not the output of `input_path`'s content, with
    the fix (`again`: the command that makes it), or None; an input its run did not hash (standard
    input, a pipe, an older mlx-slm) cannot be checked."""
    if not isinstance(settings.get("input_sha256"), str):
        return None
    sha, _ = input_sha256(input_path)
    size = os.stat(input_path).st_size if sha is not None else None
    if sha is None or not input_changed(input_path, settings, (sha, size)):
        return None
    return (
        f"{where} is not the output for this input: it was made from other content than {input_path} (its "
        f"manifest records {settings.get('input', '?')} with sha256 {settings['input_sha256'][:12]}...; "
        f"{input_path} has {sha[:12]}...): run it again on {input_path} ({again}), or evaluate the input it was "
        "made from"
    )


def read_predictions(
    path: str, rows: Sequence[Any], input_path: str | None = None, question: str | None = None
) -> list[dict[str, Any]]:
    """A classify output (JSONL, CSV, TSV or Parquet, by its extension) read back row by row
    (`output.read_records`) and checked against the input's rows (`readers.Row`: row i of the
    output is input row i, same id).

    Each row becomes {"id", "label", "probs", "error"}. Every problem (the file cannot be
    read, a byte that is not UTF-8, a row that is not a JSON object, a label that is not a
    string, a probability that is not a number from 0 to 1, a row count or an id that does
    not match the input) is an `EvaluationError` naming the file, the row and the fix.
    With `input_path` (the file the rows were read from), the predictions' manifest is
    checked first (`check_predictions_source`)."""

    if input_path is not None:
        check_predictions_source(path, input_path)
    fmt = output_format(path)
    where = f"--predictions {path}"
    fix = "give the output of mlx-slm classify"
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        what = "is a folder, not a file" if isinstance(e, IsADirectoryError) else f"cannot be read ({e.strerror})"
        raise EvaluationError(f"{where} {what}: {fix}") from None
    out: list[dict[str, Any]] = []
    header: list[str] | None = None
    answers = _Answers() if question is None else _QuestionAnswers(question, f"{question}.p_", question)
    try:
        for rec in read_records(path, fmt, data, lenient=True):
            n = rec.line
            if rec.flaw == "utf8":
                raise EvaluationError(f"{where}: line {n}: {rec.problem}: save it as UTF-8")
            if rec.flaw == "fields":
                raise EvaluationError(f"{where}: line {n} has more fields than the header: check its commas and quotes")
            if rec.flaw == "object":
                raise EvaluationError(
                    f'{where}: line {n} is {rec.problem} like {{"id": ..., "label": ..., "probs": {{...}}}}: ' + fix
                )
            if rec.problem:
                raise EvaluationError(f"{where}: line {n} is not a JSON object ({rec.problem}): {fix}")
            if rec.row == 0:  # the CSV/TSV header
                header = rec.values
                if "id" not in header:
                    raise EvaluationError(
                        f"{where}: the header names no 'id' column (it has {header or 'nothing'}): {fix}"
                    )
                answers.check_form(header, where)
                continue
            r = rec.fields
            if fmt == "parquet" and rec.row == 1:
                answers.check_form(list(r), where)
            if fmt == "jsonl":
                if "error" not in r:
                    answers.check_form(list(r), where)
                a = answers.of(r, where, n)
                out.append(_prediction(r.get("id"), a.get("label"), a.get("probs"), r.get("error"), where, n))
                continue
            probs: dict[str, Any] = {}
            col, pre = answers.column, answers.prefix
            for k, v in r.items():
                if k and k.startswith(pre) and v not in ("", None):
                    try:
                        probs[k[len(pre) :]] = float(v)
                    except ValueError:
                        raise EvaluationError(
                            f"{where}: line {n}, column {k!r}: {v[:40]!r} is not a number: {fix}"
                        ) from None
            out.append(_prediction(r.get("id"), r.get(col) or None, probs, r.get("error") or None, where, n))
    except RecordError as e:
        what = f"line {e.line} is not valid CSV ({e.why}): check its quotes"
        raise EvaluationError(
            f"{where}: {what}" if fmt != "parquet" else f"{where} is not Parquet ({e.why}): {fix}"
        ) from None
    if fmt in ("csv", "tsv") and header is None:
        raise EvaluationError(f"{where}: the header names no 'id' column (it has nothing): {fix}")
    if len(out) != len(rows):
        raise EvaluationError(f"{where} has {len(out)} rows but the input has {len(rows)}: they must be row for row")
    for i, (p, row) in enumerate(zip(out, rows)):
        if not same_id(p["id"], row.id, fmt):
            raise EvaluationError(
                f"{where}: row {i + 1} has id {p['id']!r} where input line {row.line} has "
                f"{row.id!r}: it is not the output for this input"
            )
    return out


@dataclass(frozen=True)
class _Answers:
    """Where a classify output's rows hold their answer: one label a row (CSV/TSV/Parquet: the
    `label` column and `p_<label>` ones; JSONL: `label` and `probs`)."""

    column: str = "label"
    prefix: str = "p_"

    def check_form(self, fields: list[str], where: str) -> None:
        """Refuse the records of a multi-label (`labels`) or one-output (`score`) head, named by
        their fields, where a label per row is read (see `form_problem`)."""
        if "label" in fields and "score" not in fields:
            return
        form = "score" if "score" in fields else "multi" if "labels" in fields else None
        why = form_problem(form)
        if why:
            raise EvaluationError(f"{where}: {why}")

    def of(self, r: dict[str, Any], where: str, n: int) -> dict[str, Any]:
        """A JSONL row's answer: its `label` and `probs`."""
        return r


@dataclass(frozen=True)
class _QuestionAnswers(_Answers):
    """One question's answers of a --questions output (its own column and its per-label
    probability columns; in JSONL, `answers[NAME]`): its own columns, so no other form to refuse."""

    name: str = ""

    def check_form(self, fields: list[str], where: str) -> None:
        return None

    def of(self, r: dict[str, Any], where: str, n: int) -> dict[str, Any]:
        """The question's answer in a JSONL row ({} for an error row)."""
        if r.get("error") is not None:
            return {}
        answers = r.get("answers")
        if not isinstance(answers, dict) or not isinstance(answers.get(self.name), dict):
            raise EvaluationError(
                f"{where}: line {n} has no answer to question {self.name!r}: give the output of "
                "mlx-slm classify --questions with that question"
            )
        return answers[self.name]


def _prediction(rid: Any, label: Any, probs: Any, error: Any, where: str, n: int) -> dict[str, Any]:
    """One output row's fields, their types checked (n: its line, for messages)."""
    fix = "give the output of mlx-slm classify"
    if label is not None and not isinstance(label, str):
        raise EvaluationError(f"{where}: line {n}, field 'label': must be a string or null, got {label!r}: {fix}")
    if error is not None and not isinstance(error, str):
        raise EvaluationError(f"{where}: line {n}, field 'error': must be a string or null, got {error!r}: {fix}")
    if probs is None:
        probs = {}
    if not isinstance(probs, dict):
        raise EvaluationError(
            f"{where}: line {n}, field 'probs': must be an object of label: probability, got {type(probs).__name__}: {fix}"
        )
    for k, v in probs.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0.0 <= v <= 1.0:
            raise EvaluationError(
                f"{where}: line {n}, field 'probs', label {k!r}: {v!r} is not a probability (a number from 0 to 1): {fix}"
            )
    if label is not None and not probs and error is None:  # a confidence is what ECE and coverage read
        raise EvaluationError(
            f"{where}: line {n}: the label {label!r} comes without its probabilities (field 'probs', or the "
            f"p_<label> columns): {fix}"
        )
    return {"id": rid, "label": label, "probs": {k: float(v) for k, v in probs.items()}, "error": error}


PLOT_FILES = ("confusion.png", "reliability.png")


def plot_paths(outdir: str | Path) -> list[Path]:
    """The files `plot` writes into `outdir` (checked before any work: `eval --plots`)."""
    return [Path(outdir) / name for name in PLOT_FILES]


def plot(rep: dict[str, Any], outdir: str | Path) -> list[Path]:
    """Write confusion.png and reliability.png (reliability diagram + accuracy/coverage) to outdir.

    Uses matplotlib's object API with the Agg canvas, so no display and no pyplot state.
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: F401  # lazy: optional (bench extra), slow
        from matplotlib.figure import Figure  # noqa: F401  # lazy: as above
    except ImportError:
        raise MissingExtra("plots need matplotlib: pip install 'mlx-slm[bench]'") from None

    out = Path(outdir)
    refuse_symlink(out, "--plots")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OutputError(f"--plots {out}: cannot create the folder ({e.strerror})") from None
    p1, p2 = plot_paths(out)
    _save(_confusion_figure(rep), p1)
    _save(_reliability_figure(rep), p2)
    return [p1, p2]


def _figure(size: tuple[float, float]) -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # lazy: matplotlib is optional and slow
    from matplotlib.figure import Figure  # lazy: matplotlib is optional and slow

    fig = Figure(figsize=size)
    FigureCanvasAgg(fig)
    return fig


def _confusion_figure(rep: dict[str, Any]) -> Any:
    """The confusion matrix (rows gold, columns predicted), counts in the cells up to 30 labels."""
    labels = rep["labels"]
    k = len(labels)
    cm = np.asarray(rep["confusion"], dtype=np.int64).reshape(k, k)
    side = max(4.0, 0.6 * k + 2.5)
    fig = _figure((side + 1, side))
    ax = fig.add_subplot(1, 1, 1)
    im = ax.imshow(cm, cmap="Blues", vmin=0, vmax=max(1, int(cm.max())))
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    ax.set_xticks(range(k))
    ax.set_yticks(range(k))
    ax.set_xticklabels(labels, rotation=45, ha="right")
    ax.set_yticklabels(labels)
    ax.set_xlabel("predicted")
    ax.set_ylabel("gold")
    ax.set_title(f"confusion (n answered = {int(cm.sum())}, accuracy {100 * rep['accuracy']:.1f} %)")
    half = cm.max() / 2 if cm.size else 0
    if k <= 30:
        for i in range(k):
            for j in range(k):
                color = "white" if cm[i, j] > half else "black"
                ax.text(j, i, str(cm[i, j]), ha="center", va="center", fontsize=8, color=color)
    fig.tight_layout()
    return fig


def _reliability_figure(rep: dict[str, Any]) -> Any:
    """The reliability diagram beside accuracy and risk against coverage."""
    fig = _figure((11, 4.8))
    ax1, ax2 = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    rel = [r for r in rep["reliability"] if r["count"]]
    ax1.plot([0, 1], [0, 1], ls="--", color="gray", label="perfectly calibrated")
    if rel:
        width = rep["reliability"][0]["hi"] - rep["reliability"][0]["lo"]
        acc = [r["accuracy"] for r in rel]
        bar = {"width": width, "align": "edge", "edgecolor": "black", "alpha": 0.6, "label": "accuracy per bin"}
        ax1.bar([r["lo"] for r in rel], acc, **bar)
        ax1.plot([r["confidence"] for r in rel], acc, "o-", color="C3", label="mean confidence vs accuracy")
    ax1.set_xlim(0, 1)
    ax1.set_ylim(0, 1)
    ax1.set_xlabel("confidence")
    ax1.set_ylabel("accuracy")
    ax1.set_title(f"reliability (ECE {rep['ece']:.3f})")
    ax1.legend(loc="upper left", fontsize=8)
    curve = sorted(rep.get("coverage_curve") or [], key=lambda r: r["coverage"])
    if curve:
        cov = [r["coverage"] for r in curve]
        ax2.plot(cov, [r["accuracy"] for r in curve], "o-", label="accuracy")
        ax2.plot(cov, [1 - r["accuracy"] for r in curve], "s--", label="risk (1 - accuracy)")
        for r in curve:
            at = (r["coverage"], r["accuracy"])
            ax2.annotate(
                f"{r['threshold']:.2f}", at, textcoords="offset points", xytext=(0, 6), ha="center", fontsize=7
            )
    ax2.set_xlim(0, 1.02)
    ax2.set_ylim(0, 1.08)
    ax2.set_xlabel("coverage (fraction answered, most confident first)")
    ax2.set_title("accuracy / risk vs coverage (labels: thresholds)")
    ax2.legend(loc="lower left", fontsize=8)
    fig.tight_layout()
    return fig


def _save(fig: Any, path: Path) -> None:
    """A figure as PNG, through an exclusive temporary file and a rename (never through a link)."""
    buf = io.BytesIO()
    fig.savefig(buf, dpi=120, format="png")
    atomic_write(path, buf.getvalue(), "--plots")
