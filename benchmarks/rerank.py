"""Reranking: queries x documents, each query's tokens once, against Transformers on the same prompts.

    python -m benchmarks.rerank [--model qwen2.5-coder-0.5b] [--quick] [--out benchmarks/results]
        [--banking77 ../shared/data/banking77] [--queries 8] [--docs 64] [--same 8] [--item-docs 16]

The model is asked as Qwen3-Reranker asks (`Classifier(engine, reranker="qwen3")`: the model
card's prompt, P(yes) = the softmax over the `no`/`yes` logits at the last position); each
item is a (query, document) pair. The data: BANKING77 (train.csv, test.csv: text, category),
a fixed seed: `--queries` test messages of as many different intents are the queries, and for
each, `--docs` train messages are its documents (`--same` of its own intent, the rest of
others), shuffled.

Rows, every one on the same prompt ids (those our reranker kind makes):

* `ours`: the default (each query's tokens run once, from the prefix cache; documents of
  several queries in a batch, each row after its own query's KV);
* `ours-no-cache`: `use_prefix_cache=False`, each prompt run whole (still sorted batches);
* `hf-sorted`: Transformers float32, its fastest batched path: length-sorted, left-padded
  batches of `--hf-batch` with an attention mask, the last position's `no`/`yes` logits;
* `hf-item`: Transformers float32 one prompt at a time, on the first `--item-docs` documents
  of each query (a stated subset: the whole is slow).

Reported per row: seconds, documents/s, tokens processed, the token floor (each query's head
once + each document's own tokens, no padding) and processed / floor, and against `hf-sorted`
the largest |score difference| and per query whether the top document and the whole order
are the same (with Kendall's tau); against `hf-item` the largest difference on its subset.
As a quality note only: how often a document of the query's own intent ranks first, and the
share of them among the first `--same`. Transformers runs in a child process without our
OpenBLAS preload (see `reference.run_in_child`). `--quick`: 2 queries x 8 documents, and an
estimate of the full run's minutes from this run's per-token rates.

Results: `--out`/rerank.{json,md,png}.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

import mlx_slm  # noqa: F401  (BLAS before mlx)
from benchmarks.record import in_child, run_line, run_record

ROOT = Path(__file__).resolve().parent.parent
FULL = {"queries": 8, "docs": 64, "same": 8, "item_docs": 16}
QUICK = {"queries": 2, "docs": 8, "same": 2, "item_docs": 4}
ROWS = ("ours", "ours-no-cache", "hf-sorted", "hf-item")


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


@dataclass
class Query:
    """One query (a test message), its intent, its documents and which are of its intent."""

    text: str
    intent: str
    docs: list[str]
    same: list[bool]


def _csv(path: Path) -> list[dict[str, str]]:
    if not path.is_file():
        raise SystemExit(f"{path}: not found: pass --banking77 the BANKING77 folder (train.csv, test.csv)")
    with open(path, encoding="utf-8", newline="") as f:
        return list(csv.DictReader(f))


def banking77(root: Path, n_queries: int, n_docs: int, same: int, seed: int = 0) -> list[Query]:
    """`n_queries` test messages of different intents, each with `n_docs` train messages
    (`same` of its intent, the rest drawn from every other intent), shuffled; fixed by `seed`."""
    train, test = _csv(root / "train.csv"), _csv(root / "test.csv")
    intents = sorted({r["category"] for r in test})
    if not 1 <= same <= n_docs:
        raise SystemExit(f"--same {same} must be from 1 to --docs ({n_docs})")
    if n_queries > len(intents):
        raise SystemExit(f"--queries {n_queries}: the data has {len(intents)} intents")
    rng = np.random.default_rng(seed)
    out = []
    for k in rng.choice(len(intents), n_queries, replace=False):
        intent = intents[int(k)]
        asks = [r["text"] for r in test if r["category"] == intent]
        own = [r["text"] for r in train if r["category"] == intent]
        other = [r["text"] for r in train if r["category"] != intent]
        docs = [own[i] for i in rng.choice(len(own), same, replace=False)]
        docs += [other[i] for i in rng.choice(len(other), n_docs - same, replace=False)]
        flags = [True] * same + [False] * (n_docs - same)
        order = rng.permutation(n_docs)
        out.append(
            Query(asks[int(rng.integers(len(asks)))], intent, [docs[i] for i in order], [flags[i] for i in order])
        )
    return out


def pairs_of(queries: Sequence[Query]) -> list[tuple[str, str]]:
    return [(q.text, d) for q in queries for d in q.docs]


def prompts(engine: Any, items: list[tuple[str, str]]) -> tuple[list[list[int]], list[tuple[int, ...]], list[int]]:
    """(each item's prompt ids, its query's head, the no/yes token ids), as our reranker makes them."""
    from mlx_slm.classifier.classifier import Classifier

    clf = Classifier(engine, reranker="qwen3")
    got = clf.prepare(items)
    bad = [it for it in got if it.error]
    if bad:
        raise SystemExit(f"document {bad[0].index}: {bad[0].error}")
    return [list(it.ids) for it in got], [tuple(it.prefix or ()) for it in got], list(clf.kind.answer_rows)


def floor_tokens(ids: Sequence[Sequence[int]], heads: Sequence[tuple[int, ...]]) -> int:
    """Each query's head once plus each document's own tokens (its prompt after the head)."""
    return sum(len(h) for h in set(heads)) + sum(len(x) - len(h) for x, h in zip(ids, heads))


def ours(engine: Any, items: list[tuple[str, str]], **kw: Any) -> tuple[np.ndarray, dict[str, Any], float]:
    """Our reranker's scores, run figures and seconds, on a fresh engine over the same weights
    (its own empty prefix cache: the timed run computes every query's head)."""
    from mlx_slm.classifier.classifier import Classifier
    from mlx_slm.engine.engine import Engine

    clf = Classifier(Engine(engine.model, engine.tokenizer, engine.path), reranker="qwen3", **kw)
    t0 = time.perf_counter()
    run = clf.run(items, window=max(1, len(items)))
    preds = list(run)
    secs = time.perf_counter() - t0
    bad = [p for p in preds if not p.ok]
    if bad:
        raise SystemExit(f"document {bad[0].index}: {bad[0].error}")
    return np.array([p.value for p in preds], dtype=np.float64), run.stats.as_dict(), secs


def kendall_tau(a: np.ndarray, b: np.ndarray) -> float:
    """Kendall's tau-a of two score vectors (1: the same order)."""
    n = len(a)
    if n < 2:
        return 1.0
    sa, sb = np.sign(a[:, None] - a[None]), np.sign(b[:, None] - b[None])
    return float((sa * sb)[np.triu_indices(n, 1)].sum() / (n * (n - 1) / 2))


def agreement(got: np.ndarray, ref: np.ndarray, groups: Sequence[np.ndarray]) -> dict[str, Any]:
    """The largest |difference| and, per query (`groups`: its documents' indices), the same top
    document, the same order (`rerank_order`: ties keep input order), Kendall's tau."""
    from mlx_slm.kinds.rerank import rerank_order

    per = []
    for g in groups:
        a, b = got[g], ref[g]
        per.append(
            {
                "top1_equal": bool(np.argmax(a) == np.argmax(b)),
                "order_equal": rerank_order(list(a)) == rerank_order(list(b)),
                "kendall_tau": round(kendall_tau(a, b), 4),
            }
        )
    idx = np.concatenate(groups)
    return {
        "max_abs_diff": float(np.abs(got[idx] - ref[idx]).max()),
        "top1_equal": sum(p["top1_equal"] for p in per),
        "order_equal": sum(p["order_equal"] for p in per),
        "min_kendall_tau": min(p["kendall_tau"] for p in per),
        "queries": len(per),
        "per_query": per,
    }


def quality(scores: np.ndarray, queries: Sequence[Query]) -> dict[str, Any]:
    """How often a document of the query's own intent ranks first, and their share among the
    first k (k: the query's number of them)."""
    first, share, start = 0, [], 0
    for q in queries:
        s = scores[start : start + len(q.docs)]
        start += len(q.docs)
        order = np.argsort(-s, kind="stable")
        k = sum(q.same)
        first += bool(q.same[int(order[0])])
        share.append(sum(q.same[int(i)] for i in order[:k]) / k)
    return {
        "same_intent_first": first,
        "queries": len(queries),
        "same_intent_share_at_k": round(float(np.mean(share)), 3),
    }


def transformers_rows(
    src: Path, ids: list[list[int]], answer_rows: list[int], pad_id: int, item_idx: list[int], batch: int
) -> dict[str, Any]:
    """`hf-sorted` over every prompt and `hf-item` over `item_idx`, in a child (see `worker`)."""
    job = {"src": str(src), "prompts": ids, "rows": answer_rows, "pad_id": pad_id, "item": item_idx, "batch": batch}
    return in_child("benchmarks.rerank", job)


def worker(job_path: str, out_path: str) -> int:
    """The Transformers rows (run in a child process without our OpenBLAS preload): float32,
    P(yes) = the softmax over the no/yes logits at the last position of each prompt."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    from mlx_slm.text import batching

    hf_logging.disable_progress_bar()
    job = json.loads(Path(job_path).read_text())
    torch.set_num_threads(os.cpu_count() or 1)
    m = AutoModelForCausalLM.from_pretrained(job["src"], dtype=torch.float32).eval()
    head = m.lm_head.weight[torch.tensor(job["rows"])].T.detach()  # (D, 2): the no and yes rows
    seqs: list[list[int]] = job["prompts"]

    def p_yes(h: Any) -> np.ndarray:  # h: (B, D) last positions -> (B,) P(yes)
        with torch.inference_mode():
            z = (h @ head).double().numpy()
        return 1.0 / (1.0 + np.exp(-(z[:, 1] - z[:, 0])))

    def sorted_batches(idx: list[int]) -> tuple[np.ndarray, int, int]:
        rows = [seqs[i] for i in idx]
        out, padded, real = np.zeros(len(rows)), 0, 0
        for bidx in batching.plan([len(s) for s in rows], job["batch"], None, sort=True):
            b = batching.pad(rows, bidx, job["pad_id"])
            mask = torch.tensor(b.mask, dtype=torch.long)
            pos = (mask.cumsum(-1) - 1).clamp(min=0)
            with torch.inference_mode():
                h = m.model(
                    input_ids=torch.tensor(b.ids, dtype=torch.long),
                    attention_mask=mask,
                    position_ids=pos,
                    use_cache=False,
                ).last_hidden_state[:, -1]
            out[bidx] = p_yes(h)
            padded, real = padded + b.padded_tokens, real + b.real_tokens
        return out, padded, real

    def one_at_a_time(idx: list[int]) -> np.ndarray:
        out = []
        for i in idx:
            with torch.inference_mode():
                h = m.model(input_ids=torch.tensor([seqs[i]]), use_cache=False).last_hidden_state[:, -1]
            out.append(p_yes(h)[0])
        return np.array(out)

    res: dict[str, Any] = {}
    sorted_batches([0, 1][: len(seqs)])  # warm-up
    t = time.perf_counter()
    scores, padded, real = sorted_batches(list(range(len(seqs))))
    res["hf-sorted"] = {
        "scores": scores.tolist(),
        "seconds": time.perf_counter() - t,
        "processed": padded,
        "real": real,
    }
    if job["item"]:
        one_at_a_time(job["item"][:1])  # warm-up
        t = time.perf_counter()
        scores = one_at_a_time(job["item"])
        n = sum(len(seqs[i]) for i in job["item"])
        res["hf-item"] = {"scores": scores.tolist(), "seconds": time.perf_counter() - t, "processed": n, "real": n}
    Path(out_path).write_text(json.dumps(res))
    return 0


def planned_tokens(
    ids: Sequence[Sequence[int]],
    heads: Sequence[tuple[int, ...]],
    batch_size: int,
    max_tokens: int | None,
    max_padding: float | None = None,
) -> int:
    """The tokens a run processes under the length-sorted batch plan (`batching.plan`, as our
    pipeline plans a reranker's items: one plan over every query's documents, cut where a batch's
    padding would pass `max_padding`): each head once, then every prompt's rest padded to its
    batch's longest (heads () : every prompt whole)."""
    from mlx_slm.text.batching import plan

    lengths = np.array([len(x) - len(h) for x, h in zip(ids, heads)])
    batches = plan(lengths, batch_size, max_tokens, sort=True, max_padding=max_padding)
    return sum(len(h) for h in set(heads)) + sum(len(b) * int(lengths[b].max()) for b in batches)


def plans(engine: Any, ids: list[list[int]], heads: list[tuple[int, ...]], hf_batch: int) -> dict[str, int]:
    """Each batched row's planned tokens (see `planned_tokens`): ours with its default batch
    settings, after the queries' heads or whole; Transformers' sorted batches of `hf_batch`."""
    from mlx_slm.classifier.classifier import Classifier

    bs = Classifier(engine, reranker="qwen3").batching
    whole = [()] * len(ids)
    return {
        "ours": planned_tokens(ids, heads, bs.batch_size, bs.max_batch_tokens, bs.max_padding),
        "ours-no-cache": planned_tokens(ids, whole, bs.batch_size, bs.max_batch_tokens, bs.max_padding),
        "hf-sorted": planned_tokens(ids, whole, hf_batch, None),
    }


def full_run(engine: Any, a: argparse.Namespace, rows: dict[str, dict[str, Any]], overhead_s: float) -> dict[str, Any]:
    """The full run (`FULL` sizes) planned: each row's tokens (`plans`: no model runs) and its
    minutes, from this run's seconds per processed token of each row, plus this run's untimed
    seconds (loads, warm-ups, matmul peaks). Small batches and a busy machine cost more per
    token: an upper estimate."""
    queries = banking77(Path(a.banking77), FULL["queries"], FULL["docs"], FULL["same"], a.seed)
    ids, heads, _ = prompts(engine, pairs_of(queries))
    tokens: dict[str, int] = plans(engine, ids, heads, a.hf_batch)
    tokens["hf-item"] = sum(len(ids[i]) for i in item_subset(queries, FULL["item_docs"]))
    floor = floor_tokens(ids, heads)
    secs = overhead_s + sum(r["seconds"] / r["processed_tokens"] * tokens[n] for n, r in rows.items())
    return {
        "floor_tokens": floor,
        "planned_tokens": tokens,
        "ours_x_floor": round(tokens["ours"] / floor, 3),
        "minutes": round(secs / 60, 1),
    }


def item_subset(queries: Sequence[Query], per_query: int) -> list[int]:
    """The indices of each query's first `per_query` documents (the `hf-item` subset)."""
    out, start = [], 0
    for q in queries:
        out += list(range(start, start + min(per_query, len(q.docs))))
        start += len(q.docs)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--quick", action="store_true", help="2 queries x 8 documents, and the full run's estimate")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    ap.add_argument("--banking77", default=str(ROOT.parent / "shared" / "data" / "banking77"))
    ap.add_argument("--queries", type=int, help=f"queries (default {FULL['queries']}; --quick {QUICK['queries']})")
    ap.add_argument("--docs", type=int, help=f"documents per query (default {FULL['docs']})")
    ap.add_argument("--same", type=int, help=f"documents of the query's own intent (default {FULL['same']})")
    ap.add_argument("--item-docs", type=int, help="documents per query Transformers scores one at a time (default 16)")
    ap.add_argument("--hf-batch", type=int, default=32, help="Transformers' batch size (sorted batches)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-transformers", action="store_true", help="our rows only")
    ap.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        return worker(*a.worker)
    for k, v in (QUICK if a.quick else FULL).items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    return run(a, argv)


def run(a: argparse.Namespace, argv: list[str] | None) -> int:
    from mlx_slm.engine.engine import Engine
    from mlx_slm.ground.blas import matmul_peak

    wall = time.perf_counter()
    peak0 = matmul_peak()["mlx"]
    engine = Engine.load(a.model)
    queries = banking77(Path(a.banking77), a.queries, a.docs, a.same, a.seed)
    items = pairs_of(queries)
    ids, heads, answer_rows = prompts(engine, items)
    floor = floor_tokens(ids, heads)
    groups, start = [], 0
    for q in queries:
        groups.append(np.arange(start, start + len(q.docs)))
        start += len(q.docs)
    subset = item_subset(queries, a.item_docs)
    pos = {i: k for k, i in enumerate(subset)}
    sub_groups = [np.array([pos[i] for i in g if i in pos]) for g in groups]  # each query's, in the subset
    say(f"rerank: {len(queries)} queries x {a.docs} documents, {sum(map(len, ids)):,} prompt tokens, floor {floor:,}")
    ours(engine, items[:2])  # warm-up (its own engine: nothing cached for the timed runs)
    scores: dict[str, np.ndarray] = {}
    rows: dict[str, dict[str, Any]] = {}
    for name, kw in (("ours", {}), ("ours-no-cache", {"use_prefix_cache": False})):
        s, st, secs = ours(engine, items, **kw)
        scores[name] = s
        rows[name] = {"seconds": secs, "processed_tokens": st["processed_tokens"], "stats": st}
        rows[name]["real_tokens"] = st["processed_tokens"] - st["padding_tokens"]
        say(f"rerank: {name}: {secs:.1f} s, {st['processed_tokens']:,} tokens processed")
    if not a.no_transformers:
        hf = transformers_rows(engine.path, ids, answer_rows, engine.pad_id, subset if a.item_docs else [], a.hf_batch)
        for name, r in hf.items():
            scores[name] = np.array(r["scores"])
            rows[name] = {"seconds": r["seconds"], "processed_tokens": r["processed"], "real_tokens": r["real"]}
            say(f"rerank: {name}: {r['seconds']:.1f} s, {r['processed']:,} tokens processed")
    peak1 = matmul_peak()["mlx"]
    for name, r in rows.items():
        n = len(subset) if name == "hf-item" else len(items)
        r.update(row=name, documents=n, docs_per_s=round(n / r["seconds"], 3), seconds=round(r["seconds"], 2))
        r["floor_tokens"] = floor if name != "hf-item" else None
        r["x_floor"] = round(r["processed_tokens"] / floor, 3) if name != "hf-item" else None
        r["padding_pct"] = round(100 * (1 - r["real_tokens"] / r["processed_tokens"]), 2)
        if name != "hf-item":
            r["quality"] = quality(scores[name], queries)
        if "hf-item" in scores:  # on the subset Transformers ran one prompt at a time
            own = scores[name] if name == "hf-item" else scores[name][subset]
            r["vs_one_at_a_time"] = agreement(own, scores["hf-item"], sub_groups)
        if "hf-sorted" in scores:
            if name == "hf-item":
                r["vs_transformers"] = agreement(scores[name], scores["hf-sorted"][subset], sub_groups)
            else:
                r["vs_transformers"] = agreement(scores[name], scores["hf-sorted"], groups)
    out = {
        **run_record("benchmarks.rerank", a.model, argv, peak0, peak1),
        "data": f"BANKING77, seed {a.seed}: {len(queries)} test messages of different intents as queries, "
        f"{a.docs} train messages each ({a.same} of its intent)",
        "queries": [{"text": q.text, "intent": q.intent} for q in queries],
        "documents": len(items),
        "prompt_tokens": sum(map(len, ids)),
        "floor_tokens": floor,
        "head_tokens": sum(len(h) for h in set(heads)),
        "hf_item_subset": f"the first {a.item_docs} documents of each query ({len(subset)})",
        "rows": [rows[n] for n in ROWS if n in rows],
    }
    planned = plans(engine, ids, heads, a.hf_batch)
    for name, r in rows.items():  # the plan is what ran (else the full run's plan below means little)
        r["planned_tokens"] = planned.get(name)
        if name in planned and planned[name] != r["processed_tokens"]:
            say(f"rerank: {name} processed {r['processed_tokens']:,} tokens, its plan {planned[name]:,}")
    if (a.queries, a.docs, a.same, a.item_docs) != tuple(FULL.values()):
        timed = sum(r["seconds"] for r in rows.values())
        full = full_run(engine, a, rows, time.perf_counter() - wall - timed)
        out["full_run"] = full
        say(
            f"rerank: the full run (python -m benchmarks.rerank --model {a.model}) would process "
            f"{full['planned_tokens']['ours']:,} tokens in ours ({full['ours_x_floor']}x its floor of "
            f"{full['floor_tokens']:,}) and take about {full['minutes']:.0f} min at this run's rates "
            f"(matmul peak here {max(peak0, peak1):.0f} GFLOP/s)"
        )
    write(out, a.out)
    return 0


def write(out: dict[str, Any], folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "rerank.json").write_text(json.dumps(out, indent=2) + "\n")
    n_q = len(out["queries"])
    lines = [
        f"# Reranking ({out['model']}, {out['date']}, {n_q} queries x {out['documents'] // n_q} documents)",
        "",
        run_line(out),
        "",
        f"{out['data']}. Prompt tokens {out['prompt_tokens']:,}; token floor {out['floor_tokens']:,} (each query's "
        f"head once, {out['head_tokens']:,} in all, + each document's own tokens). `hf-item`: "
        f"{out['hf_item_subset']}.",
        "",
        "| row | documents | seconds | docs/s | tokens processed | x floor | padding % | max abs diff vs hf-sorted "
        "| top-1 equal | order equal | min Kendall tau | max abs diff vs hf-item |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in out["rows"]:
        v, w = r.get("vs_transformers"), r.get("vs_one_at_a_time")
        q = f"{v['queries']}" if v else ""
        lines.append(
            f"| {r['row']} | {r['documents']} | {r['seconds']} | {r['docs_per_s']} | {r['processed_tokens']:,} | "
            f"{r['x_floor'] if r['x_floor'] is not None else '-'} | {r['padding_pct']} | "
            + (f"{v['max_abs_diff']:.1e} | {v['top1_equal']}/{q} | {v['order_equal']}/{q} | {v['min_kendall_tau']} | "
               if v else "- | - | - | - | ")
            + (f"{w['max_abs_diff']:.1e} |" if w else "- |")
        )  # fmt: skip
    lines.append("")
    for r in out["rows"]:
        if "quality" in r:
            qq = r["quality"]
            lines.append(
                f"Quality note, {r['row']}: a document of the query's own intent ranks first for "
                f"{qq['same_intent_first']}/{qq['queries']} queries; their share among the first k (k: their number) "
                f"{qq['same_intent_share_at_k']}."
            )
            break
    if "full_run" in out:
        f = out["full_run"]
        lines += [
            "",
            f"The full run ({FULL['queries']} x {FULL['docs']}), planned: ours {f['planned_tokens']['ours']:,} tokens "
            f"({f['ours_x_floor']}x its floor of {f['floor_tokens']:,}); about {f['minutes']} minutes at this run's "
            "rates.",
        ]
    (folder / "rerank.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    plot(out, folder / "rerank.png")


def plot(out: dict[str, Any], path: Path) -> None:
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        print("matplotlib missing: no PNG (pip install 'mlx-slm[bench]')", file=sys.stderr)
        return
    rows = out["rows"]
    names = [f"{r['row']} ({r['documents']})" for r in rows]
    colors = ["#4c72b0" if r["row"].startswith("ours") else "#999999" for r in rows]
    fig = Figure(figsize=(11, 4))
    FigureCanvasAgg(fig)
    a, b = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    a.barh(names, [r["docs_per_s"] for r in rows], color=colors)
    a.set_xlabel("documents/s (higher is better)")
    a.invert_yaxis()
    full = [r for r in rows if r["x_floor"] is not None]
    b.barh([r["row"] for r in full], [r["processed_tokens"] for r in full], color=colors[: len(full)])
    b.axvline(out["floor_tokens"], color="k", ls=":", label="token floor")
    b.axvline(1.15 * out["floor_tokens"], color="k", ls="--", lw=0.8, label="1.15x floor")
    b.set_xlabel("tokens processed")
    b.invert_yaxis()
    b.legend(fontsize=8)
    n_q = len(out["queries"])
    fig.suptitle(f"Reranking, {out['model']}: {n_q} queries x {out['documents'] // n_q} documents")
    fig.tight_layout()
    fig.savefig(str(path), dpi=110)


if __name__ == "__main__":
    raise SystemExit(main())
