"""Proving the fast path gives Transformers' answers.

Two separate questions, reported separately:

(a) Forward exactness: our MLX path (batched, padded, prefix-cached) against
    Transformers holding the very same weight values (the converted directory,
    upcast to float32). Any label disagreement, or a logit difference past the
    tolerance for the compute dtype, is a failure.
(b) Conversion drift: Transformers on the original source against Transformers on
    the converted weights. float16 cannot hold every dequantized GGUF value, so a
    small drift is expected; it is reported, and fails only when asked (`strict`).

An MLX-quantized model (mlx-lm's format) is checked the same way, with (a) against
Transformers holding the dequantized values (written to a temporary float32 directory:
Transformers cannot read mlx-lm's packing), and one more question:

(c) mlx-lm: our labels against those of mlx-lm's own forward on the same quantized
    directory (`mlx_lm.load`, one prompt at a time, full-vocabulary logits at the last
    position). Any label disagreement is a failure; the logit difference is reported.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np

from ..classifier.classifier import Classifier
from ..classifier.task import Task
from ..ground.errors import UserError
from ..models.quant import describe, quantization_of
from ..text.heads import Head, head_input
from ..text.labels import LabelSet, softmax
from ..text.prompts import render, tokenize
from ..weights.convert import dequantized_copy
from ..weights.registry import ModelRef
from ..weights.sources import local, materialise
from .reference import Reference, hidden_in_child, score_blocks_in_child, score_in_child

# Max |delta logit| allowed in (a), by compute dtype. float16's is from measurement (docs/parity.md).
TOLERANCE = {"float32": 1e-3, "bfloat16": 0.5, "float16": 0.1}


def _silent(_message: str) -> None:
    """The default progress: say nothing."""


@dataclass(frozen=True)
class Ours:
    """How our side of a parity report loads and runs, the same in every report that takes it:
    `model`, the `ModelRef` whose way of loading it takes (the compute dtype, None the model's
    default, and a quantized model's weights, as `Classifier.load`; the name it loads is the
    report's own: a converted folder, a task's model), `batch_size` and `progress`, which hears
    each step's line."""

    model: ModelRef = ModelRef()
    batch_size: int = 8
    progress: Callable[[str], None] = _silent

    @property
    def dtype(self) -> str | None:
        return self.model.dtype

    def on(self, name: str | Path) -> ModelRef:
        """`name` (a converted folder, a task's model) loaded as this side loads a model."""
        return replace(self.model, name=str(name))


@dataclass
class Comparison:
    agree: int
    total: int
    max_dlogit_labels: float
    max_dlogit_vocab: float
    max_dprob: float
    disagreements: list[int]

    def as_dict(self) -> dict[str, Any]:
        return {
            "agree": self.agree,
            "total": self.total,
            "max_abs_dlogit_labels": self.max_dlogit_labels,
            "max_abs_dlogit_vocab": self.max_dlogit_vocab,
            "max_abs_dprob": self.max_dprob,
            "disagreements": self.disagreements,
        }


def compare(
    labels_a: Sequence[str],
    labels_b: Sequence[str],
    logits_a: Sequence[np.ndarray],
    logits_b: Sequence[np.ndarray],
    probs_a: Sequence[np.ndarray],
    probs_b: Sequence[np.ndarray],
    label_rows: Sequence[int],
) -> Comparison:
    dis = [i for i, (x, y) in enumerate(zip(labels_a, labels_b)) if x != y]
    rows = list(label_rows)
    dl = max(float(np.abs(a[rows] - b[rows]).max()) for a, b in zip(logits_a, logits_b))
    dv = max(float(np.abs(a - b).max()) for a, b in zip(logits_a, logits_b))
    dp = max(float(np.abs(np.asarray(a) - np.asarray(b)).max()) for a, b in zip(probs_a, probs_b))
    return Comparison(len(labels_a) - len(dis), len(labels_a), dl, dv, dp, dis)


