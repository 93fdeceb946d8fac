"""Evaluation against gold labels: accuracy, per-label P/R/F1, confusion, calibration, coverage.

Pure numpy functions on label indices: gold (n,) in [0, k), predicted (n,) in [-1, k)
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

import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .errors import UserError

DEFAULT_BINS = 15
DEFAULT_POINTS = (1.0, 0.9, 0.8, 0.7, 0.6, 0.5)


class EvaluationError(UserError, ValueError):
    """Inconsistent evaluation input (the message says what to fix)."""


# ---------------------------------------------------------------------------- reading predictions
def check_predictions_source(path: str, input_path: str) -> None:
    """Refuse predictions whose manifest (`<path>.mlx-slm.json`, when there is one) says they
    were made from other input content than `input_path`, or by a run that did not finish.
    Ids alone cannot tell: line numbers are the same in any input of that length."""
    from .output import input_changed, input_sha256, manifest_path, read_manifest

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
    if not isinstance(settings.get("input_sha256"), str):
        return  # its input was not hashed (standard input, a pipe, an older mlx-slm)
    sha, _ = input_sha256(input_path)
    size = os.stat(input_path).st_size if sha is not None else None
    changed = input_changed(input_path, settings, (sha, size))
    if changed and sha is not None:
        made_from = settings.get("input", "?")
        raise EvaluationError(
            f"{where} is not the output for this input: it was made from other content than {input_path} "
            f"(its manifest records {made_from} with sha256 {settings['input_sha256'][:12]}...; {input_path} has {sha[:12]}...): "
            f"classify {input_path} again (mlx-slm classify {input_path} -o {path}), or evaluate the input "
            "those predictions were made from"
        )


def read_predictions(
    path: str, rows: Sequence[Any], input_path: str | None = None, question: str | None = None
) -> list[dict[str, Any]]:
    """A classify output (JSONL, CSV, TSV or Parquet, by its extension) read back row by row
    (`output.read_records`) and checked against the input's rows (`io.Row`: row i of the
    output is input row i, same id).

    Each row becomes {"id", "label", "probs", "error"}. Every problem (the file cannot be
    read, a byte that is not UTF-8, a row that is not a JSON object, a label that is not a
    string, a probability that is not a number from 0 to 1, a row count or an id that does
    not match the input) is an `EvaluationError` naming the file, the row and the fix.
    With `input_path` (the file the rows were read from), the predictions' manifest is
    checked first (`check_predictions_source`)."""
    from .output import RecordError, output_format, read_records, same_id

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
    try:
        for rec in read_records(path, fmt, data, lenient=True):
            n = rec.line
            if rec.kind == "utf8":
                raise EvaluationError(f"{where}: line {n}: {rec.problem}: save it as UTF-8")
            if rec.kind == "fields":
                raise EvaluationError(f"{where}: line {n} has more fields than the header: check its commas and quotes")
            if rec.kind == "object":
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
                continue
            r = rec.fields
            if fmt == "jsonl":
                if question is not None:  # one question's answer of a --questions output
                    a = _answer(r, question, where, n)
                    out.append(_prediction(r.get("id"), a.get("label"), a.get("probs"), r.get("error"), where, n))
                    continue
                out.append(_prediction(r.get("id"), r.get("label"), r.get("probs"), r.get("error"), where, n))
                continue
            probs: dict[str, Any] = {}
            col, pre = (question, f"{question}.p_") if question is not None else ("label", "p_")
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


def _answer(r: dict[str, Any], question: str, where: str, n: int) -> dict[str, Any]:
    """Question `question`'s answer in a JSONL row of a --questions output ({} for an error row)."""
    if r.get("error") is not None:
        return {}
    answers = r.get("answers")
    if not isinstance(answers, dict) or not isinstance(answers.get(question), dict):
        raise EvaluationError(
            f"{where}: line {n} has no answer to question {question!r}: give the output of "
            "mlx-slm classify --questions with that question"
        )
    return answers[question]


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
    return {"id": rid, "label": label, "probs": {k: float(v) for k, v in probs.items()}, "error": error}


# ---------------------------------------------------------------------------- checks
def _ints(x: Any, name: str) -> np.ndarray:
    a = np.asarray(x)
    if a.ndim != 1:
        raise EvaluationError(f"{name} must be a 1-D array, got shape {a.shape}")
    if a.size == 0:
        return a.astype(np.int64)
    if a.dtype.kind not in "iu":
        if a.dtype.kind == "f" and np.all(np.isfinite(a)) and np.all(a == np.round(a)):
            return a.astype(np.int64)
        raise EvaluationError(f"{name} must hold integer label indices, got dtype {a.dtype}")
    return a.astype(np.int64)


