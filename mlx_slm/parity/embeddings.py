"""Parity of embeddings (`mlx-slm parity --model EMBEDDER`, `--embeddings`): ours, batched
(length-sorted, left-padded, the prompt's head cached), against sentence-transformers' own
`encode` with each text alone, in float32, on the very same weight values (the converted
folder, which keeps the sentence-transformers files beside the weights): every vector's cosine
with the reference at least `MIN_COSINE`, every value within `REL_TOLERANCE` of the reference
vector's largest value, and our token ids those sentence-transformers ran. A plain causal LM's
reference is Transformers' `AutoModel` last hidden state at each text's last token. With
`reference` (the original folder), (b) conversion drift: the reference on it against (a)'s.

The reference runs in a child process without our OpenBLAS preload (`reference.run_in_child`).
"""

from __future__ import annotations

import importlib.util
import json
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np

from ..classifier.embedder import Embedder
from ..engine.engine import Engine
from ..ground.errors import MissingExtra, UserError
from ..models.quant import quantization_of
from ..weights.sources import local, materialise
from .reference import require_torch, run_in_child

MIN_COSINE = 0.9999
# Max |ours - reference| over the reference vector's largest |value|, by compute dtype.
REL_TOLERANCE = {"float32": 1e-4, "bfloat16": 5e-2, "float16": 1e-2}


def reference_in_child(src: str | Path, texts: Sequence[str], prompt: str, st: bool) -> dict[str, Any]:
    """The reference's vectors of `texts` (each alone, float32) and the token ids it ran, from a
    child process: sentence-transformers' `encode` on a folder of its own (`st`), else
    Transformers' `AutoModel` last hidden state at the last token."""
    require_torch()
    if st and importlib.util.find_spec("sentence_transformers") is None:
        raise MissingExtra("the embedding reference needs sentence-transformers: pip install 'mlx-slm[reference]'")
    with tempfile.TemporaryDirectory() as tmp:
        job, out = Path(tmp) / "job.json", Path(tmp) / "out.json"
        job.write_text(json.dumps({"src": str(src), "texts": list(texts), "prompt": prompt, "st": st}))
        done = run_in_child(["-m", "mlx_slm.parity.embeddings", str(job), str(out)])
        if done.returncode != 0:
            raise RuntimeError(f"the embedding reference failed on {src} (exit status {done.returncode})")
        return json.loads(out.read_text())


def _child(job: dict[str, Any]) -> dict[str, Any]:
    """The reference itself (in the child): each text alone, float32 on the CPU."""

    import torch  # lazy: optional, heavy

    warnings.filterwarnings("ignore")
    t0 = time.perf_counter()
    vecs, ids = [], []
    if job["st"]:
        from sentence_transformers import SentenceTransformer  # lazy: optional

        model = SentenceTransformer(job["src"], device="cpu", model_kwargs={"dtype": torch.float32})
        for t in job["texts"]:
            vecs.append(model.encode([t], prompt=job["prompt"] or None, convert_to_numpy=True)[0].tolist())
            feats = model.preprocess([t], prompt=job["prompt"] or None)
            ids.append(feats["input_ids"][0].tolist())
    else:
        from transformers import AutoModel, AutoTokenizer  # lazy: a slow import

        model = AutoModel.from_pretrained(job["src"], dtype=torch.float32).eval()
        tok = AutoTokenizer.from_pretrained(job["src"])
        with torch.no_grad():
            for t in job["texts"]:
                enc = tok(job["prompt"] + t, return_tensors="pt")
                vecs.append(model(**enc).last_hidden_state[0, -1].float().tolist())
                ids.append(enc["input_ids"][0].tolist())
    return {"vectors": vecs, "ids": ids, "seconds": time.perf_counter() - t0}


def compare(ours: np.ndarray, theirs: np.ndarray) -> dict[str, Any]:
    """Per-vector cosine and largest difference relative to the reference vector's scale."""
    cos = (ours * theirs).sum(1) / np.maximum(np.linalg.norm(ours, axis=1) * np.linalg.norm(theirs, axis=1), 1e-30)
    rel = np.abs(ours - theirs).max(axis=1) / np.maximum(np.abs(theirs).max(axis=1), 1e-30)
    return {
        "min_cosine": float(cos.min()),
        "max_rel_diff": float(rel.max()),
        "max_abs_diff": float(np.abs(ours - theirs).max()),
        "worst": int(np.argmin(cos)),
    }


