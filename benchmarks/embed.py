"""Embeddings: texts/s and tokens/s of ours against sentence-transformers' batched `encode`.

    python -m benchmarks.embed [--model qwen2.5-coder-0.5b] [--quick] [--n 96] [--out benchmarks/results]

There is no real embedding model on this machine, so one is built as Qwen3-Embedding is laid
out: `--model`'s backbone (Transformers' `AutoModel` on the built-in's GGUF, dequantized by
Transformers, saved in float16; any other model: its converted folder), saved by
sentence-transformers itself as a folder with last-token pooling and Normalize, an instruction
prompt named "query" (`PROMPT`), the text modality (each text tokenized as it is, the prompt
before it). Built once into the cache (`MLX_SLM_HOME`, ~/.cache/mlx-slm, under bench/), in a
child process. The vectors are random-quality (the LM was never trained to embed); the
benchmark measures the speed and the exactness of running it, which is what the weights do not
change.

The texts: `--n` workload tickets (`mlx_slm.text.workload.tickets`), stratified by length, in
workload order. Rows, each with the query prompt and without one: ours (`Embedder`, the
default batching: length-sorted, token-budgeted, the prompt's head cached) and
sentence-transformers' `encode` with its own defaults (batch size 32, texts sorted by length,
each batch padded to its longest) in float32 on the CPU, in a child process without our
OpenBLAS preload (`reference.run_in_child`). Reported: seconds, texts/s, tokens/s (the texts'
own tokens, prompt included, per second), tokens processed against the token floor (every
text's tokens, the prompt's shared head once, no padding), the speed-up over
sentence-transformers, and the smallest cosine between the two rows' vectors. `--quick`: 8
tickets.

Results: `--out`/embed.{json,md,png}.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

import mlx_slm  # noqa: F401  (BLAS before mlx)
from benchmarks.record import in_child, run_line, run_record

FULL_N, QUICK_N = 96, 8
PROMPT = "Instruct: Given a customer support ticket, retrieve tickets about the same problem\nQuery: "
ST_BATCH = 32  # sentence-transformers' encode default


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def texts_of(n: int) -> list[str]:
    """`n` of the 600 workload tickets, spread evenly over their lengths, in workload order."""
    from mlx_slm.text.workload import stratified_sample, tickets

    all_t = [t for t, _ in tickets(600)]
    return [all_t[i] for i in stratified_sample([len(t.split()) for t in all_t], n)]


def source(model: str) -> Path:
    """What Transformers loads the backbone from: a built-in's GGUF, else the converted folder."""
    from mlx_slm.weights.registry import BUILTINS
    from mlx_slm.weights.sources import fetch_gguf, materialise

    return fetch_gguf(model) if model in BUILTINS else materialise(model)


def checkpoint(model: str, cache: Path) -> tuple[Path, float]:
    """The sentence-transformers folder built from `model` (see the module docstring), made once
    under the cache's lock, in a child: (its folder, the seconds building took, 0 if it was there)."""
    from mlx_slm.weights.registry import cache_lock

    src = source(model)
    key = hashlib.sha256(json.dumps([str(src.resolve()), PROMPT, "lasttoken"]).encode()).hexdigest()[:10]
    dst = cache / f"{src.stem if src.suffix == '.gguf' else src.name}-st-lasttoken-{key}"
    if (dst / "modules.json").is_file():
        return dst, 0.0
    t = time.perf_counter()
    with cache_lock(dst.name, f"building {dst.name}"):
        if not (dst / "modules.json").is_file():
            say(f"embed: building the sentence-transformers folder (once) -> {dst}")
            in_child("benchmarks.embed", {"build": True, "src": str(src), "dst": str(dst)})
    return dst, time.perf_counter() - t


