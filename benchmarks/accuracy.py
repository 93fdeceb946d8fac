"""Accuracy benchmark: how right are the labels, by calibration method, zero- and few-shot.

    python -m benchmarks.accuracy [--model qwen2.5-coder-0.5b] [--out benchmarks/results] [--n-fit 60]

Each data set is classified once per prompt (zero-shot, few-shot) with the raw scores
kept; every calibration method is then applied to those same raw scores with the
library's own functions (what `--calibrate` runs; tests/classifier/test_calibrate.py checks
that the CLI gives exactly these). Data sets:

* `workload`: the 600-ticket benchmark workload (gold 200/200/200, 3 labels);
* `skew-*`: 200-item subsets of it with the labels in 70/20/10 % proportions, all six
  orders (`skew-billing` = 70 % billing, the model's own bias; the rest against it);
* `tickets`: benchmarks/data/support_tickets.jsonl (355 hand-labelled tickets, 6 labels).

Methods: `none` (raw), `batch` (prior = the input's mean label distribution), `fit`
(per-label offsets fitted on `--n-fit` labelled items drawn from the balanced set and
left out of every figure), `em` (Saerens EM on the input, with the `fit` offsets as the
model's measured bias). Results: JSON, markdown and a PNG in `--out`.
"""

from __future__ import annotations

import argparse
import itertools
import json
import platform
import time
from pathlib import Path

import numpy as np

import mlx_slm  # noqa: F401  (BLAS before mlx)
from mlx_slm.text.calibration import DEFAULT_WARMUP, fit_batch, fit_em, fit_labelled, gold_indices
from mlx_slm.text.labels import log_softmax
from mlx_slm.text.metrics import confusion, ece, macro_f1
from mlx_slm.text.prompts import DEFAULT_LABELS, DEFAULT_SYSTEM, DEFAULT_TEMPLATE
from mlx_slm.text.workload import tickets

DATA = Path(__file__).parent / "data"
TICKET_LABELS = ("billing", "technical", "account", "shipping", "cancellation", "feedback")
TICKET_SYSTEM = (
    "You classify customer support tickets. Answer with exactly one of: "
    "billing, technical, account, shipping, cancellation, feedback."
)
METHODS = ("none", "batch", "fit", "em")


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]


def raw_scores(clf, texts: list[str]) -> tuple[np.ndarray, float]:
    t0 = time.perf_counter()
    preds = list(clf.classify_iter(texts))
    secs = time.perf_counter() - t0
    bad = [p for p in preds if not p.ok]
    if bad:
        raise SystemExit(f"item {bad[0].index}: {bad[0].error}")
    return log_softmax([[p.scores[k] for k in clf.labels] for p in preds]), secs


def figures(lp: np.ndarray, gold: np.ndarray) -> dict:
    pred = lp.argmax(1)
    conf = np.exp(lp.max(1))
    k = lp.shape[1]
    return {
        "n": int(len(gold)),
        "accuracy": round(float((pred == gold).mean()), 4),
        "macro_f1": round(float(macro_f1(confusion(gold, pred, k))), 4),
        "ece": round(float(ece(conf, pred == gold)), 4),
        "predicted": np.bincount(pred, minlength=k).tolist(),
    }


def evaluate_methods(lp: np.ndarray, gold: np.ndarray, labels, fit_idx: np.ndarray, eval_idx: np.ndarray) -> dict:
    """All methods on the items `eval_idx`; `fit` learns from `fit_idx` (disjoint) only."""
    fitted = fit_labelled(lp[fit_idx], gold[fit_idx], labels)
    x, g = lp[eval_idx], gold[eval_idx]
    out = {
        "none": figures(x, g),
        "batch": figures(fit_batch(x, labels).apply(x), g),
        "fit": figures(fitted.apply(x), g),
        "em": figures(fit_em(x, labels, base=fitted).apply(x), g),
    }
    out["fit"]["cv_accuracy_calibrated"] = fitted.info.get("cv_accuracy_calibrated")
    return out