def run_embed_parity(
    model: str,
    texts: Sequence[str],
    *,
    prompt_name: str | None = None,
    prompt: str | None = None,
    reference: str | None = None,
    dtype: str | None = None,
    progress: Callable[[str], None] = lambda _m: None,
) -> dict[str, Any]:
    """Our embeddings of `texts` (batched) against the reference (see the module docstring)."""

    path = materialise(model)
    if quantization_of(json.loads((path / "config.json").read_text())) is not None:
        raise UserError(f"{model} is MLX-quantized: embedding parity runs on float weights; give the float model")
    progress(f"ours: MLX on {path}")
    emb = Embedder(Engine.load(str(path), dtype=dtype), batch_size=8)
    text = emb.pooling.prompt_text(prompt_name, prompt)
    st = emb.pooling.source == "sentence-transformers"
    compute = {mx.float32: "float32", mx.float16: "float16", mx.bfloat16: "bfloat16"}[emb.engine.model.compute_dtype]
    t0 = time.perf_counter()
    got = emb.embed(list(texts), prompt=text)
    ours_s = time.perf_counter() - t0
    bad = next((i for i, e in enumerate(got.errors) if e), None)
    if bad is not None:
        raise UserError(f"text {bad}: {got.errors[bad]}")
    progress(f"reference: {'sentence-transformers' if st else 'Transformers AutoModel'} on {path}, each text alone")
    ref = reference_in_child(path, texts, text, st)
    theirs = np.array(ref["vectors"], dtype=np.float32)
    ids = [it.ids for it in emb.prepare(list(texts), text)]
    a = compare(got.vectors, theirs)
    tol = REL_TOLERANCE[compute]
    report: dict[str, Any] = {
        "model": model,
        "path": str(path),
        "embedding": emb.pooling.info(),
        "prompt": text,
        "compute_dtype": compute,
        "n": len(texts),
        "forward": {
            **a,
            "ids_equal": sum(x == y for x, y in zip(ids, ref["ids"])),
            "ours_s": round(ours_s, 3),
            "reference_s": round(ref["seconds"], 3),
            "prefix_saved_tokens": got.stats.prefix_saved_tokens,
            "processed_tokens": got.stats.processed_tokens,
            "prompt_tokens": got.stats.prompt_tokens,
        },
        "min_cosine": MIN_COSINE,
        "tolerance": tol,
    }
    report["forward_ok"] = (
        a["min_cosine"] >= MIN_COSINE and a["max_rel_diff"] <= tol and report["forward"]["ids_equal"] == len(texts)
    )
    if reference is not None:
        src = local(reference).path
        progress(f"conversion drift: the reference on {src}")
        orig = np.array(reference_in_child(src, texts, text, st)["vectors"], dtype=np.float32)
        report["drift"] = compare(theirs, orig)
    return report


def format_embed_report(r: dict[str, Any]) -> str:
    f, e = r["forward"], r["embedding"]
    how = "sentence-transformers' encode" if e["source"] == "sentence-transformers" else "Transformers' AutoModel"
    lines = [
        f"embedding parity: {r['model']} ({r['n']} texts, {r['compute_dtype']}; {e['pooling']} pooling, "
        f"{e['dimension']} values{', normalized' if e['normalize'] else ''}"
        + (f"; prompt {r['prompt']!r}" if r["prompt"] else "")
        + ")",
        f"(a) forward exactness, ours batched vs {how} each text alone, same weights:",
        f"    min cosine {f['min_cosine']:.7f} (>= {r['min_cosine']}), max |diff| / max |value| "
        f"{f['max_rel_diff']:.2e} (<= {r['tolerance']:g}), token ids equal {f['ids_equal']}/{r['n']}",
        f"    ours {f['ours_s']} s ({f['processed_tokens']:,} tokens processed of {f['prompt_tokens']:,}; the prompt's "
        f"head saved {f['prefix_saved_tokens']:,}), reference {f['reference_s']} s",
        f"    {'OK' if r['forward_ok'] else 'FAIL'}",
    ]
    if "drift" in r:
        d = r["drift"]
        lines.append(
            f"(b) conversion drift (the reference on the original folder): min cosine {d['min_cosine']:.6f}, "
            f"max |diff| / max |value| {d['max_rel_diff']:.2e}"
        )
    return "\n".join(lines)


if __name__ == "__main__":  # the child: python -m mlx_slm.parity.embeddings JOB OUT
    Path(sys.argv[2]).write_text(json.dumps(_child(json.loads(Path(sys.argv[1]).read_text()))))