class MlxLmForward(Reference):
    """mlx-lm's own model on a directory (`mlx_lm.load`), scored as the Transformers reference is:
    one prompt at a time, full-vocabulary logits, label scores by `Reference.label_scores`.

    dtype: cast its floating-point tensors (scales and biases of the packed layers included)
    to this dtype first, as ours are: float16 to float32 is exact, and MLX's CPU runs
    float16 quantized matmuls far too slowly for a check (SmolLM2-135M: 37 s for 8 tokens)."""

    def __init__(self, path: str | Path, dtype: mx.Dtype | None = None):  # not super().__init__: Transformers
        from mlx_lm import load  # lazy: mlx-lm loads only here

        self.model, _ = load(str(path))
        if dtype is not None:
            self.model.set_dtype(dtype)

    def logits(self, ids: Sequence[int], last_only: bool = False) -> np.ndarray:
        out = self.model(mx.array([[int(t) for t in ids]]))[0]
        return np.array((out[-1:] if last_only else out).astype(mx.float32))


def mlxlm_scores(
    path: str | Path, prompts: Sequence[Sequence[int]], labelset: LabelSet, dtype: mx.Dtype | None = None
) -> tuple[np.ndarray, np.ndarray, float]:
    """(label scores (n, k), last logits (n, V), seconds) of mlx-lm's forward on `path`."""
    ref = MlxLmForward(path, dtype)
    t = time.perf_counter()
    scores, logits = zip(*(ref.label_scores(p, labelset) for p in prompts))
    return np.array(scores), np.array(logits), time.perf_counter() - t


def is_quantized_dir(model: str) -> bool:
    """Whether `model` is a directory whose config.json carries an MLX quantization entry."""

    cfg = Path(model).expanduser() / "config.json"
    try:
        return quantization_of(json.loads(cfg.read_text())) is not None
    except (OSError, ValueError):
        return False


def default_reference(model: str) -> str | None:
    """The source a converted quantized directory was made from, if it is still there."""
    rec = Path(model).expanduser() / "conversion.json"
    try:
        src = json.loads(rec.read_text()).get("source_path")
    except (OSError, ValueError):
        return None
    return src if src and Path(src).exists() else None


def run_parity(
    model: str,
    reference: str | None,
    texts: Sequence[str],
    labels: Sequence[str],
    system: str | None,
    template: str,
    ours: Ours = Ours(),
) -> dict[str, Any]:
    """reference: the original checkpoint for (b); None skips (b) (allowed for a quantized model).
    ours: how our side loads and runs (`Ours`)."""
    progress = ours.progress

    path = materialise(model)
    q = quantization_of(json.loads((path / "config.json").read_text()))
    if reference is None and q is None:
        raise UserError("a reference checkpoint is needed for a model that is not quantized")
    src = str(local(reference).path) if reference is not None else None
    progress(f"ours: MLX on {path}")
    clf = Classifier.load(ours.on(path), labels, system, template, keep_logits=True, batch_size=ours.batch_size)
    compute = {mx.float32: "float32", mx.float16: "float16", mx.bfloat16: "bfloat16"}[clf.model.compute_dtype]
    mine, ids, t_ours = _ours_scored(clf, texts)
    conv, t_conv = _reference_on_same_values(clf, ids, path, q is not None, progress)
    rows = clf.labelset.first_ids
    a = _pairwise(mine, conv, rows)
    b = None if src is None else _pairwise(_reference_scores(clf, ids, src, progress), conv, rows)
    c, t_mlxlm = None, None
    if q is not None:
        c, t_mlxlm = _mlxlm_agreement(clf, ids, path, mine, compute, progress)
    tol = TOLERANCE[compute]
    return {
        "model": str(path),
        "reference": src,
        "n": len(texts),
        "labels": list(clf.labels),
        "scoring": clf.mode,
        "compute_dtype": compute,
        "quantization": None if q is None else describe(q),
        "kept_quantized": clf.model.quantized is not None,
        "tolerance": tol,
        "forward_exactness": a.as_dict(),
        "conversion_drift": None if b is None else b.as_dict(),
        "mlxlm": None if c is None else c.as_dict(),
        "forward_ok": a.agree == a.total and a.max_dlogit_vocab <= tol,
        "drift_ok": b is None or b.agree == b.total,
        "mlxlm_ok": c is None or c.agree == c.total,
        "seconds": {
            "ours": round(t_ours, 2),
            "reference": round(t_conv, 2),
            **({} if t_mlxlm is None else {"mlxlm": round(t_mlxlm, 2)}),
        },
    }


