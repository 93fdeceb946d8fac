"""Parity of a fine-tuned task (`mlx-slm parity --task FT_TASK`): our fine-tuned classifier
against Transformers holding the same adapters merged into the weights.

    the task -> ours: `Classifier.from_task` in float32 (its adapters as the task runs them,
    unfused or fused; batched, padded, the shared head from the prefix cache) -> each text's
    probabilities and prompt token ids
    the task -> a temporary folder: `export.export` (the adapters merged, the score head as
    `score.weight`) -> `AutoModelForSequenceClassification` on our prompt ids, one at a time
    (`reference.seqcls_in_child`)

Objective "labels" with labels of several tokens has no score head to export: its reference is
the merged weights written as a causal LM (`AutoModelForCausalLM`), each label's tokens scored
as label scoring scores them (`reference.score_in_child`, the prompt and the label run afresh).
Labels equal and probabilities within `SEQCLS_TOLERANCE` (1e-4 in float32), or exit 1.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np

from ..classifier.classifier import Classifier
from ..classifier.task import Task
from ..engine.engine import Engine
from ..ground.errors import UserError
from ..ground.safefs import temp_dir
from ..kinds.finetune import FinetuneSpec
from ..text.labels import log_softmax
from ..weights.adapters import dense_weights
from ..weights.export import Described, export
from ..weights.registry import ModelRef
from .labels import Ours, _label_list
from .reference import score_in_child, seqcls_in_child
from .seqcls import SEQCLS_TOLERANCE, _ours


def run_finetune_parity(
    task: Any,
    texts: Sequence[str],
    ours: Ours = Ours(),
) -> dict[str, Any]:
    """A fine-tuned task's labels and probabilities on `texts`, ours against Transformers with the
    same adapters merged (see the module docstring). `task`: a task file or `Task`; `ours`: how
    our side loads the task's model (in float32 unless its dtype says otherwise) and runs."""

    t = task if isinstance(task, Task) else Task.load(task)
    progress = ours.progress
    progress(f"ours: MLX, {t.model}, the task's adapters ({'fused' if (t.finetune or {}).get('fused') else 'unfused'})")
    model = replace(ours.model, dtype=ours.dtype or "float32")
    clf = Classifier.from_task(t, batch_size=ours.batch_size, **model.options())
    spec = clf.spec
    if not isinstance(spec, FinetuneSpec):
        raise UserError(f"the task scores with {spec.name!r}, not fine-tuned adapters (mlx-slm train --finetune lora)")
    engine = clf.engine
    if engine.path is None:
        raise UserError(f"{t.model} has no converted folder to give Transformers")
    compute = {mx.float32: "float32", mx.float16: "float16", mx.bfloat16: "bfloat16"}[clf.model.compute_dtype]
    t0 = time.perf_counter()
    preds, ids, _ = _ours(clf, texts)
    t_ours = time.perf_counter() - t0
    labels = list(spec.labels)
    mine = np.array([[p.probs[lab] for lab in labels] for p in preds])
    tuned = spec.tuned
    long = tuned.label_tokens is not None and any(len(x) > 1 for x in tuned.label_tokens)
    base = Engine.load(
        ModelRef(str(engine.path), "float32", keep_quantized=False)
    ).model  # the values merged, in float32
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "merged"
        if long:
            progress("reference: the merged weights as a causal LM, each label's tokens scored, one text at a time")
            theirs, seconds = _causal_reference(clf, base, out, ids)
        else:
            export(
                tuned,
                base,
                engine.tokenizer,
                engine.path,
                out,
                described=Described(prompt={"system": t.system, "template": t.template}, base_name=t.model),
                sha256=engine.weights_sha256,
            )
            progress("reference: AutoModelForSequenceClassification on the export, our prompt ids, one at a time")
            got = seqcls_in_child(out, prompts=ids)
            theirs, seconds = got["probs"], float(got["seconds"])
    a = [labels[int(np.argmax(p))] for p in mine]
    b = [labels[int(np.argmax(p))] for p in theirs]
    dis = [i for i, (x, y) in enumerate(zip(a, b)) if x != y]
    tiny = np.finfo(float).tiny
    tol = SEQCLS_TOLERANCE[compute]
    dp = float(np.abs(mine - theirs).max()) if len(mine) else 0.0
    return {
        "task": {
            "model": t.model,
            "labels": labels,
            "objective": tuned.objective,
            "fused": spec.fused,
            "adapters": spec.file,
            "layers": list(tuned.lora.layers),
            "rank": tuned.lora.rank,
        },
        "model": str(engine.path),
        "n": len(texts),
        "reference": "AutoModelForCausalLM, label scoring" if long else "AutoModelForSequenceClassification",
        "compute_dtype": compute,
        "tolerance_prob": tol,
        "forward_exactness": {
            "agree": len(a) - len(dis),
            "total": len(a),
            "max_abs_dprob": dp,
            "max_abs_dlogprob": float(np.abs(np.log(np.maximum(mine, tiny)) - np.log(np.maximum(theirs, tiny))).max())
            if len(mine)
            else 0.0,
            "disagreements": dis,
        },
        "forward_ok": not dis and dp <= tol,
        "seconds": {"ours": round(t_ours, 2), "reference": round(seconds, 2)},
    }


def _causal_reference(clf: Any, base: Any, out: Path, ids: Sequence[Sequence[int]]) -> tuple[np.ndarray, float]:
    """Objective "labels" with labels of several tokens: the merged weights written as the base's
    causal LM (config, safetensors, tokenizer), each prompt's label scores from Transformers as
    label scoring computes them; (probabilities (n, K), seconds)."""

    engine, tuned = clf.engine, clf.spec.tuned
    merged = tuned.merge(base, engine.weights_sha256)
    cfg = json.loads((Path(engine.path) / "config.json").read_text(encoding="utf-8"))
    cfg = {k: v for k, v in cfg.items() if k not in ("quantization", "quantization_config", "torch_dtype")}
    cfg["dtype"] = "float32"
    tmp = temp_dir(out, "the merged model")
    mx.save_safetensors(str(tmp / "model.safetensors"), dense_weights(merged), {"format": "pt"})
    (tmp / "config.json").write_text(json.dumps(cfg, indent=2), encoding="utf-8")
    engine.tokenizer.save_pretrained(str(tmp))
    tmp.rename(out)
    scores, _, seconds = score_in_child(out, ids, clf.kind.inner.labelset)
    return np.exp(np.array([log_softmax(s) for s in scores])), seconds


def format_finetune_report(r: dict[str, Any]) -> str:
    a, t = r["forward_exactness"], r["task"]

    return "\n".join(
        [
            f"model      {r['model']}",
            f"task       fine-tuned ({t['objective']}), adapters {t['adapters']} ({'fused' if t['fused'] else 'unfused'}"
            f"; rank {t['rank']} on blocks {t['layers'][0]}-{t['layers'][-1]}), labels {_label_list(t['labels'])}",
            f"items {r['n']}, compute {r['compute_dtype']}",
            "",
            f"(a) ours (batched, padded, prefix-cached) vs Transformers with the adapters merged ({r['reference']}), "
            "our prompt ids, each item alone, float32",
            f"    labels agree         {a['agree']}/{a['total']}",
            f"    max |d prob|         {a['max_abs_dprob']:.3g}   (tolerance {r['tolerance_prob']:g})",
            f"    max |d log prob|     {a['max_abs_dlogprob']:.3g}",
            f"    -> {'PASS' if r['forward_ok'] else 'FAIL'}",
            "",
            f"time: ours {r['seconds']['ours']} s, reference {r['seconds']['reference']} s",
        ]
    )
