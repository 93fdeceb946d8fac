"""Parity of the classifiers people have trained: a sequence-classification checkpoint's head,
and a reranker's scores, against Transformers (`mlx-slm parity --model SEQCLS_DIR`, `--reranker`).

As `parity.py` does for label scoring, in two questions: (a) forward exactness, ours (batched,
padded, each query's tokens once) against Transformers in float32 holding the very same weight
values (a quantized model's dequantized), each item alone; (b) conversion drift, Transformers
on the original checkpoint against (a)'s, when one is given. A sequence classifier's reference
is `AutoModelForSequenceClassification` with the text-classification pipeline's own encoding
and probabilities (`reference.SeqClsReference`), so our encoding of a text or a pair is checked
too; a reranker's is each (query, document) scored alone (`reference.rerank_in_child`).
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np

from ..classifier.classifier import Classifier
from ..ground.errors import UserError
from ..kinds.base import split_pair
from ..kinds.rerank import rerank_order
from ..models.quant import describe, quantization_of
from ..weights.sources import local, materialise
from .labels import Ours, _label_list, _same_values
from .reference import rerank_in_child, seqcls_in_child

# Max |delta prob| of a sequence classifier's probabilities or a reranker's scores, by compute dtype.
SEQCLS_TOLERANCE = {"float32": 1e-4, "bfloat16": 5e-2, "float16": 1e-2}


def _loaded(
    model: str, ours: Ours, prompt: tuple[str | None, str] | None, **kind_options: Any
) -> tuple[Any, Path, Any]:
    """(our classifier on `model`'s converted directory, that directory, its quantization or None).
    `prompt`: (system, template) of a chat prompt, or None; `kind_options`: the kind's own
    keywords (`threshold`, `reranker`, `instruction`), passed to `Classifier.load` as given."""

    path = materialise(model)
    ours.progress(f"ours: MLX on {path}")
    chat = {} if prompt is None else {"system": prompt[0], "template": prompt[1]}
    clf = Classifier.load(ours.on(path), batch_size=ours.batch_size, **chat, **kind_options)
    return clf, path, quantization_of(json.loads((path / "config.json").read_text()))


def _ours(clf: Any, items: Sequence[Any]) -> tuple[list[Any], list[list[int]], Any]:
    """Our predictions of `items` (one that cannot run is a `UserError`), their token ids and the run's figures."""
    run = clf.run(items, window=max(1, len(items)))
    preds = list(run)
    bad = [p for p in preds if not p.ok]
    if bad:
        raise UserError(f"item {bad[0].index}: {bad[0].error}")
    return preds, [it.ids for it in clf.prepare(items)], run.stats


def _seqcls_answer(spec: Any, probs: np.ndarray) -> Any:
    """An item's answer from its probabilities, as the kind gives it: the arg-max label, the
    labels at or above the threshold (multi-label), or the one label (a score)."""
    if spec.form == "multi":
        return [lab for lab, x in zip(spec.labels, probs) if x >= spec.threshold]
    return spec.labels[int(np.argmax(probs))]


def _seqcls_compare(spec: Any, mine: tuple[np.ndarray, np.ndarray], theirs: dict[str, Any]) -> dict[str, Any]:
    """Answers, logits and probabilities of two runs of a sequence classifier: (logits, probs) each (n, k)."""
    a = [_seqcls_answer(spec, p) for p in mine[1]]
    b = [_seqcls_answer(spec, p) for p in theirs["probs"]]
    dis = [i for i, (x, y) in enumerate(zip(a, b)) if x != y]
    return {
        "agree": len(a) - len(dis),
        "total": len(a),
        "max_abs_dlogit": float(np.abs(mine[0] - theirs["logits"]).max()),
        "max_abs_dprob": float(np.abs(mine[1] - theirs["probs"]).max()),
        "disagreements": dis,
    }


def run_seqcls_parity(
    model: str,
    reference: str | None,
    items: Sequence[Any],
    *,
    prompt: tuple[str | None, str] | None = None,
    threshold: float | None = None,
    ours: Ours = Ours(),
) -> dict[str, Any]:
    """A sequence-classification checkpoint: our answers (batched, padded) against
    `AutoModelForSequenceClassification` in float32, each item alone, on the same weight
    values, its inputs encoded and its probabilities computed by Transformers'
    text-classification pipeline (`reference.SeqClsReference`): answers equal (the label; a
    multi-label head's labels at the threshold), probabilities within `SEQCLS_TOLERANCE`, and
    our token ids the pipeline's. `items`: texts or (text, pair) tuples. `prompt`: (system,
    template) to run the chat prompt instead; a chat prompt (that one, or the one an export
    records) is the reference's too, encoded by the tokenizer's chat template. With
    `reference` (the original checkpoint), (b) Transformers on it against (a)'s. `ours`: how
    our side loads and runs."""

    progress = ours.progress
    clf, path, q = _loaded(model, ours, prompt, threshold=threshold)
    spec = clf.spec
    if getattr(clf.model, "seqcls", None) is None:  # the model's fact: no score head of its own
        raise UserError(f"{model} is not a sequence classifier (*ForSequenceClassification): parity checks it without")
    compute = {mx.float32: "float32", mx.float16: "float16", mx.bfloat16: "bfloat16"}[clf.model.compute_dtype]
    t0 = time.perf_counter()
    preds, ids, _ = _ours(clf, items)
    t_ours = time.perf_counter() - t0
    texts, pairs = zip(*(split_pair(x) for x in items)) if items else ((), ())
    mine = (
        np.array([[p.scores[lab] for lab in spec.labels] for p in preds]),
        np.array([[p.probs[lab] for lab in spec.labels] for p in preds]),
    )

    # The prompt we ran is the one the reference encodes: the text (or pair) as the pipeline
    # encodes it, or a chat prompt (typed, or the one an export records) in the chat template.
    chat = {"system": clf.format.system, "template": clf.format.template} if spec.chat else None

    def reference_on(where: str) -> dict[str, Any]:
        progress(f"reference: Transformers float32 (AutoModelForSequenceClassification), one at a time, on {where}")
        return seqcls_in_child(where, texts=list(texts), pairs=list(pairs), chat=chat)

    with tempfile.TemporaryDirectory() as tmp:
        same = reference_on(_same_values(path, q is not None, tmp, progress))
    a = _seqcls_compare(spec, mine, same)
    # our encoding is the reference's (up to the trailing pad tokens it reads past)
    a["encodings_equal"] = sum(spec.head.prompt_ids(t) == m for t, m in zip(same["ids"], ids))
    src = str(local(reference).path) if reference is not None else None
    b = None if src is None else _seqcls_compare(spec, (same["logits"], same["probs"]), reference_on(src))
    tol = SEQCLS_TOLERANCE[compute]
    return {
        "model": str(path),
        "reference": src,
        "n": len(items),
        "pairs": sum(p is not None for p in pairs),
        "scoring": "seqcls",
        "head": spec.head.to_dict(),
        "form": spec.form,
        "threshold": spec.threshold if spec.form == "multi" else None,
        "prompt": _prompt_said(spec.chat, prompt is not None),
        "compute_dtype": compute,
        "quantization": None if q is None else describe(q),
        "tolerance_prob": tol,
        "forward_exactness": a,
        "conversion_drift": b,
        "forward_ok": a["agree"] == a["total"] and a["max_abs_dprob"] <= tol and a["encodings_equal"] == a["total"],
        "drift_ok": b is None or b["agree"] == b["total"],
        "seconds": {"ours": round(t_ours, 2), "reference": round(float(same["seconds"]), 2)},
    }


def _prompt_said(chat: bool, typed: bool) -> str:
    if not chat:
        return "the text as the tokenizer encodes it"
    return "chat (typed)" if typed else "the prompt it records (mlx_slm.prompt), in the chat template"


def run_rerank_parity(
    model: str,
    queries: Sequence[str],
    documents: Sequence[str],
    *,
    reranker: str = "auto",
    instruction: str | None = None,
    prompt: tuple[str | None, str] | None = None,
    ours: Ours = Ours(),
) -> dict[str, Any]:
    """A reranker: our scores of every (query, document) (batched, each query's tokens run
    once, several queries per batch) against Transformers scoring each pair alone in float32
    on the same weight values (`reference.rerank_in_child`: the seqcls pair; the
    Qwen3-Reranker card's prompt on `AutoModelForCausalLM`, P(yes); a question prompt on our
    token ids): scores within `SEQCLS_TOLERANCE`, each query's order the same; and the
    tokens processed against the floor (each query's tokens once, each document's own).
    `ours`: how our side loads and runs."""

    progress = ours.progress
    clf, path, q = _loaded(model, ours, prompt, reranker=reranker, instruction=instruction)
    spec = clf.spec
    compute = {mx.float32: "float32", mx.float16: "float16", mx.bfloat16: "bfloat16"}[clf.model.compute_dtype]
    items = list(zip(queries, documents))
    t0 = time.perf_counter()
    preds, ids, stats = _ours(clf, items)
    t_ours = time.perf_counter() - t0
    ours = np.array([p.value for p in preds], dtype=np.float64)
    prompts = ids if spec.scorer == "question" else None
    with tempfile.TemporaryDirectory() as tmp:
        same = _same_values(path, q is not None, tmp, progress)
        progress(f"reference: Transformers float32, every (query, document) alone ({spec.scorer}), on {same}")
        got = rerank_in_child(same, spec.scorer, list(queries), list(documents), spec.instruction, prompts)
    theirs = got["scores"]
    by_query: dict[str, list[int]] = {}
    for i, x in enumerate(queries):
        by_query.setdefault(x, []).append(i)
    same_order = [
        qi
        for qi, rows in enumerate(by_query.values())
        if rerank_order(ours[rows].tolist()) == rerank_order(theirs[rows].tolist())
    ]
    heads = {it.prefix for it in clf.prepare(items)}
    floor = sum(len(h) for h in heads if h) + sum(
        len(x) - len(it.prefix or ()) for x, it in zip(ids, clf.prepare(items))
    )
    tol = SEQCLS_TOLERANCE[compute]
    d = float(np.abs(ours - theirs).max()) if len(ours) else 0.0
    return {
        "model": str(path),
        "n": len(items),
        "queries": len(by_query),
        "scoring": clf.mode,
        "instruction": spec.instruction if spec.scorer == "qwen3" else None,
        "compute_dtype": compute,
        "quantization": None if q is None else describe(q),
        "tolerance_score": tol,
        "forward_exactness": {
            "max_abs_dscore": d,
            "orders_agree": len(same_order),
            "queries": len(by_query),
            "max_abs_dlogit": float(np.abs(np.array([p.scores[spec.labels[0]] for p in preds]) - got["logits"]).max()),
        },
        "tokens": {
            "processed": stats.processed_tokens,
            "floor": floor,
            "ratio": round(stats.processed_tokens / floor, 4) if floor else None,
            "unbatched": stats.prompt_tokens,
        },
        "forward_ok": d <= tol and len(same_order) == len(by_query),
        "seconds": {"ours": round(t_ours, 2), "reference": round(float(got["seconds"]), 2)},
    }


def format_seqcls_report(r: dict[str, Any]) -> str:
    a, b, h = r["forward_exactness"], r["conversion_drift"], r["head"]
    what = "label sets" if r["form"] == "multi" else "labels"
    at = f", labels at or above {r['threshold']}" if r["form"] == "multi" else ""
    lines = [
        f"model      {r['model']}",
        f"reference  {r['reference'] or '(the same weight values only)'}",
        f"head       {h['architecture']}: {_label_list(h['labels'])} ({h['function']}, {r['form']} records{at})",
        f"items {r['n']} ({r['pairs']} pairs), prompt: {r['prompt']}, compute {r['compute_dtype']}"
        + (f"; weights {r['quantization']}" if r.get("quantization") else ""),
        "",
        "(a) forward exactness: ours (batched, padded) vs AutoModelForSequenceClassification float32, each item "
        "alone, the text-classification pipeline's encoding and probabilities, same weight values",
        f"    {what + ' agree':<21}{a['agree']}/{a['total']}",
        *([f"    encodings equal      {a['encodings_equal']}/{a['total']}"] if "encodings_equal" in a else []),
        f"    max |d logit|        {a['max_abs_dlogit']:.3g}",
        f"    max |d prob|         {a['max_abs_dprob']:.3g}   (tolerance {r['tolerance_prob']:g})",
        f"    -> {'PASS' if r['forward_ok'] else 'FAIL'}",
        "",
    ]
    if b is None:
        lines.append("(b) conversion drift: skipped (no --reference)")
    else:
        lines += [
            "(b) conversion drift: Transformers on the source vs on the converted weights",
            f"    {what + ' agree':<21}{b['agree']}/{b['total']}",
            f"    max |d prob|         {b['max_abs_dprob']:.3g}",
        ]
    sec = r["seconds"]
    lines += ["", f"time: ours {sec['ours']} s, reference {sec['reference']} s"]
    return "\n".join(lines)


def format_rerank_report(r: dict[str, Any]) -> str:
    a, t = r["forward_exactness"], r["tokens"]
    return "\n".join(
        [
            f"model      {r['model']}",
            f"items {r['n']} (query, document) pairs of {r['queries']} queries, {r['scoring']}, "
            f"compute {r['compute_dtype']}" + (f"; weights {r['quantization']}" if r.get("quantization") else ""),
            "",
            "(a) forward exactness: ours (batched, each query's tokens once) vs Transformers float32, every pair alone",
            f"    max |d score|        {a['max_abs_dscore']:.3g}   (tolerance {r['tolerance_score']:g})",
            f"    max |d logit|        {a['max_abs_dlogit']:.3g}",
            f"    queries in the same order  {a['orders_agree']}/{a['queries']}",
            f"    -> {'PASS' if r['forward_ok'] else 'FAIL'}",
            "",
            f"tokens processed {t['processed']:,} for a floor of {t['floor']:,} (each query's tokens once, each "
            f"document's own): {t['ratio']}x; each pair alone would run {t['unbatched']:,}",
            f"time: ours {r['seconds']['ours']} s, reference {r['seconds']['reference']} s",
        ]
    )