# A run's (labels, last-position logits, label probabilities), one entry per text.
Scored = tuple[list[str], list[np.ndarray], list[np.ndarray]]


def _pairwise(x: Scored, y: Scored, rows: Sequence[int]) -> Comparison:
    return compare(x[0], y[0], x[1], y[1], x[2], y[2], rows)


def _ours_scored(clf: Any, texts: Sequence[str]) -> tuple[Scored, list[list[int]], float]:
    """Our run of the texts (a text that cannot run is a `UserError`), their token ids and the seconds."""
    t0 = time.perf_counter()
    ours = clf.classify(texts)
    t_ours = time.perf_counter() - t0
    bad = [p for p in ours if not p.ok]
    if bad:
        raise UserError(f"item {bad[0].index}: {bad[0].error}")
    ids = [it.ids for it in clf.prepare(texts)]
    mine = (
        [p.label for p in ours],
        [p.logits for p in ours],
        [np.array([p.probs[lab] for lab in clf.labels]) for p in ours],
    )
    return mine, ids, t_ours


def _reference_scores(clf: Any, ids: list[list[int]], where: str, progress: Callable[[str], None]) -> Scored:
    """Transformers in float32 on `where`, one prompt at a time (in a child process)."""
    return _reference_timed(clf, ids, where, progress)[0]


def _reference_timed(
    clf: Any, ids: list[list[int]], where: str, progress: Callable[[str], None]
) -> tuple[Scored, float]:

    progress(f"reference: Transformers float32, one at a time, on {where}")
    scores, logits, seconds = score_in_child(where, ids, clf.labelset)
    labs = [clf.labels[int(np.argmax(s))] for s in scores]
    return (labs, list(logits), [softmax(s) for s in scores]), seconds


def _reference_on_same_values(
    clf: Any, ids: list[list[int]], path: Path, quantized: bool, progress: Callable[[str], None]
) -> tuple[Scored, float]:
    """(a)'s reference: Transformers on the very weight values we run (a quantized model's
    dequantized into a temporary directory, removed after)."""

    with tempfile.TemporaryDirectory() as tmp:
        return _reference_timed(clf, ids, _same_values(path, quantized, tmp, progress), progress)


def _same_values(path: Path, quantized: bool, tmp: str, progress: Callable[[str], None]) -> str:
    """The directory Transformers reads for (a): ours, or a quantized model's values dequantized
    into `tmp` (Transformers cannot read mlx-lm's packing: the same values, unpacked)."""

    if not quantized:
        return str(path)
    progress("reference weights: the quantized values, dequantized to float32")
    return str(dequantized_copy(path, Path(tmp) / "dequantized"))


def _mlxlm_agreement(
    clf: Any, ids: list[list[int]], path: Path, mine: Scored, compute: str, progress: Callable[[str], None]
) -> tuple[Comparison, float]:
    """(c): our labels and logits against mlx-lm's own forward on the quantized directory."""
    progress(f"mlx-lm: its own forward on {path}, {compute}, one at a time")
    scores, logits, t_mlxlm = mlxlm_scores(path, ids, clf.labelset, clf.model.compute_dtype)
    theirs = ([clf.labels[int(np.argmax(s))] for s in scores], list(logits), [softmax(s) for s in scores])
    c = _pairwise(mine, theirs, clf.labelset.first_ids)
    return c, t_mlxlm