def warmup_study(lp: np.ndarray, gold: np.ndarray, labels, sizes=(16, 32, 64, 128, 256, 512), orders: int = 20) -> dict:
    """Batch calibration on a stream: the prior from the first N items, over random input orders.

    Accuracy is over every item (the warm-up items are calibrated with the same prior)."""
    rng = np.random.default_rng(1)
    out = {}
    for n in (n for n in sizes if n < len(gold)):
        accs = []
        for _ in range(orders):
            first = rng.permutation(len(gold))[:n]
            accs.append(float((fit_batch(lp[first], labels).apply(lp).argmax(1) == gold).mean()))
        out[str(n)] = {"mean": round(float(np.mean(accs)), 4), "worst": round(float(np.min(accs)), 4)}
    out["all"] = {"mean": figures(fit_batch(lp, labels).apply(lp), gold)["accuracy"]}
    return out


def skewed_subsets(gold: np.ndarray, exclude: set, labels, n: int = 200, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    shares = (0.7, 0.2, 0.1)
    smallest = min(sum(1 for i in np.flatnonzero(gold == k) if i not in exclude) for k in range(len(labels)))
    n = min(n, int(smallest / shares[0]))
    out = {}
    for order in itertools.permutations(range(len(labels))):
        idx = []
        for lab, share in zip(order, shares):
            pool = np.array([i for i in np.flatnonzero(gold == lab) if i not in exclude])
            idx += list(rng.choice(pool, int(round(share * n)), replace=False))
        out["skew-" + "/".join(labels[i] for i in order)] = np.array(sorted(idx))
    return out


def main(argv: list[str] | None = None) -> int:
    from mlx_slm.classifier.classifier import Classifier

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--n-fit", type=int, default=60, help="labelled items the fit method learns from")
    ap.add_argument("--limit", type=int, default=None, help="first N items of each set (a quick look)")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    work = tickets()[: args.limit]
    sup = _jsonl(DATA / "support_tickets.jsonl")[: args.limit]
    shots = [(e["text"], e["label"]) for e in _jsonl(DATA / "support_examples.jsonl")]
    sets = {
        "workload": (
            DEFAULT_LABELS,
            DEFAULT_SYSTEM,
            DEFAULT_TEMPLATE,
            [t for t, _ in work],
            [lab for _, lab in work],
            [s for s in shots if s[1] in DEFAULT_LABELS],
        ),
        "tickets": (
            TICKET_LABELS,
            TICKET_SYSTEM,
            DEFAULT_TEMPLATE,
            [r["text"] for r in sup],
            [r["label"] for r in sup],
            shots,
        ),
    }
    results: dict = {
        "model": args.model,
        "machine": f"{platform.machine()}, {platform.system()}",
        "n_fit": args.n_fit,
        "runs": {},
        "all_items": {},
        "warmup": {},
        "timing": {},
    }
    rng = np.random.default_rng(0)
    for name, (labels, system, template, texts, gold_names, examples) in sets.items():
        gold = gold_indices(gold_names, labels)
        fit_idx = np.sort(
            np.concatenate(
                [
                    rng.choice(np.flatnonzero(gold == k), args.n_fit // len(labels), replace=False)
                    for k in range(len(labels))
                ]
            )
        )
        eval_idx = np.setdiff1d(np.arange(len(gold)), fit_idx)
        for shot, ex in (("zero-shot", ()), ("few-shot", tuple(examples))):
            clf = Classifier.load(args.model, labels, system, template, examples=ex)
            lp, secs = raw_scores(clf, texts)
            results["timing"][f"{name}/{shot}"] = {
                "items": len(texts),
                "seconds": round(secs, 1),
                "items_per_s": round(len(texts) / secs, 3),
                "prefix_tokens": len(clf.prefix) if clf.prefix else 0,
            }
            print(f"{name} {shot}: {len(texts)} items in {secs:.1f} s ({len(texts) / secs:.2f} items/s)", flush=True)
            results["runs"][f"{name}/{shot}"] = evaluate_methods(lp, gold, labels, fit_idx, eval_idx)
            # The methods that need no labels, on every item: batch with the prior from the whole
            # input, and as `classify --calibrate batch` runs it (prior from the first 512 in input order).
            results["all_items"][f"{name}/{shot}"] = {
                "none": figures(lp, gold),
                "batch": figures(fit_batch(lp, labels).apply(lp), gold),
                "batch_warmup_512": figures(fit_batch(lp[:DEFAULT_WARMUP], labels).apply(lp), gold),
            }
            if name == "workload":
                results["warmup"][shot] = warmup_study(lp, gold, labels)
            if name == "workload":
                for sname, idx in skewed_subsets(gold, set(fit_idx.tolist()), labels).items():
                    results["runs"][f"{sname}/{shot}"] = evaluate_methods(lp, gold, labels, fit_idx, idx)
    (out / "accuracy.json").write_text(json.dumps(results, indent=2) + "\n")
    md = _markdown(results, " ".join(["python -m benchmarks.accuracy", *(argv or [])]))
    (out / "accuracy.md").write_text(md)
    print(md)
    _plot(results, out / "accuracy.png")
    return 0


def _markdown(r: dict, cmd: str) -> str:
    lines = [
        f"# Accuracy by calibration method ({r['model']}, {r['machine']})",
        "",
        f"`{cmd}`; `fit` and `em` learn from {r['n_fit']} labelled items of the balanced set, left out of every row.",
        "",
        "| data set | prompt | n | none acc / F1 | batch acc / F1 | fit acc / F1 | em acc / F1 | ECE none / batch / fit |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for key, m in r["runs"].items():
        name, shot = key.split("/", 1) if key.count("/") == 1 else (key.rsplit("/", 1)[0], key.rsplit("/", 1)[1])
        cells = " | ".join(f"{100 * m[k]['accuracy']:.1f} % / {m[k]['macro_f1']:.2f}" for k in METHODS)
        lines.append(
            f"| {name} | {shot} | {m['none']['n']} | {cells} | "
            f"{m['none']['ece']:.2f} / {m['batch']['ece']:.2f} / {m['fit']['ece']:.2f} |"
        )
    lines += [
        "",
        "Every item (the methods that need no labels; `batch, warm-up 512` is what "
        "`classify --calibrate batch` gives: the prior from the first 512 items in input order):",
        "",
        "| data set | prompt | n | none acc / F1 | batch (whole input) acc / F1 | batch, warm-up 512 acc / F1 |",
        "|---|---|---|---|---|---|",
    ]
    for key, m in r["all_items"].items():
        name, shot = key.rsplit("/", 1)
        cells = " | ".join(
            f"{100 * m[k]['accuracy']:.1f} % / {m[k]['macro_f1']:.2f}" for k in ("none", "batch", "batch_warmup_512")
        )
        lines.append(f"| {name} | {shot} | {m['none']['n']} | {cells} |")
    for shot, w in r["warmup"].items():
        lines += [
            "",
            f"Warm-up size for batch calibration on a stream (workload, {shot}; 20 random orders; "
            "accuracy over all items):",
            "",
            "| warm-up items | mean | worst |",
            "|---|---|---|",
        ]
        for n, v in w.items():
            worst = f"{100 * v['worst']:.1f} %" if "worst" in v else ""
            lines.append(f"| {n} | {100 * v['mean']:.1f} % | {worst} |")
    lines += ["", "| run | items | seconds | items/s | prefix tokens |", "|---|---|---|---|---|"]
    for key, t in r["timing"].items():
        lines.append(f"| {key} | {t['items']} | {t['seconds']} | {t['items_per_s']} | {t['prefix_tokens']} |")
    return "\n".join(lines) + "\n"


def _plot(r: dict, path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    keys = list(r["runs"])
    fig = Figure(figsize=(max(8, 0.9 * len(keys)), 4.5))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    w = 0.8 / len(METHODS)
    for j, m in enumerate(METHODS):
        ax.bar(np.arange(len(keys)) + j * w, [100 * r["runs"][k][m]["accuracy"] for k in keys], w, label=m)
    ax.set_xticks(np.arange(len(keys)) + 0.4 - w / 2)
    ax.set_xticklabels([k.replace("/", "\n") for k in keys], fontsize=6, rotation=60)
    ax.set_ylabel("accuracy (%)")
    ax.set_ylim(0, 100)
    ax.legend(ncol=4, fontsize=8)
    ax.set_title(f"Accuracy by calibration method ({r['model']})")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    raise SystemExit(main())