def build(job: dict[str, Any]) -> None:
    """The backbone (`AutoModel`) and tokenizer of `src`, saved by sentence-transformers with
    last-token pooling, Normalize and the query prompt, the text modality only, into a
    temporary folder renamed into place (an interrupted build leaves nothing)."""
    import shutil
    import tempfile
    import warnings

    import torch
    from transformers import AutoModel, AutoTokenizer

    warnings.filterwarnings("ignore")
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer

    src, dst = Path(job["src"]), Path(job["dst"])
    if src.suffix == ".gguf":  # dequantized by Transformers, kept in float16 as our conversion keeps it
        kw: dict[str, Any] = {"gguf_file": src.name, "dtype": torch.float16}
        where = str(src.parent)
    else:
        kw, where = {"dtype": "auto"}, str(src)
    backbone = AutoModel.from_pretrained(where, **kw)
    if src.suffix == ".gguf":  # Transformers will not save a GGUF-loaded model: the same values in a plain one
        cfg = backbone.config
        if hasattr(cfg, "quantization_config"):
            del cfg.quantization_config
        plain = AutoModel.from_config(cfg, dtype=torch.float16)
        plain.load_state_dict(backbone.state_dict())
        backbone = plain
    tok = AutoTokenizer.from_pretrained(where, **({"gguf_file": src.name} if src.suffix == ".gguf" else {}))
    tmp = dst.with_name(f"{dst.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    with tempfile.TemporaryDirectory() as hf:
        backbone.save_pretrained(hf)
        tok.save_pretrained(hf)
        t = Transformer(hf)
        st = SentenceTransformer(
            modules=[t, Pooling(t.get_embedding_dimension(), pooling_mode="lasttoken"), Normalize()],
            prompts={"query": PROMPT, "document": ""},
        )
        st.save(str(tmp))
    cfg = json.loads((tmp / "sentence_bert_config.json").read_text())
    cfg.get("modality_config", {}).pop("message", None)  # texts as they are, as Qwen3-Embedding runs them
    (tmp / "sentence_bert_config.json").write_text(json.dumps(cfg, indent=2))
    os.replace(tmp, dst)


def st_worker(job: dict[str, Any]) -> dict[str, Any]:
    """sentence-transformers' `encode` (its defaults: batch 32, length-sorted) in float32 on the
    CPU, for each prompt: a warm-up on two texts, then every text timed; the vectors, and each
    text's token count as it tokenizes it (prompt included)."""
    import warnings

    import torch

    warnings.filterwarnings("ignore")
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(os.cpu_count() or 1)
    model = SentenceTransformer(job["path"], device="cpu", model_kwargs={"dtype": torch.float32})
    texts = job["texts"]
    out: dict[str, Any] = {}
    for name in job["prompts"]:
        prompt = PROMPT if name == "query" else None
        model.encode(texts[:2], prompt=prompt)  # warm-up
        t = time.perf_counter()
        vecs = model.encode(texts, prompt=prompt, convert_to_numpy=True)
        secs = time.perf_counter() - t
        lengths = [len(model.preprocess([x], prompt=prompt)["input_ids"][0]) for x in texts]
        out[name] = {"seconds": secs, "vectors": vecs.tolist(), "lengths": lengths}
    return out


def worker(job_path: str, out_path: str) -> int:
    job = json.loads(Path(job_path).read_text())
    if job.get("build"):
        build(job)
        Path(out_path).write_text("{}")
    else:
        Path(out_path).write_text(json.dumps(st_worker(job)))
    return 0


def st_padded(texts: Sequence[str], lengths: Sequence[int], batch: int = ST_BATCH) -> int:
    """Tokens sentence-transformers' encode runs: texts sorted by their length in characters
    (longest first, as it sorts), batches of `batch`, each padded to its longest."""
    order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
    chunks = [[lengths[i] for i in order[k : k + batch]] for k in range(0, len(order), batch)]
    return sum(len(c) * max(c) for c in chunks)


def floor_tokens(ids: Sequence[Sequence[int]], head: Sequence[int]) -> int:
    """Every text's tokens with the shared head counted once, no padding."""
    n = len(head)
    cont = sum(1 for x in ids if n and list(x[:n]) == list(head) and len(x) > n)
    return sum(len(x) for x in ids) - max(cont - 1, 0) * n if cont else sum(len(x) for x in ids)


def ours(emb: Any, texts: list[str], prompt: str) -> tuple[np.ndarray, dict[str, Any], float]:
    t0 = time.perf_counter()
    got = emb.embed(texts, prompt=prompt, window=max(1, len(texts)))
    secs = time.perf_counter() - t0
    bad = next((i for i, e in enumerate(got.errors) if e), None)
    if bad is not None:
        raise SystemExit(f"ticket {bad}: {got.errors[bad]}")
    return got.vectors, got.stats.as_dict(), secs


def main(argv: list[str] | None = None) -> int:
    from mlx_slm.weights.registry import cache_dir

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b", help="the LM whose backbone the folder is built from")
    ap.add_argument("--quick", action="store_true", help=f"{QUICK_N} tickets")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    ap.add_argument("--n", type=int, help=f"tickets (default {FULL_N}; --quick {QUICK_N})")
    ap.add_argument("--cache", type=Path, default=cache_dir() / "bench", help="where the folder is built")
    ap.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        return worker(*a.worker)
    if a.n is None:
        a.n = QUICK_N if a.quick else FULL_N
    return run(a, argv)


def run(a: argparse.Namespace, argv: list[str] | None) -> int:
    from mlx_slm.classifier.embedder import Embedder
    from mlx_slm.ground.blas import matmul_peak

    peak0 = matmul_peak()["mlx"]
    path, build_s = checkpoint(a.model, a.cache)
    t = time.perf_counter()
    # Converted in the dtype it was saved in (float16 for the built-in, as Transformers dequantized
    # it): our weight values are then exactly sentence-transformers' (which loads them in float32).
    saved = json.loads((path / "config.json").read_text()).get("dtype")
    emb = Embedder.load(str(path), dtype="float32" if saved == "float32" else None)
    load_s = time.perf_counter() - t
    texts = texts_of(a.n)
    prompts = {"query": PROMPT, "none": ""}
    ref = in_child("benchmarks.embed", {"path": str(path), "texts": texts, "prompts": list(prompts)})
    rows: list[dict[str, Any]] = []
    for name, prompt in prompts.items():
        ours(emb, texts[:2], prompt)  # warm-up
        emb.engine._prefixes.clear()  # the timed run computes the prompt's head itself, as a first run does
        vecs, st, secs = ours(emb, texts, prompt)
        ids = [it.ids for it in emb.prepare(texts, prompt)]
        head = emb.prompt_head(prompt)[0]
        floor = floor_tokens(ids, head if len(head) > 1 else ())
        theirs = ref[name]
        if [len(x) for x in ids] != theirs["lengths"]:
            raise SystemExit(f"our token counts differ from sentence-transformers' ({name} prompt)")
        tokens = sum(theirs["lengths"])
        tv = np.array(theirs["vectors"], dtype=np.float32)
        cos = float(((vecs * tv).sum(1) / np.linalg.norm(vecs, axis=1) / np.linalg.norm(tv, axis=1)).min())
        say(
            f"embed: {name} prompt: ours {secs:.1f} s, sentence-transformers {theirs['seconds']:.1f} s, min cos {cos:.6f}"
        )
        for row, s, processed in (
            ("ours", secs, st["processed_tokens"]),
            (f"st-b{ST_BATCH}", theirs["seconds"], st_padded(texts, theirs["lengths"])),
        ):
            rows.append(
                {
                    "row": row,
                    "prompt": name,
                    "texts": len(texts),
                    "seconds": round(s, 2),
                    "texts_per_s": round(len(texts) / s, 3),
                    "tokens_per_s": round(tokens / s, 1),
                    "prompt_tokens": tokens,
                    "processed_tokens": processed,
                    "floor_tokens": floor,
                    "x_floor": round(processed / floor, 3),
                    "min_cosine_vs_other": round(cos, 7),
                    **({"stats": st} if row == "ours" else {}),
                }
            )
        rows[-2]["x_st"] = round(rows[-2]["texts_per_s"] / rows[-1]["texts_per_s"], 3)
    peak1 = matmul_peak()["mlx"]
    out = {
        **run_record("benchmarks.embed", a.model, argv, peak0, peak1),
        "folder": {
            "built_from": a.model,
            "how": "the backbone (AutoModel) saved by sentence-transformers: lasttoken pooling, Normalize, "
            "prompts query/document, text modality (no real embedding model on this machine)",
            "path": str(path),
            "dimension": emb.dimension,
            "build_s": round(build_s, 1),
            "load_s": round(load_s, 1),
        },
        "query_prompt": PROMPT,
        "rows": rows,
    }
    write(out, a.out)
    return 0


def write(out: dict[str, Any], folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "embed.json").write_text(json.dumps(out, indent=2) + "\n")
    f = out["folder"]
    lines = [
        f"# Embeddings against sentence-transformers' encode ({out['model']}, {out['date']})",
        "",
        run_line(out),
        "",
        f"The model: {out['model']}'s backbone saved as a sentence-transformers folder ({f['how']}), "
        f"{f['dimension']} values. {out['rows'][0]['texts']} workload tickets stratified by length; the query prompt "
        f"is {out['query_prompt']!r}. sentence-transformers runs its own `encode` defaults (batch size {ST_BATCH}, "
        "sorted by length) in float32 on the CPU; tokens/s counts the texts' own tokens (prompt included).",
        "",
        "| prompt | row | seconds | texts/s | tokens/s | tokens processed | token floor | x floor | x st | min cosine |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in out["rows"]:
        lines.append(
            f"| {r['prompt']} | {r['row']} | {r['seconds']} | {r['texts_per_s']} | {r['tokens_per_s']} | "
            f"{r['processed_tokens']:,} | {r['floor_tokens']:,} | {r['x_floor']} | {r.get('x_st', '-')} | "
            f"{r['min_cosine_vs_other']} |"
        )
    (folder / "embed.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    plot(out, folder / "embed.png")


def plot(out: dict[str, Any], path: Path) -> None:
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        print("matplotlib missing: no PNG (pip install 'mlx-slm[bench]')", file=sys.stderr)
        return
    rows = out["rows"]
    names = [f"{r['row']} ({'query prompt' if r['prompt'] == 'query' else 'no prompt'})" for r in rows]
    colors = ["#4c72b0" if r["row"] == "ours" else "#999999" for r in rows]
    fig = Figure(figsize=(11, 3.5))
    FigureCanvasAgg(fig)
    a, b = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    a.barh(names, [r["texts_per_s"] for r in rows], color=colors)
    a.set_xlabel("texts/s (higher is better)")
    a.invert_yaxis()
    b.barh(names, [r["x_floor"] for r in rows], color=colors)
    b.axvline(1.0, color="k", ls=":", label="token floor")
    b.axvline(1.1, color="k", ls="--", lw=0.8, label="1.1x floor")
    b.set_xlabel("tokens processed / token floor (lower is better)")
    b.invert_yaxis()
    b.legend(fontsize=8)
    fig.suptitle(f"Embeddings: {out['model']} backbone, {rows[0]['texts']} tickets, vs sentence-transformers encode")
    fig.tight_layout()
    fig.savefig(str(path), dpi=110)


if __name__ == "__main__":
    raise SystemExit(main())