def run_question_parity(
    model: str,
    reference: str | None,
    texts: Sequence[str],
    questions: Sequence[Any],
    system: str | None,
    template: str,
    ours: Ours = Ours(),
) -> dict[str, Any]:
    """Several questions per text: our one-pass answers against Transformers scoring every
    question's full prompt afresh, one at a time, on the same weights (and on `reference`,
    the original checkpoint, when given: conversion drift). Per question: labels equal and
    the largest difference of its answer's probabilities. Only `ours.dtype` is read: a
    quantized model loads as `Classifier.load` decides."""

    progress = ours.progress
    path = materialise(model)
    progress(f"ours: MLX on {path}, {len(questions)} question(s) in one pass")
    clf = Classifier.load(
        str(path), system=system, template=template, dtype=ours.dtype, questions=questions, batch_size=ours.batch_size
    )
    plan = clf.kind.plan
    assert plan is not None
    compute = {mx.float32: "float32", mx.float16: "float16", mx.bfloat16: "bfloat16"}[clf.model.compute_dtype]
    t0 = time.perf_counter()
    answered = clf.classify(texts)
    t_ours = time.perf_counter() - t0
    bad = [p for p in answered if not p.ok]
    if bad:
        raise UserError(f"item {bad[0].index}: {bad[0].error}")
    tok = clf.engine.tokenizer
    blocks = [(tokenize(tok, [render(tok, b.fmt, t) for t in texts]), b.options) for b in plan.blocks]
    of_question: list[list[int]] = [[] for _ in plan.questions]  # each question's blocks, in order
    for i, b in enumerate(plan.blocks):
        of_question[b.question].append(i)

    def compare_with(where: str) -> tuple[dict[str, Any], float]:
        progress(f"reference: Transformers float32, every question's prompt alone, on {where}")
        scores, seconds = score_blocks_in_child(where, blocks)
        out = {}
        for qi, q in enumerate(plan.questions):
            mine = of_question[qi]
            agree, dprob = 0, 0.0
            for r, p in enumerate(answered):
                want = q.answer([scores[i][r] for i in mine])
                got = p.answers[q.name]
                agree += want.get("label") == got.get("label") and want.get("labels") == got.get("labels")
                dprob = max(dprob, max(abs(want["probs"][k] - got["probs"][k]) for k in want["probs"]))
            out[q.name] = {"kind": q.type.name, "agree": agree, "total": len(texts), "max_abs_dprob": dprob}
        return out, seconds

    a, t_ref = compare_with(str(path))
    b = compare_with(str(local(reference).path))[0] if reference is not None else None
    tol = PROB_TOLERANCE[compute]
    return {
        "model": str(path),
        "reference": reference,
        "n": len(texts),
        "questions": [q.to_dict() for q in plan.questions],
        "compute_dtype": compute,
        "tolerance_prob": tol,
        "forward_exactness": a,
        "conversion_drift": b,
        "forward_ok": all(x["agree"] == x["total"] and x["max_abs_dprob"] <= tol for x in a.values()),
        "drift_ok": b is None or all(x["agree"] == x["total"] for x in b.values()),
        "seconds": {"ours": round(t_ours, 2), "reference": round(t_ref, 2)},
    }


def format_question_report(r: dict[str, Any]) -> str:
    lines = [
        f"parity, {len(r['questions'])} question(s) in one pass: {r['model']} ({r['compute_dtype']}), {r['n']} texts",
        f"(a) forward exactness: ours vs Transformers float32 on every question's full prompt "
        f"(probabilities within {r['tolerance_prob']})",
    ]
    for name, x in r["forward_exactness"].items():
        lines.append(
            f"    {name:<16} {x['kind']:<7} labels {x['agree']}/{x['total']}  max |dprob| {x['max_abs_dprob']:.2e}"
        )
    if r["conversion_drift"] is not None:
        lines.append(f"(b) conversion drift: ours vs Transformers on {r['reference']}")
        for name, x in r["conversion_drift"].items():
            lines.append(f"    {name:<16} labels {x['agree']}/{x['total']}  max |dprob| {x['max_abs_dprob']:.2e}")
    lines.append(
        f"forward {'OK' if r['forward_ok'] else 'FAILED'}; seconds: ours {r['seconds']['ours']}, "
        f"reference {r['seconds']['reference']}"
    )
    return "\n".join(lines)