def _pair(gold: Any, pred: Any, k: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    g, p = _ints(gold, "gold"), _ints(pred, "pred")
    if g.shape != p.shape:
        raise EvaluationError(f"gold has {g.size} items but pred has {p.size}")
    if k is not None:
        if g.size and (g.min() < 0 or g.max() >= k):
            raise EvaluationError(f"gold indices must lie in [0, {k}), got {g.min()}..{g.max()}")
        if p.size and (p.min() < -1 or p.max() >= k):
            raise EvaluationError(f"pred indices must lie in [0, {k}) or be -1 (abstained), got {p.min()}..{p.max()}")
    return g, p


def _conf_correct(confidence: Any, correct: Any) -> tuple[np.ndarray, np.ndarray]:
    c = np.asarray(confidence, dtype=np.float64)
    ok = np.asarray(correct, dtype=bool)
    if c.ndim != 1 or ok.shape != c.shape:
        raise EvaluationError(f"confidence and correct must be 1-D of equal length, got {c.shape} and {ok.shape}")
    if c.size and (not np.all(np.isfinite(c)) or c.min() < 0 or c.max() > 1):
        raise EvaluationError("confidences must be finite probabilities in [0, 1]")
    return c, ok


# ---------------------------------------------------------------------------- counts
def confusion(gold: Any, pred: Any, k: int) -> np.ndarray:
    """(k, k) counts, rows gold, columns predicted; abstained items (pred -1) are left out."""
    g, p = _pair(gold, pred, k)
    keep = p >= 0
    return np.bincount(g[keep] * k + p[keep], minlength=k * k).reshape(k, k).astype(np.int64)


def per_label(conf: np.ndarray, labels: Sequence[str], support: Any = None) -> dict[str, dict[str, float]]:
    """Precision, recall, F1 and support per label; 0 where a ratio is undefined.

    `support` (gold items per label) defaults to the confusion row sums; pass the full
    counts to make recall count abstained items as misses (as `report` does).
    """
    conf = np.asarray(conf)
    k = len(labels)
    if conf.shape != (k, k):
        raise EvaluationError(f"confusion must be ({k}, {k}) for {k} labels, got {conf.shape}")
    tp = np.diag(conf).astype(np.float64)
    predicted = conf.sum(axis=0).astype(np.float64)
    sup = conf.sum(axis=1) if support is None else np.asarray(support)
    if sup.shape != (k,) or np.any(sup < conf.sum(axis=1)):
        raise EvaluationError("support must give, per label, at least the gold items in the confusion matrix")
    out = {}
    for i, lab in enumerate(labels):
        prec = tp[i] / predicted[i] if predicted[i] else 0.0
        rec = tp[i] / sup[i] if sup[i] else 0.0
        f1 = 2 * prec * rec / (prec + rec) if prec + rec else 0.0
        out[lab] = {"precision": float(prec), "recall": float(rec), "f1": float(f1), "support": int(sup[i])}
    return out


def macro_f1(conf: np.ndarray, support: Any = None) -> float:
    """Unweighted mean F1 over the labels that occur as gold or as a prediction.

    Labels absent from both are left out (as scikit-learn does by default), so an
    evaluation set without some label is not charged a 0 for it.
    """
    conf = np.asarray(conf)
    k = conf.shape[0]
    per = per_label(conf, [str(i) for i in range(k)], support)
    sup = conf.sum(axis=1) if support is None else np.asarray(support)
    present = [i for i in range(k) if sup[i] > 0 or conf[:, i].sum() > 0]
    if not present:
        return 0.0
    return float(np.mean([per[str(i)]["f1"] for i in present]))


def accuracy(gold: Any, pred: Any) -> float:
    """Fraction of items with pred == gold; abstained (-1) items count as wrong. 0 if empty."""
    g, p = _pair(gold, pred)
    return float(np.mean(g == p)) if g.size else 0.0


# ---------------------------------------------------------------------------- calibration
def _edges(bins: int) -> np.ndarray:
    return np.arange(bins + 1) / bins  # i / bins: the same doubles as the literals (0.7, not 0.7000000000000001)


def _bin_index(c: np.ndarray, bins: int) -> np.ndarray:
    """Equal-width bins, right-closed: bin i holds (i/bins, (i+1)/bins]; 0 goes to bin 0."""
    return np.clip(np.searchsorted(_edges(bins), c, side="left") - 1, 0, bins - 1)


def reliability(confidence: Any, correct: Any, bins: int = DEFAULT_BINS) -> list[dict[str, Any]]:
    """Per equal-width bin: {lo, hi, confidence (mean), accuracy, count}; None when empty."""
    if bins < 1:
        raise EvaluationError(f"bins must be >= 1, got {bins}")
    c, ok = _conf_correct(confidence, correct)
    idx = _bin_index(c, bins)
    edges = _edges(bins)
    out = []
    for b in range(bins):
        m = idx == b
        cnt = int(m.sum())
        out.append(
            {
                "lo": float(edges[b]),
                "hi": float(edges[b + 1]),
                "confidence": float(c[m].mean()) if cnt else None,
                "accuracy": float(ok[m].mean()) if cnt else None,
                "count": cnt,
            }
        )
    return out


def ece(confidence: Any, correct: Any, bins: int = DEFAULT_BINS) -> float:
    """Expected calibration error: sum over bins of (bin share) * |accuracy - mean confidence|."""
    c, _ = _conf_correct(confidence, correct)
    if c.size == 0:
        return 0.0
    total = 0.0
    for r in reliability(confidence, correct, bins):
        if r["count"]:
            total += r["count"] / c.size * abs(r["accuracy"] - r["confidence"])
    return float(total)


def coverage_curve(confidence: Any, correct: Any, points: Sequence[float] = DEFAULT_POINTS) -> list[dict[str, Any]]:
    """Accuracy when answering only the most confident fraction of items.

    For each target coverage c the threshold is the confidence of the ceil(c * n)-th most
    confident item and every item with confidence >= threshold is kept (ties are kept
    together, so `coverage` is the fraction actually kept and may exceed `target`).
    Rows: {target, coverage, accuracy, threshold, n}. Thresholds fall as coverage grows.
    """
    c, ok = _conf_correct(confidence, correct)
    if c.size == 0:
        return []
    srt = np.sort(c)[::-1]
    out = []
    for target in points:
        if not 0 < target <= 1:
            raise EvaluationError(f"coverage points must be in (0, 1], got {target}")
        m = max(1, math.ceil(target * c.size - 1e-9))
        thr = float(srt[m - 1])
        keep = c >= thr
        out.append(
            {
                "target": float(target),
                "coverage": float(keep.mean()),
                "accuracy": float(ok[keep].mean()),
                "threshold": thr,
                "n": int(keep.sum()),
            }
        )
    return out


def threshold_for_accuracy(confidence: Any, correct: Any, target: float) -> float | None:
    """The smallest confidence threshold P such that items with confidence >= P are at
    least `target` accurate (so the largest coverage meeting the target), or None."""
    c, ok = _conf_correct(confidence, correct)
    if c.size == 0:
        return None
    order = np.argsort(-c, kind="stable")
    cs, oks = c[order], ok[order]
    hits = np.cumsum(oks)
    # evaluate only at the last index of each run of equal confidences (ties kept together)
    last = np.flatnonzero(np.append(cs[1:] != cs[:-1], True))
    acc = hits[last] / (last + 1)
    good = np.flatnonzero(acc >= target - 1e-12)
    if good.size == 0:
        return None
    return float(cs[last[good[-1]]])


# ---------------------------------------------------------------------------- report
def report(
    gold_labels: Sequence[str],
    pred_labels: Sequence[str | None],
    confidences: Sequence[float | None],
    labels: Sequence[str],
    bins: int = DEFAULT_BINS,
    points: Sequence[float] = DEFAULT_POINTS,
) -> dict[str, Any]:
    """Everything about one labelled run, JSON-safe.

    A prediction of None is an abstention (or a failed item). `accuracy`, `ece`,
    `reliability`, `confusion` and `coverage_curve` are over the answered items only;
    `coverage` = answered / n, `abstained` = n - answered, and `accuracy_all` counts
    abstentions as wrong. Per-label recall and support count every gold item, so an
    abstention is a miss there. Confidences of abstained items are ignored (may be None).
    """
    labels = list(labels)
    k = len(labels)
    if k < 1:
        raise EvaluationError("no labels given")
    if len(set(labels)) != k:
        raise EvaluationError(f"labels must be distinct, got {labels}")
    n = len(gold_labels)
    if len(pred_labels) != n or len(confidences) != n:
        raise EvaluationError(
            f"gold ({n}), predictions ({len(pred_labels)}) and confidences ({len(confidences)}) "
            "must have one entry per item"
        )
    pos = {lab: i for i, lab in enumerate(labels)}
    gold = np.empty(n, dtype=np.int64)
    pred = np.empty(n, dtype=np.int64)
    conf = np.zeros(n)
    for i, (g, p, c) in enumerate(zip(gold_labels, pred_labels, confidences)):
        if g not in pos:
            raise EvaluationError(f"gold label {g!r} of item {i} is not one of the labels {labels}")
        gold[i] = pos[g]
        if p is None:
            pred[i] = -1
            continue
        if p not in pos:
            raise EvaluationError(f"predicted label {p!r} of item {i} is not one of the labels {labels}")
        pred[i] = pos[p]
        if c is None or not (0 <= float(c) <= 1):
            raise EvaluationError(f"confidence of item {i} must be a probability in [0, 1], got {c!r}")
        conf[i] = float(c)
    answered = pred >= 0
    na = int(answered.sum())
    ok = gold[answered] == pred[answered]
    ca = conf[answered]
    cm = confusion(gold, pred, k)
    support = np.bincount(gold, minlength=k)
    per = per_label(cm, labels, support)
    return {
        "n": n,
        "labels": labels,
        "accuracy": float(ok.mean()) if na else 0.0,
        "accuracy_all": accuracy(gold, pred),
        "coverage": na / n if n else 0.0,
        "abstained": n - na,
        "macro_f1": macro_f1(cm, support),
        "per_label": per,
        "confusion": cm.tolist(),
        "ece": ece(ca, ok, bins),
        "reliability": reliability(ca, ok, bins),
        "coverage_curve": coverage_curve(ca, ok, points),
    }


def format_report(rep: dict[str, Any]) -> str:
    """A plain-text rendering of `report`: headline figures, per-label table, confusion, coverage."""
    labels = rep["labels"]
    lines = [
        f"items {rep['n']}  answered {rep['n'] - rep['abstained']} ({100 * rep['coverage']:.1f} %)"
        f"  abstained {rep['abstained']}",
        f"accuracy {100 * rep['accuracy']:.2f} % (answered)  {100 * rep['accuracy_all']:.2f} % (all, abstained wrong)",
        f"macro-F1 {rep['macro_f1']:.4f}  ECE {rep['ece']:.4f}",
        "",
    ]
    w = max(5, *(len(lab) for lab in labels))
    lines.append(f"{'label':<{w}}  {'precision':>9}  {'recall':>6}  {'f1':>6}  {'support':>7}")
    for lab in labels:
        r = rep["per_label"][lab]
        lines.append(f"{lab:<{w}}  {r['precision']:>9.3f}  {r['recall']:>6.3f}  {r['f1']:>6.3f}  {r['support']:>7d}")
    lines += ["", "confusion (rows gold, columns predicted; abstained left out)"]
    cm = rep["confusion"]
    cw = max(4, *(len(lab) for lab in labels), *(len(str(v)) for row in cm for v in row))
    lines.append(" " * (w + 2) + "  ".join(f"{lab:>{cw}}" for lab in labels))
    for lab, row in zip(labels, cm):
        lines.append(f"{lab:<{w}}  " + "  ".join(f"{v:>{cw}d}" for v in row))
    curve = rep.get("coverage_curve") or []
    if curve:
        lines += [
            "",
            "coverage (answer only the most confident)",
            f"{'target':>6}  {'kept':>6}  {'threshold':>9}  {'accuracy':>8}  {'n':>6}",
        ]
        for r in curve:
            lines.append(
                f"{100 * r['target']:>5.0f}%  {100 * r['coverage']:>5.1f}%  {r['threshold']:>9.4f}"
                f"  {100 * r['accuracy']:>7.2f}%  {r['n']:>6d}"
            )
    return "\n".join(lines) + "\n"


PLOT_FILES = ("confusion.png", "reliability.png")


def plot_paths(outdir: str | Path) -> list[Path]:
    """The files `plot` writes into `outdir` (checked before any work: `eval --plots`)."""
    return [Path(outdir) / name for name in PLOT_FILES]


def plot(rep: dict[str, Any], outdir: str | Path) -> list[Path]:
    """Write confusion.png and reliability.png (reliability diagram + accuracy/coverage) to outdir.

    Uses matplotlib's object API with the Agg canvas, so no display and no pyplot state.
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: F401
        from matplotlib.figure import Figure  # noqa: F401
    except ImportError:
        from .errors import MissingExtra

        raise MissingExtra("plots need matplotlib: pip install 'mlx-slm[bench]'") from None

    from .errors import OutputError
    from .safefs import refuse_symlink

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
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

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
    import io

    from .safefs import atomic_write

    buf = io.BytesIO()
    fig.savefig(buf, dpi=120, format="png")
    atomic_write(path, buf.getvalue(), "--plots")
