"""A fine-tuned task's inference unfused (LoRA layers over the base weights) against fused (the
adapters merged into the adapted projections), on the same adapters and texts.

    python -m benchmarks.finetune_fused [--model qwen2.5-coder-0.5b] [--n-train 60] [--n 96]
        [--adapt-layers 2] [--max-minutes 2] [--rounds 4]
        [--out benchmarks/results/finetune-fused.json]

`train --finetune lora`'s own code (`jobs.finetune.run_finetune`) fine-tunes the top `--adapt-layers`
blocks on `--n-train` workload tickets for at most `--max-minutes` (a few steps: what is timed
is inference, not accuracy); the task is then run twice on one loaded engine, its "fused" field
false and true (`Classifier.from_task`): each made once (the merge's cost is the fused side's
load), warmed up once (the shared prompt head cached), then `classify` of `--n` other workload
tickets timed alternately A, B, A, B, ... `--rounds` times each. Reported: each side's median
and all its times, the ratio of medians, the largest probability difference between the two,
and the machine's matmul peak at the start and the end (a busy machine shows there).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

import mlx_slm  # noqa: F401  (BLAS before mlx)
from benchmarks.record import run_line, run_record
from mlx_slm.ground.blas import matmul_peak
from mlx_slm.weights.registry import DEFAULT_MODEL


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--n-train", type=int, default=60)
    ap.add_argument("--n", type=int, default=96)
    ap.add_argument("--adapt-layers", type=int, default=2)
    ap.add_argument("--max-minutes", type=float, default=2.0)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--out", default="benchmarks/results/finetune-fused.json")
    a = ap.parse_args(argv)
    from mlx_slm.classifier.classifier import Classifier
    from mlx_slm.classifier.plan import Plan
    from mlx_slm.classifier.task import Task
    from mlx_slm.engine.engine import Engine
    from mlx_slm.files.readers import ReadSpec
    from mlx_slm.jobs.finetune import run_finetune
    from mlx_slm.jobs.train import TrainRun
    from mlx_slm.text.prompts import DEFAULT_SYSTEM, DEFAULT_TEMPLATE
    from mlx_slm.text.workload import tickets
    from mlx_slm.weights.finetune import FinetuneSettings
    from mlx_slm.weights.registry import ModelRef

    peak0 = matmul_peak()["mlx"]
    every = tickets(a.n_train + a.n)
    train, texts = every[: a.n_train], [t for t, _ in every[a.n_train :]]
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        (d / "train.jsonl").write_text("".join(json.dumps({"text": t, "label": g}) + "\n" for t, g in train))
        s = FinetuneSettings(layers=a.adapt_layers, epochs=2, max_minutes=a.max_minutes)
        t0 = time.perf_counter()
        data = str(d / "train.jsonl")
        plan = Plan(ModelRef(a.model), DEFAULT_SYSTEM, DEFAULT_TEMPLATE, read=ReadSpec().for_input(data),
                    save_task=str(d / "task.json"))  # fmt: skip
        _, tuned = run_finetune(TrainRun(data, plan), s)
        train_s = time.perf_counter() - t0
        task = Task.load(d / "task.json")
        engine = Engine.load(a.model)
        clfs, load_s = {}, {}
        for name, fused in (("unfused", False), ("fused", True)):
            t0 = time.perf_counter()
            clfs[name] = Classifier.from_task(
                Task.from_dict({**task.to_dict(), "finetune": {**task.to_dict()["finetune"], "fused": fused}}),
                engine=engine,
            )
            load_s[name] = time.perf_counter() - t0
        probs = {}
        for name, clf in clfs.items():  # warm-up: the prompt head's KV cached, the kernels compiled
            probs[name] = np.array([[p.probs[lab] for lab in clf.labels] for p in clf.classify(texts)])
        times: dict[str, list[float]] = {"unfused": [], "fused": []}
        for _ in range(a.rounds):
            for name in ("unfused", "fused"):
                t0 = time.perf_counter()
                clfs[name].classify(texts)
                times[name].append(round(time.perf_counter() - t0, 3))
    peak1 = matmul_peak()["mlx"]
    med = {k: float(np.median(v)) for k, v in times.items()}
    out = {
        **run_record("benchmarks.finetune_fused", a.model, argv, peak0, peak1),
        "n_train": a.n_train,
        "n": a.n,
        "adapt_layers": a.adapt_layers,
        "lora": {"rank": tuned.lora.rank, "keys": list(tuned.lora.keys), "layers": list(tuned.lora.layers)},
        "train_seconds": round(train_s, 1),
        "steps": sum(e.steps for e in tuned.history),
        "stopped": tuned.stopped,
        "load_seconds": {k: round(v, 3) for k, v in load_s.items()},
        "seconds": times,
        "median_seconds": med,
        "fused_over_unfused": round(med["fused"] / med["unfused"], 3),
        "max_abs_dprob": float(np.abs(probs["fused"] - probs["unfused"]).max()),
    }
    table = [
        "| inference | median s | runs (s) | items/s | load s |",
        "|---|---|---|---|---|",
        *(
            f"| {k} | {med[k]:.2f} | {', '.join(f'{x:.2f}' for x in times[k])} | {a.n / med[k]:.1f} | {load_s[k]:.2f} |"
            for k in ("unfused", "fused")
        ),
    ]
    md = "\n".join(
        [
            f"Fused / unfused inference time (ratio of medians): **{out['fused_over_unfused']}**; "
            f"max |d prob| {out['max_abs_dprob']:.2g}. {a.n} workload tickets, adapters (rank {tuned.lora.rank}) on "
            f"{a.adapt_layers} blocks, alternated A/B {a.rounds} times.",
            "",
            *table,
            "",
            run_line(out),
        ]
    )
    print(md)
    path = Path(a.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2) + "\n")
    path.with_suffix(".md").write_text(md + "\n")
    _plot(times, path.with_suffix(".png"))


def _plot(times: dict[str, list[float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3))
    for i, (name, v) in enumerate(times.items()):
        ax.scatter([i] * len(v), v, label=name)
        ax.hlines(np.median(v), i - 0.2, i + 0.2, colors="black")
    ax.set_xticks(range(len(times)), list(times))
    ax.set_ylabel("seconds to classify")
    ax.set_title("fine-tuned task: unfused vs fused (median: bar)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