# Max |delta prob| between our answers and Transformers', by compute dtype.
PROB_TOLERANCE = {"float32": 1e-3, "bfloat16": 5e-2, "float16": 2e-2}


# Max |delta hidden| / max |hidden| allowed for a head's features, by compute dtype.
FEATURE_TOLERANCE = {"float32": 1e-4, "bfloat16": 5e-2, "float16": 1e-2}


def run_head_parity(
    task: Any,
    texts: Sequence[str],
    ours: Ours = Ours(),
) -> dict[str, Any]:
    """A learned head's parity: our features at the head's layer(s) (batched, padded, after the
    prefix cache, the forward stopped there) against Transformers' `hidden_states[layer]` of
    each prompt alone on the same weight values, and the head's labels from both feature sets
    (and from `classify`). `task`: a task file or `Task` with a head; `ours`: how our side loads
    the task's model and runs."""

    t = task if isinstance(task, Task) else Task.load(task)
    head = t.head
    if not isinstance(head, Head):  # the argument's precondition: this report reads a head's parts
        raise UserError("the task has no learned head (train one: mlx-slm train DATA --save-task TASK)")
    progress = ours.progress
    progress(f"ours: MLX, {t.model}, the head's layer(s) {list(head.layers)}")
    clf = Classifier.from_task(t, batch_size=ours.batch_size, **ours.model.options())
    path = clf.path
    if path is None:
        raise UserError(f"{t.model} has no converted directory to give Transformers")
    q = quantization_of(json.loads((Path(path) / "config.json").read_text()))
    compute = {mx.float32: "float32", mx.float16: "float16", mx.bfloat16: "bfloat16"}[clf.model.compute_dtype]
    t0 = time.perf_counter()
    preds = clf.classify(texts)
    t_ours = time.perf_counter() - t0
    bad = [p for p in preds if not p.ok]
    if bad:
        raise UserError(f"item {bad[0].index}: {bad[0].error}")
    layers = sorted(set(head.layers))
    feats = head_input(clf.features(texts, layers, poolings=sorted(set(head.poolings)))[0], layers, head)
    ids = [it.ids for it in clf.prepare(texts)]
    with tempfile.TemporaryDirectory() as tmp:
        same = _same_values(path, q is not None, tmp, progress)
        progress(
            f"reference: Transformers float32, one at a time, the head's parts ({head.name}) of hidden_states on {same}"
        )
        ref, t_ref = hidden_in_child(same, ids, head.layers, head.poolings, clf.kind.pool_from)
    d = np.abs(feats.astype(np.float64) - ref)
    rel = float(max(d[i].max() / max(np.abs(ref[i]).max(), 1e-12) for i in range(len(texts))))
    lp_ours, lp_ref = head.log_probs(feats), head.log_probs(ref)
    ours_l = [head.labels[i] for i in lp_ours.argmax(1)]
    ref_l = [head.labels[i] for i in lp_ref.argmax(1)]
    clf_l = [p.label for p in preds]
    dis = [i for i, (a, b) in enumerate(zip(ours_l, ref_l)) if a != b]
    tol = FEATURE_TOLERANCE[compute]
    return {
        "model": str(path),
        "task": {
            "layers": list(head.layers),
            "poolings": list(head.poolings),
            "labels": len(head.labels),
            "head_sha256": head.sha256,
        },
        "n": len(texts),
        "scoring": "head",
        "compute_dtype": compute,
        "quantization": None if q is None else describe(q),
        "tolerance_rel": tol,
        "features": {"max_abs_diff": float(d.max()), "max_rel_diff": rel},
        "labels": {"agree": len(texts) - len(dis), "total": len(texts), "disagreements": dis},
        "classify_matches_features": clf_l == ours_l,
        "max_abs_dprob": float(np.abs(np.exp(lp_ours) - np.exp(lp_ref)).max()),
        "forward_ok": rel <= tol and not dis and clf_l == ours_l,
        "seconds": {"ours": round(t_ours, 2), "reference": round(t_ref, 2)},
    }


