"""The benchmark: every mode on the same model and data, timed in one run.

    python benchmarks/run.py --model qwen2.5-coder-0.5b            # the recorded full run
    python benchmarks/run.py --model smollm2-135m --n 48           # a quick one
    mlx-slm bench --modes hf-item,ours-default --n 24

Each mode gets a warm-up on two items, then is timed over all items. Agreement is with
`hf-item` (Transformers float32, one item at a time, on the converted weight values),
which therefore always runs. Results: a markdown table on stdout, and JSON plus a PNG
chart in the results folder.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from mlx_slm.ground.blas import matmul_peak
from mlx_slm.parity.reference import run_in_child
from mlx_slm.text.labels import softmax

ROOT = Path(__file__).resolve().parent.parent  # the repository: children run `-m benchmarks.harness` from it

MODES = (
    "hf-item",
    "hf-sorted",
    "hf-item-bf16",
    "mlxlm-item",
    "ours-item",
    "ours-arbitrary",
    "ours-sorted",
    "ours-prefix",
    "ours-default",
    "llamacpp-item",
)
DEFAULT_MODES = tuple(m for m in MODES if m != "llamacpp-item")
# Modes that run outside MLX. They run in a child process without our OpenBLAS preload:
# that library, in the global symbol scope, also takes over PyTorch's BLAS calls and,
# with both thread pools on two cores, made Transformers 3.6x slower (measured).
SUBPROCESS_MODES = ("hf-item", "hf-sorted", "hf-item-bf16", "llamacpp-item")
OURS = {
    "ours-item": dict(batch_size=1, use_prefix_cache=False, max_batch_tokens=None),
    "ours-arbitrary": dict(sort=False, use_prefix_cache=False, max_batch_tokens=None),
    "ours-sorted": dict(use_prefix_cache=False, max_batch_tokens=None),
    "ours-prefix": dict(max_batch_tokens=None),
    "ours-default": dict(),
}


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def flops_per_token(config: dict[str, Any]) -> float:
    """Matmul FLOPs per token of a config.json dict, as its architecture counts them (mlx_slm.models)."""
    from mlx_slm.models import flops_per_token as arch_flops

    return arch_flops(config)


class Run:
    def __init__(self, model: str, n: int, batch_size: int):
        from transformers import AutoTokenizer

        from mlx_slm.text.prompts import PromptFormat, render
        from mlx_slm.text.workload import LABELS, sample
        from mlx_slm.weights.sources import local, materialise

        self.path = materialise(model)
        self.source = str(local(model).path)
        self.model_name = model
        self.config = json.loads((self.path / "config.json").read_text())
        self.tok = AutoTokenizer.from_pretrained(str(self.path))
        fmt = PromptFormat()
        _, self.texts, self.ids = sample(self.tok, n, fmt)
        self.labels = LABELS
        self.batch_size = batch_size
        from mlx_slm.text.labels import build_labelset

        self.labelset = build_labelset(self.tok, LABELS, render(self.tok, fmt, "example"))

    # Each mode returns (labels, probs (n, k), processed tokens, padding tokens) for `texts`.
    def hf_item(self, dtype: str = "float32") -> Callable[[list[int]], tuple]:
        from mlx_slm.parity.reference import Reference

        ref = Reference(self.path, dtype=dtype)

        def go(idx: list[int]) -> tuple:
            labs, probs = [], []
            for i in idx:
                s, _ = ref.label_scores(self.ids[i], self.labelset)
                labs.append(self.labels[int(np.argmax(s))])
                probs.append(softmax(s))
            return labs, np.array(probs), sum(len(self.ids[i]) for i in idx), 0

        return go

    def hf_sorted(self) -> Callable[[list[int]], tuple]:
        """The published optimized method: sorted batches of 32, left padding, last-position logits."""
        import torch
        from transformers import AutoModelForCausalLM

        from mlx_slm.text import batching

        if self.labelset.mode != "first-token":
            raise NotImplementedError("hf-sorted implements first-token scoring only")
        m = AutoModelForCausalLM.from_pretrained(str(self.path), dtype=torch.float32).eval()
        torch.set_num_threads(os.cpu_count() or 1)
        rows = torch.tensor(self.labelset.first_ids)
        pad_id = self.tok.pad_token_id or 0

        def go(idx: list[int]) -> tuple:
            seqs = [self.ids[i] for i in idx]
            labs: list[Any] = [None] * len(idx)
            probs = np.zeros((len(idx), len(self.labels)))
            padded = real = 0
            for bidx in batching.plan([len(s) for s in seqs], self.batch_size, None, sort=True):
                b = batching.pad(seqs, bidx, pad_id)
                mask = torch.tensor(b.mask, dtype=torch.long)
                pos = (mask.cumsum(-1) - 1).clamp(min=0)
                with torch.inference_mode():
                    h = m.model(
                        input_ids=torch.tensor(b.ids, dtype=torch.long),
                        attention_mask=mask,
                        position_ids=pos,
                        use_cache=False,
                    ).last_hidden_state[:, -1]
                    z = (h @ m.lm_head.weight[rows].T).double().numpy()
                for r, i in enumerate(bidx):
                    labs[i], probs[i] = self.labels[int(np.argmax(z[r]))], softmax(z[r])
                padded += b.padded_tokens
                real += b.real_tokens
            return labs, probs, padded, padded - real

        return go

    def mlxlm_item(self) -> Callable[[list[int]], tuple]:
        import mlx.core as mx
        from mlx_lm import load

        if self.labelset.mode != "first-token":
            raise NotImplementedError("mlxlm-item implements first-token scoring only")
        m, _ = load(str(self.path))
        m.set_dtype(mx.float32)  # float16 matmuls have no fast CPU kernel in MLX
        rows = mx.array(self.labelset.first_ids)

        def go(idx: list[int]) -> tuple:
            labs, probs = [], []
            for i in idx:
                z = m(mx.array([self.ids[i]]))[0, -1]  # mlx-lm projects every position onto the full vocab
                s = np.array(mx.take(z, rows).astype(mx.float32), dtype=np.float64)
                labs.append(self.labels[int(np.argmax(s))])
                probs.append(softmax(s))
            return labs, np.array(probs), sum(len(self.ids[i]) for i in idx), 0

        return go

    def ours(self, **kw: Any) -> Callable[[list[int]], tuple]:
        from mlx_slm.classifier.classifier import Classifier
        from mlx_slm.engine.engine import Engine
        from mlx_slm.models import load_model

        opts = {"batch_size": self.batch_size, **kw}
        m = load_model(self.path)

        def go(idx: list[int]) -> tuple:
            clf = Classifier(Engine(m, self.tok), self.labels, **opts)  # the timer covers building the prefix cache
            run = clf.run([self.texts[i] for i in idx], window=max(1, len(idx)))
            preds = list(run)
            probs = np.array([[p.probs[lab] for lab in self.labels] for p in preds])
            return [p.label for p in preds], probs, run.stats.processed_tokens, run.stats.padding_tokens

        return go

    def llamacpp_item(self) -> Callable[[list[int]], tuple]:
        from llama_cpp import Llama  # optional: pip install llama-cpp-python

        if self.labelset.mode != "first-token":
            raise NotImplementedError("llamacpp-item implements first-token scoring only")
        llm = Llama(model_path=self.source, n_ctx=1024, n_threads=os.cpu_count(), logits_all=False, verbose=False)
        rows = self.labelset.first_ids

        def go(idx: list[int]) -> tuple:
            labs, probs = [], []
            for i in idx:
                llm.reset()
                llm.eval(self.ids[i])
                z = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float64)[rows]
                labs.append(self.labels[int(np.argmax(z))])
                probs.append(softmax(z))
            return labs, np.array(probs), sum(len(self.ids[i]) for i in idx), 0

        return go

    def make(self, mode: str) -> Callable[[list[int]], tuple]:
        if mode in OURS:
            return self.ours(**OURS[mode])
        return {
            "hf-item": lambda: self.hf_item(),
            "hf-item-bf16": lambda: self.hf_item("bfloat16"),
            "hf-sorted": self.hf_sorted,
            "mlxlm-item": self.mlxlm_item,
            "llamacpp-item": self.llamacpp_item,
        }[mode]()


def _in_child(mode: str, model: str, n: int, batch_size: int) -> tuple:
    """Run one non-MLX mode (warm-up + timed pass) in a clean child process."""
    import tempfile

    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        cmd = [
            "-m",
            "benchmarks.harness",
            "--worker",
            mode,
            "--model",
            model,
            "--n",
            str(n),
            "--batch-size",
            str(batch_size),
            "--json",
            f.name,
        ]
        done = run_in_child(cmd, stdout=sys.stderr, cwd=ROOT)
        if done.returncode == 3:
            raise NotImplementedError(Path(f.name).read_text() or "not available")
        if done.returncode != 0:
            raise RuntimeError(f"{mode} worker failed (exit status {done.returncode})")
        out = json.loads(Path(f.name).read_text())
    return out["labels"], np.array(out["probs"]), out["processed"], out["padding"], out["seconds"]


def _worker(mode: str, model: str, n: int, batch_size: int, path: str) -> int:
    r = Run(model, n, batch_size)
    try:
        go = r.make(mode)
    except (ImportError, NotImplementedError) as e:
        Path(path).write_text(str(e))
        return 3
    idx = list(range(len(r.texts)))
    go(idx[:2])  # warm-up
    t = time.perf_counter()
    labs, probs, processed, padding = go(idx)
    sec = time.perf_counter() - t
    Path(path).write_text(
        json.dumps(
            {
                "labels": labs,
                "probs": np.asarray(probs).tolist(),
                "processed": int(processed),
                "padding": int(padding),
                "seconds": sec,
            }
        )
    )
    return 0


def run(model: str, n: int, modes: list[str], batch_size: int, partial: Path | None = None) -> dict[str, Any]:
    """Time every mode in one process tree; after each mode the rows so far go to `partial`."""
    import mlx.core as mx

    r = Run(model, n, batch_size)
    peak = matmul_peak()
    fpt = flops_per_token(r.config)
    _say(
        f"bench: {len(r.texts)} items, {sum(map(len, r.ids)):,} prompt tokens, model {r.path}; "
        f"matmul peak MLX {peak['mlx']:.0f} / numpy {peak['numpy']:.0f} GFLOP/s"
    )
    order = ["hf-item"] + [m for m in modes if m != "hf-item"]
    idx = list(range(len(r.texts)))
    results: dict[str, dict[str, Any]] = {}
    ref_labels, ref_probs = None, None
    for mode in order:
        _say(f"bench: {mode} ...")
        try:
            if mode in SUBPROCESS_MODES:
                labs, probs, processed, padding, sec = _in_child(mode, model, n, batch_size)
            else:
                go = r.make(mode)
                go(idx[:2])  # warm-up
                t = time.perf_counter()
                labs, probs, processed, padding = go(idx)
                sec = time.perf_counter() - t
        except (ImportError, NotImplementedError) as e:
            _say(f"bench: {mode} skipped ({e})")
            continue
        if mode == "hf-item":
            ref_labels, ref_probs = labs, probs
        # Without the reference (no PyTorch here) a row has timings but no agreement figures.
        agree = None if ref_labels is None else sum(a == b for a, b in zip(labs, ref_labels))
        row = {
            "mode": mode,
            "seconds": round(sec, 2),
            "items_per_s": round(len(idx) / sec, 3),
            "processed_tokens": int(processed),
            "padding_pct": round(100 * padding / processed, 2) if processed else 0.0,
            "agree": agree,
            "total": len(idx),
            "max_abs_dprob": None if ref_probs is None else float(np.abs(probs - ref_probs).max()),
            "gflops": round(fpt * processed / sec / 1e9, 1),
        }
        row["peak_fraction"] = round(row["gflops"] / peak["mlx"], 3)
        results[mode] = row
        _say(
            f"bench: {mode}: {row['seconds']} s, {row['items_per_s']} items/s, agree {agree}/{len(idx)}"
            if agree is not None
            else f"bench: {mode}: {row['seconds']} s, {row['items_per_s']} items/s (no reference)"
        )
        if partial is not None:  # a long run that dies late keeps what it measured
            partial.write_text(json.dumps({"peak": peak, "rows": list(results.values())}, indent=2) + "\n")
    # The peak again at the end: a shared machine's speed drifts during a long run, and a low
    # reading at the start would flatter every row. The fraction uses the higher of the two.
    end = matmul_peak()
    _say(f"bench: matmul peak at the end MLX {end['mlx']:.0f} / numpy {end['numpy']:.0f} GFLOP/s")
    top = max(peak["mlx"], end["mlx"])
    for row in results.values():
        row["peak_fraction"] = round(row["gflops"] / top, 3)
    hf_best = max((results[m]["items_per_s"] for m in ("hf-item", "hf-sorted") if m in results), default=None)
    for row in results.values():
        row["speedup_vs_hf_best"] = round(row["items_per_s"] / hf_best, 3) if hf_best else None
    return {
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(),
            "mlx_device": str(mx.default_device()),
            "matmul_peak_gflops": round(top, 1),
            "matmul_peak_start_gflops": round(peak["mlx"], 1),
            "matmul_peak_end_gflops": round(end["mlx"], 1),
            "numpy_matmul_gflops": round(max(peak["numpy"], end["numpy"]), 1),
            "flops_per_token": fpt,
        },
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["python benchmarks/run.py", *sys.argv[1:]]),
        "model": model,
        "items": len(idx),
        "prompt_tokens": int(sum(map(len, r.ids))),
        "scoring": r.labelset.mode,
        "rows": [results[m] for m in MODES if m in results],  # table order, whatever the run order
    }


def table(res: dict[str, Any]) -> str:
    head = "| mode | seconds | items/s | processed tokens | padding % | speed-up vs best HF f32 | agree | max Δprob | GFLOP/s | of peak |"
    lines = [head, "|" + "---|" * 10]
    for r in res["rows"]:
        speed = "-" if r["speedup_vs_hf_best"] is None else f"{r['speedup_vs_hf_best']:.2f}x"
        agree = "-" if r["agree"] is None else f"{r['agree']}/{r['total']}"
        dprob = "-" if r["max_abs_dprob"] is None else f"{r['max_abs_dprob']:.1e}"
        lines.append(
            f"| {r['mode']} | {r['seconds']:.1f} | {r['items_per_s']:.2f} | {r['processed_tokens']:,} | "
            f"{r['padding_pct']:.1f} | {speed} | {agree} | {dprob} | {r['gflops']:.0f} | {100 * r['peak_fraction']:.0f} % |"
        )
    m = res["machine"]
    lines.append("")
    ends = (
        f", the higher of {m['matmul_peak_start_gflops']} at the start and {m['matmul_peak_end_gflops']} at the end"
        if "matmul_peak_end_gflops" in m
        else ""
    )
    lines.append(
        f"machine: {m['processor']}, {m['cpus']} CPUs, MLX {m['mlx_device']}; float32 matmul peak "
        f"{m['matmul_peak_gflops']} GFLOP/s{ends} (numpy {m['numpy_matmul_gflops']}); {res['items']} items, "
        f"{res['prompt_tokens']:,} prompt tokens, {res['scoring']} scoring; {res['date']}"
    )
    return "\n".join(lines)


def plot(res: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = res["rows"]
    names = [r["mode"] for r in rows]
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.5))
    colors = ["#4c72b0" if n.startswith("ours") else "#999999" for n in names]
    a.barh(names, [r["items_per_s"] for r in rows], color=colors)
    a.set_xlabel("items/s (higher is better)")
    a.invert_yaxis()
    b.barh(names, [r["padding_pct"] for r in rows], color=colors)
    b.set_xlabel("padding, % of processed tokens")
    b.invert_yaxis()
    fig.suptitle(f"{res['model']}, {res['items']} items, {res['machine']['cpus']} CPUs")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="mlx-slm bench",
        description=__doc__,
        epilog="Docs: docs/benchmarks.md",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--n", type=int, default=600, help="length-stratified subsample size (default: all 600)")
    ap.add_argument("--modes", default=",".join(DEFAULT_MODES), help=f"comma-separated, of: {', '.join(MODES)}")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--json", dest="json_path", help="JSON output path (default: results folder)")
    ap.add_argument("--out", "--results", dest="results", default="benchmarks/results", help="results folder")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        return _worker(a.worker, a.model, a.n, a.batch_size, a.json_path)
    modes = [m.strip() for m in a.modes.split(",") if m.strip()]
    bad = [m for m in modes if m not in MODES]
    if bad:
        ap.error(f"unknown mode(s) {', '.join(bad)}; choose from {', '.join(MODES)}")
    out = Path(a.results)
    out.mkdir(parents=True, exist_ok=True)
    partial = out / f"bench-{Path(a.model).name}.partial.json"
    res = run(a.model, a.n, modes, a.batch_size, partial)
    partial.unlink(missing_ok=True)
    stem = f"bench-{Path(a.model).name}-n{res['items']}"
    jpath = Path(a.json_path) if a.json_path else out / f"{stem}.json"
    jpath.write_text(json.dumps(res, indent=2) + "\n")
    md = table(res)
    (out / f"{stem}.md").write_text(f"`{res['command']}`\n\n{md}\n")
    plot(res, out / f"{stem}.png")
    print(md)
    _say(f"bench: wrote {jpath}, {out / (stem + '.md')}, {out / (stem + '.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
