"""A sequence-classification checkpoint: items/s of ours against Transformers' text-classification pipeline.

    python -m benchmarks.seqcls [--model qwen2.5-coder-0.5b] [--quick] [--out benchmarks/results]
        [--n 96] [--head labels|yesno] [--labels billing,technical,account] [--batch 32]

The checkpoint is built from `--model` as the `Qwen3-Reranker-*-seq-cls` conversions are
built: a `*ForSequenceClassification` (Qwen2ForSequenceClassification for the default model)
whose backbone is the model's own and whose `score.weight` is made of LM-head rows: one row
per label, the first token of each of `--labels` (`--head labels`, the default: 3 labels,
softmax), or one label, the `yes` row minus the `no` row (`--head yesno`: a sigmoid score).
Transformers' `save_pretrained` writes it once into the cache (`MLX_SLM_HOME`, by default
~/.cache/mlx-slm, under bench/); `Classifier.load(path)` converts it as any checkpoint, and
the pipeline loads the same folder in float32: both run the same weight values.

The texts: `--n` workload tickets (`mlx_slm.text.workload.tickets`), stratified by length (in
workload order, as a user hands them over). Rows: ours (`Classifier.load(path)`, the default
batching: length-sorted, token-budgeted batches), the pipeline at batch size 1 and at
`--batch` (it pads each batch, in input order, to its longest). Reported: seconds, items/s,
tokens processed and padding, the speed-up over each pipeline row, labels equal to the
pipeline at batch 1 and the largest |probability difference|. Transformers runs in a child
process without our OpenBLAS preload (see `reference.run_in_child`). `--quick`: 8 tickets,
and the full run planned (tokens, minutes at this run's per-token rates).

Results: `--out`/seqcls.{json,md,png}.
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
HEADS = ("labels", "yesno")


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def texts_of(n: int) -> list[str]:
    """`n` of the 600 workload tickets, spread evenly over their lengths, in workload order."""
    from mlx_slm.text.workload import stratified_sample, tickets

    all_t = [t for t, _ in tickets(600)]
    return [all_t[i] for i in stratified_sample([len(t.split()) for t in all_t], n)]


def checkpoint(model: str, head: str, labels: Sequence[str], cache: Path) -> tuple[Path, float]:
    """The sequence-classification checkpoint built from `model` (see the module docstring),
    made once under the cache's lock (a child process builds it: `build`): (its folder, the
    seconds building took, 0 when it was there)."""
    from mlx_slm.weights.registry import cache_lock
    from mlx_slm.weights.sources import materialise

    src = materialise(model)
    key = hashlib.sha256(json.dumps([str(src.resolve()), head, list(labels)]).encode()).hexdigest()[:10]
    dst = cache / f"{src.name}-seqcls-{head}-{key}"
    if (dst / "config.json").is_file():
        return dst, 0.0
    t = time.perf_counter()
    with cache_lock(dst.name, f"building {dst.name}"):
        if not (dst / "config.json").is_file():
            say(f"seqcls: building the checkpoint (once) -> {dst}")
            in_child("benchmarks.seqcls", {"build": True, "src": str(src), "dst": str(dst), "head": head,
                                           "labels": list(labels)})  # fmt: skip
    return dst, time.perf_counter() - t


def build(job: dict[str, Any]) -> None:
    """A `*ForSequenceClassification` of the causal LM `src`: its backbone, `score.weight` from
    its LM-head rows, saved (with the tokenizer) by `save_pretrained` in the LM's own dtype,
    into a temporary folder renamed into place (an interrupted build leaves nothing)."""
    import shutil

    import torch
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

    lm = AutoModelForCausalLM.from_pretrained(job["src"], dtype="auto").eval()
    tok = AutoTokenizer.from_pretrained(job["src"])
    dtype = next(lm.parameters()).dtype
    rows = lm.get_output_embeddings().weight.detach()

    def first(word: str) -> int:
        return int(tok(word, add_special_tokens=False)["input_ids"][0])

    if job["head"] == "yesno":  # one label: the log-odds of yes over no, as the seq-cls conversions
        labels = ["yes"]
        score = (rows[first("yes")].float() - rows[first("no")].float())[None].to(dtype)
    else:
        labels = list(job["labels"])
        ids = [first(lab) for lab in labels]
        if len(set(ids)) != len(ids):
            raise SystemExit(f"the labels {labels} do not start with different tokens ({ids}): pick others")
        score = rows[ids].clone()
    cfg = lm.config
    cfg.architectures = [type(lm).__name__.replace("ForCausalLM", "ForSequenceClassification")]
    cfg.num_labels = len(labels)
    cfg.id2label = dict(enumerate(labels))
    cfg.label2id = {lab: i for i, lab in enumerate(labels)}
    cfg.problem_type = "single_label_classification" if len(labels) > 1 else None
    cfg.pad_token_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    sc = AutoModelForSequenceClassification.from_config(cfg, dtype=dtype).eval()
    sc.model.load_state_dict(lm.model.state_dict())
    with torch.no_grad():
        sc.score.weight.copy_(score)
    dst = Path(job["dst"])
    tmp = dst.with_name(f"{dst.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    sc.save_pretrained(str(tmp))
    tok.save_pretrained(str(tmp))
    os.replace(tmp, dst)


def pipeline_rows(path: Path, texts: list[str], batches: Sequence[int]) -> dict[str, Any]:
    """The text-classification pipeline at each batch size, in a child (see `worker`)."""
    return in_child("benchmarks.seqcls", {"path": str(path), "texts": texts, "batches": list(batches)})


def pipeline_worker(job: dict[str, Any]) -> dict[str, Any]:
    """Transformers' `pipeline("text-classification")` in float32 on the checkpoint: at each
    batch size a warm-up on two texts, then every text timed; each label's probability
    (`top_k=None`: all of them, the pipeline's default function: softmax, or a sigmoid for one label)."""
    import torch
    from transformers import pipeline
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    torch.set_num_threads(os.cpu_count() or 1)
    pipe = pipeline("text-classification", model=job["path"], dtype=torch.float32, device="cpu")
    cfg = pipe.model.config
    labels = [cfg.id2label[i] for i in range(cfg.num_labels)]
    texts = job["texts"]
    out: dict[str, Any] = {"labels": labels}
    for bs in job["batches"]:
        pipe(texts[:2], batch_size=bs, top_k=None)  # warm-up
        t = time.perf_counter()
        got = pipe(texts, batch_size=bs, top_k=None)
        secs = time.perf_counter() - t
        probs = [[{d["label"]: d["score"] for d in g}[lab] for lab in labels] for g in got]
        out[str(bs)] = {"seconds": secs, "probs": probs}
    return out


def worker(job_path: str, out_path: str) -> int:
    job = json.loads(Path(job_path).read_text())
    if job.get("build"):
        build(job)
        Path(out_path).write_text("{}")
    else:
        Path(out_path).write_text(json.dumps(pipeline_worker(job)))
    return 0


def in_order_padded(lengths: Sequence[int], batch: int) -> int:
    """Tokens of batches of `batch` in input order, each padded to its longest (the pipeline's)."""
    return sum(len(c) * max(c) for c in (lengths[i : i + batch] for i in range(0, len(lengths), batch)))


def planned(clf: Any, lengths: Sequence[int], batches: Sequence[int]) -> dict[str, int]:
    """Each row's tokens for prompts of `lengths`: ours under its batch plan (length-sorted,
    budgeted), the pipeline's in input order."""
    from mlx_slm.text.batching import padding_stats, plan

    b = clf.batching
    cap = b.max_padding if b.sort else None  # the pipeline cuts sorted batches by their padding too
    ours = padding_stats(lengths, plan(lengths, b.batch_size, b.max_batch_tokens, b.sort, max_padding=cap))[1]
    return {"ours": ours, **{f"pipeline-b{n}": in_order_padded(list(lengths), n) for n in batches}}


def ours(clf: Any, texts: list[str]) -> tuple[list[Any], dict[str, Any], float]:
    t0 = time.perf_counter()
    run = clf.run(texts, window=max(1, len(texts)))
    preds = list(run)
    secs = time.perf_counter() - t0
    bad = [p for p in preds if not p.ok]
    if bad:
        raise SystemExit(f"ticket {bad[0].index}: {bad[0].error}")
    return preds, run.stats.as_dict(), secs


def main(argv: list[str] | None = None) -> int:
    from mlx_slm.weights.registry import cache_dir

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b", help="the causal LM the checkpoint is built from")
    ap.add_argument("--quick", action="store_true", help=f"{QUICK_N} tickets, and the full run planned")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    ap.add_argument("--n", type=int, help=f"tickets (default {FULL_N}; --quick {QUICK_N})")
    ap.add_argument("--head", choices=HEADS, default="labels", help="labels: a row per label; yesno: one label")
    ap.add_argument("--labels", default="billing,technical,account", help="--head labels: the labels")
    ap.add_argument("--batch", type=int, default=32, help="the pipeline's batched row: its batch size")
    ap.add_argument("--cache", type=Path, default=cache_dir() / "bench", help="where the checkpoint is built")
    ap.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        return worker(*a.worker)
    if a.n is None:
        a.n = QUICK_N if a.quick else FULL_N
    return run(a, argv)


def run(a: argparse.Namespace, argv: list[str] | None) -> int:
    from mlx_slm.classifier.classifier import Classifier
    from mlx_slm.ground.blas import matmul_peak

    wall = time.perf_counter()
    peak0 = matmul_peak()["mlx"]
    labels = [x.strip() for x in a.labels.split(",") if x.strip()]
    path, build_s = checkpoint(a.model, a.head, labels, a.cache)
    t = time.perf_counter()
    # Converted in the dtype it was saved in (float16 for the default model, as its conversion):
    # our weight values are then exactly the pipeline's (which loads them in float32).
    saved = json.loads((path / "config.json").read_text()).get("dtype")
    clf = Classifier.load(str(path), dtype="float32" if saved == "float32" else None)
    load_s = time.perf_counter() - t
    if clf.spec.name != "seqcls":
        raise SystemExit(f"{path} loaded as a {clf.spec.name} classifier, not its own score head")
    texts = texts_of(a.n)
    lengths = [len(it.ids) for it in clf.prepare(texts)]
    say(f"seqcls: {len(texts)} tickets, {sum(lengths):,} tokens, labels {list(clf.labels)}; checkpoint {path}")
    ours(clf, texts[:2])  # warm-up
    preds, st, secs = ours(clf, texts)
    say(f"seqcls: ours: {secs:.1f} s, {st['processed_tokens']:,} tokens processed")
    got = np.array([[p.probs[lab] for lab in clf.labels] for p in preds])
    rows: dict[str, dict[str, Any]] = {
        "ours": {"seconds": secs, "processed_tokens": st["processed_tokens"], "stats": st}
    }
    probs = {"ours": got}
    batches = [1, a.batch] if a.batch != 1 else [1]
    hf = pipeline_rows(path, texts, batches)
    if hf["labels"] != list(clf.labels):
        raise SystemExit(f"the pipeline's labels {hf['labels']} are not ours {list(clf.labels)}")
    plan = planned(clf, lengths, batches)
    for n in batches:
        name = f"pipeline-b{n}"
        rows[name] = {"seconds": hf[str(n)]["seconds"], "processed_tokens": plan[name]}
        probs[name] = np.array(hf[str(n)]["probs"])
        say(f"seqcls: {name}: {rows[name]['seconds']:.1f} s")
    rows["ours"]["planned_tokens"] = plan["ours"]  # the plan is what ran (else the full run's plan means little)
    if plan["ours"] != st["processed_tokens"]:
        say(f"seqcls: ours processed {st['processed_tokens']:,} tokens, its plan {plan['ours']:,}")
    peak1 = matmul_peak()["mlx"]
    ref = probs["pipeline-b1"]
    for name, r in rows.items():
        p = probs[name]
        r.update(
            row=name, items=len(texts), seconds=round(r["seconds"], 2), items_per_s=round(len(texts) / r["seconds"], 3)
        )
        r["padding_pct"] = round(100 * (1 - sum(lengths) / r["processed_tokens"]), 2)
        same = p.argmax(1) == ref.argmax(1) if p.shape[1] > 1 else (p[:, 0] >= 0.5) == (ref[:, 0] >= 0.5)
        r["labels_equal"] = f"{int(same.sum())}/{len(texts)}"
        r["max_prob_diff"] = float(np.abs(p - ref).max())
    for r in rows.values():
        r["x_pipeline"] = {m: round(r["items_per_s"] / rows[m]["items_per_s"], 3) for m in rows if m != "ours"}
    out = {
        **run_record("benchmarks.seqcls", a.model, argv, peak0, peak1),
        "checkpoint": {
            "built_from": a.model,
            "head": a.head,
            "labels": list(clf.labels),
            "architecture": clf.spec.head.architecture,
            "folder": str(path),
        },
        "texts": len(texts),
        "prompt_tokens": sum(lengths),
        "rows": list(rows.values()),
    }
    if a.n != FULL_N:
        full = texts_of(FULL_N)
        full_plan = planned(clf, [len(it.ids) for it in clf.prepare(full)], batches)
        timed = sum(r["seconds"] for r in rows.values())
        untimed = time.perf_counter() - wall - timed - build_s - load_s
        mins = (untimed + sum(r["seconds"] / r["processed_tokens"] * full_plan[n] for n, r in rows.items())) / 60
        out["full_run"] = {"tickets": FULL_N, "planned_tokens": full_plan, "minutes": round(mins, 1)}
        say(
            f"seqcls: the full run (python -m benchmarks.seqcls --model {a.model}) would process "
            f"{full_plan['ours']:,} tokens in ours and take about {mins:.0f} min at this run's rates (matmul peak "
            f"here {max(peak0, peak1):.0f} GFLOP/s), once the checkpoint is built and converted"
        )
    write(out, a.out)
    return 0


def write(out: dict[str, Any], folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "seqcls.json").write_text(json.dumps(out, indent=2) + "\n")
    c = out["checkpoint"]
    pipes = [r["row"] for r in out["rows"] if r["row"] != "ours"]
    lines = [
        f"# A sequence-classification checkpoint against Transformers' pipeline ({out['model']}, {out['date']})",
        "",
        run_line(out),
        "",
        f"The checkpoint: a {c['architecture']} built from {c['built_from']} (its backbone; `score.weight` "
        f"from its LM-head rows: {', '.join(c['labels'])}). {out['texts']} workload tickets stratified by length, "
        f"{out['prompt_tokens']:,} tokens. Labels and probabilities compared with pipeline-b1.",
        "",
        "| row | seconds | items/s | tokens processed | padding % | "
        + " | ".join(f"x {p}" for p in pipes)
        + " | labels equal | max prob diff |",
        "|---|---|---|---|---|" + "---|" * len(pipes) + "---|---|",
    ]
    for r in out["rows"]:
        xs = " | ".join(f"{r['x_pipeline'][p]}" for p in pipes)
        lines.append(
            f"| {r['row']} | {r['seconds']} | {r['items_per_s']} | {r['processed_tokens']:,} | {r['padding_pct']} | "
            f"{xs} | {r['labels_equal']} | {r['max_prob_diff']:.1e} |"
        )
    if "full_run" in out:
        f = out["full_run"]
        lines += [
            "",
            f"The full run ({f['tickets']} tickets), planned: ours {f['planned_tokens']['ours']:,} tokens; about "
            f"{f['minutes']} minutes at this run's rates.",
        ]
    (folder / "seqcls.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    plot(out, folder / "seqcls.png")


def plot(out: dict[str, Any], path: Path) -> None:
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        print("matplotlib missing: no PNG (pip install 'mlx-slm[bench]')", file=sys.stderr)
        return
    rows = out["rows"]
    names = [r["row"] for r in rows]
    colors = ["#4c72b0" if n == "ours" else "#999999" for n in names]
    fig = Figure(figsize=(11, 3.5))
    FigureCanvasAgg(fig)
    a, b = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    a.barh(names, [r["items_per_s"] for r in rows], color=colors)
    a.set_xlabel("items/s (higher is better)")
    a.invert_yaxis()
    b.barh(names, [r["processed_tokens"] for r in rows], color=colors)
    b.axvline(out["prompt_tokens"], color="k", ls=":", label="prompt tokens (no padding)")
    b.set_xlabel("tokens processed")
    b.invert_yaxis()
    b.legend(fontsize=8)
    c = out["checkpoint"]
    fig.suptitle(
        f"{c['architecture']} built from {c['built_from']} ({len(c['labels'])} labels), {out['texts']} tickets"
    )
    fig.tight_layout()
    fig.savefig(str(path), dpi=110)


if __name__ == "__main__":
    raise SystemExit(main())