def format_head_report(r: dict[str, Any]) -> str:
    f, lab = r["features"], r["labels"]
    return "\n".join(
        [
            f"model      {r['model']}",
            f"head       layer(s) {', '.join(map(str, r['task']['layers']))}, {r['task']['labels']} labels, "
            f"sha256 {r['task']['head_sha256'][:12]}...",
            f"items {r['n']}, compute {r['compute_dtype']}"
            + (f"; weights {r['quantization']}" if r.get("quantization") else ""),
            "",
            "(a) features: ours (batched, prefix-cached, stopped at the head's layer) vs Transformers' "
            "hidden_states[layer], each prompt alone, same weight values",
            f"    max |d feature|          {f['max_abs_diff']:.3g}",
            f"    max |d| / max |feature|  {f['max_rel_diff']:.3g}   (tolerance {r['tolerance_rel']:g})",
            "(b) the head's labels from our features vs from Transformers' features",
            f"    labels agree        {lab['agree']}/{lab['total']}",
            f"    max |d prob|        {r['max_abs_dprob']:.3g}",
            f"    classify's labels equal the labels from our features: {r['classify_matches_features']}",
            f"    -> {'PASS' if r['forward_ok'] else 'FAIL'}",
            "",
            f"time: ours {r['seconds']['ours']} s, reference {r['seconds']['reference']} s",
        ]
    )


def _label_list(labels: Sequence[str], show: int = 8) -> str:
    if len(labels) <= show:
        return ", ".join(labels)
    return f"{len(labels)} ({', '.join(labels[:show])}, ...)"


def format_report(r: dict[str, Any]) -> str:
    a, b, c = r["forward_exactness"], r["conversion_drift"], r.get("mlxlm")
    q = r.get("quantization")
    weights = "" if not q else f"; weights {q}, {'kept quantized' if r['kept_quantized'] else 'dequantized at load'}"
    lines = [
        f"model      {r['model']}",
        f"reference  {r['reference']}",
        f"items {r['n']}, labels {_label_list(r['labels'])} ({r['scoring']} scoring), "
        f"compute {r['compute_dtype']}{weights}",
        "",
        "(a) forward exactness: ours vs Transformers on the same weight values"
        + (" (dequantized, float32)" if q else ""),
        f"    labels agree        {a['agree']}/{a['total']}",
        f"    max |d logit| labels {a['max_abs_dlogit_labels']:.3g}",
        f"    max |d logit| vocab  {a['max_abs_dlogit_vocab']:.3g}   (tolerance {r['tolerance']:g})",
        f"    max |d prob|         {a['max_abs_dprob']:.3g}",
        f"    -> {'PASS' if r['forward_ok'] else 'FAIL'}",
        "",
    ]
    if b is None:
        lines += ["(b) conversion drift: skipped (no --reference)"]
    else:
        lines += [
            "(b) conversion drift: Transformers on the source vs on the converted weights",
            f"    labels agree        {b['agree']}/{b['total']}",
            f"    max |d logit| labels {b['max_abs_dlogit_labels']:.3g}",
            f"    max |d logit| vocab  {b['max_abs_dlogit_vocab']:.3g}",
            f"    max |d prob|         {b['max_abs_dprob']:.3g}",
        ]
    if c is not None:
        lines += [
            "",
            "(c) mlx-lm: ours vs mlx-lm's own forward on the same quantized directory",
            f"    labels agree        {c['agree']}/{c['total']}",
            f"    max |d logit| labels {c['max_abs_dlogit_labels']:.3g}",
            f"    max |d logit| vocab  {c['max_abs_dlogit_vocab']:.3g}",
            f"    -> {'PASS' if r['mlxlm_ok'] else 'FAIL'}",
        ]
    sec = r["seconds"]
    lines += [
        "",
        f"time: ours {sec['ours']} s, reference {sec['reference']} s"
        + (f", mlx-lm {sec['mlxlm']} s" if "mlxlm" in sec else ""),
    ]
    return "\n".join(lines)
