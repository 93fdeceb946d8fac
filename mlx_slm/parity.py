"""Proving the fast path gives Transformers' answers.

Two separate questions, reported separately:

(a) Forward exactness: our MLX path (batched, padded, prefix-cached) against
    Transformers holding the very same weight values (the converted directory,
    upcast to float32). Any label disagreement, or a logit difference past the
    tolerance for the compute dtype, is a failure.
(b) Conversion drift: Transformers on the original source against Transformers on
    the converted weights. float16 cannot hold every dequantized GGUF value, so a
    small drift is expected; it is reported, and fails only when asked (`strict`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import numpy as np

from .errors import UserError
from .labels import softmax

# Max |delta logit| allowed in (a), by compute dtype. float16's is from measurement (README).
TOLERANCE = {"float32": 1e-3, "bfloat16": 0.5, "float16": 0.1}


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
    labels_a: Sequence[str], labels_b: Sequence[str], logits_a: Sequence[np.ndarray], logits_b: Sequence[np.ndarray],
    probs_a: Sequence[np.ndarray], probs_b: Sequence[np.ndarray], label_rows: Sequence[int],
) -> Comparison:
    dis = [i for i, (x, y) in enumerate(zip(labels_a, labels_b)) if x != y]
    rows = list(label_rows)
    dl = max(float(np.abs(a[rows] - b[rows]).max()) for a, b in zip(logits_a, logits_b))
    dv = max(float(np.abs(a - b).max()) for a, b in zip(logits_a, logits_b))
    dp = max(float(np.abs(np.asarray(a) - np.asarray(b)).max()) for a, b in zip(probs_a, probs_b))
    return Comparison(len(labels_a) - len(dis), len(labels_a), dl, dv, dp, dis)


def run_parity(
    model: str,
    reference: str,
    texts: Sequence[str],
    labels: Sequence[str],
    system: str | None,
    template: str,
    dtype: str | None = None,
    batch_size: int = 8,
    progress: Callable[[str], None] = lambda _m: None,
) -> dict[str, Any]:
    from .classifier import Classifier
    from .reference import score_in_child
    from .registry import resolve_model, resolve_source

    path = resolve_model(model)
    src = resolve_source(reference)
    progress(f"ours: MLX on {path}")
    clf = Classifier.load(str(path), labels, system, template, dtype=dtype, keep_logits=True, batch_size=batch_size)
    compute = {mx.float32: "float32", mx.float16: "float16", mx.bfloat16: "bfloat16"}[clf.model.head_weight().dtype]
    t0 = time.perf_counter()
    ours = clf.classify(texts)
    t_ours = time.perf_counter() - t0
    bad = [p for p in ours if not p.ok]
    if bad:
        raise UserError(f"item {bad[0].index}: {bad[0].error}")
    ids = [it.ids for it in clf.prepare(texts)]

    def run_ref(where: str) -> tuple[list[str], list[np.ndarray], list[np.ndarray], float]:
        progress(f"reference: Transformers float32, one at a time, on {where}")
        scores, logits, seconds = score_in_child(where, ids, clf.labelset)
        labs = [clf.labels[int(np.argmax(s))] for s in scores]
        return labs, list(logits), [softmax(s) for s in scores], seconds

    conv_l, conv_g, conv_p, t_conv = run_ref(str(path))
    orig_l, orig_g, orig_p, _ = run_ref(src)
    rows = clf.labelset.first_ids
    ours_p = [np.array([p.probs[lab] for lab in clf.labels]) for p in ours]
    a = compare([p.label for p in ours], conv_l, [p.logits for p in ours], conv_g, ours_p, conv_p, rows)
    b = compare(orig_l, conv_l, orig_g, conv_g, orig_p, conv_p, rows)
    tol = TOLERANCE[compute]
    return {
        "model": str(path),
        "reference": src,
        "n": len(texts),
        "labels": list(clf.labels),
        "scoring": clf.mode,
        "compute_dtype": compute,
        "tolerance": tol,
        "forward_exactness": a.as_dict(),
        "conversion_drift": b.as_dict(),
        "forward_ok": a.agree == a.total and a.max_dlogit_vocab <= tol,
        "drift_ok": b.agree == b.total,
        "seconds": {"ours": round(t_ours, 2), "reference": round(t_conv, 2)},
    }


def format_report(r: dict[str, Any]) -> str:
    a, b = r["forward_exactness"], r["conversion_drift"]
    lines = [
        f"model      {r['model']}",
        f"reference  {r['reference']}",
        f"items {r['n']}, labels {', '.join(r['labels'])} ({r['scoring']} scoring), compute {r['compute_dtype']}",
        "",
        "(a) forward exactness: ours vs Transformers on the same weight values",
        f"    labels agree        {a['agree']}/{a['total']}",
        f"    max |d logit| labels {a['max_abs_dlogit_labels']:.3g}",
        f"    max |d logit| vocab  {a['max_abs_dlogit_vocab']:.3g}   (tolerance {r['tolerance']:g})",
        f"    max |d prob|         {a['max_abs_dprob']:.3g}",
        f"    -> {'PASS' if r['forward_ok'] else 'FAIL'}",
        "",
        "(b) conversion drift: Transformers on the source vs on the converted weights",
        f"    labels agree        {b['agree']}/{b['total']}",
        f"    max |d logit| labels {b['max_abs_dlogit_labels']:.3g}",
        f"    max |d logit| vocab  {b['max_abs_dlogit_vocab']:.3g}",
        f"    max |d prob|         {b['max_abs_dprob']:.3g}",
        "",
        f"time: ours {r['seconds']['ours']} s, reference {r['seconds']['reference']} s",
    ]
    return "\n".join(lines)
