"""Many labels: cost and accuracy against label count, on BANKING77's intents.

    python -m benchmarks.many_labels ../shared/data/banking77 [--model qwen2.5-coder-0.5b]
        [--counts 3,10,20,40,77] [--per-label 3] [--before-n 8] [--out benchmarks/results]

For each label count c: c intents drawn at random (seed 0; the 77 are all of them), their
names with underscores as spaces as the labels (`card arrival`, `lost or stolen card`: most
are several tokens, so sequence scoring), `--per-label` test messages of each (the first
ones in the file), one classifier run. Accuracy raw and with batch calibration (the
library's own `fit_batch` on the raw scores), items/s, tokens run, and the floor: the
seconds the run's tokens need at the measured matmul peak (prompt and trie tokens x the
model's FLOPs per token, + the vocabulary projection at every trie node).

"Before": the per-label passes (one batched pass per multi-token label: what scoring did
before the trie, kept as `label_pass="per-label"`), on the first `--before-n` messages of
the largest count, side by side with the trie on the same messages in the same process,
alternating (ABBA) so that the machine's drift falls on both.

Results: `--out`/many-labels.{json,md,png}.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from pathlib import Path

import numpy as np

import mlx_slm  # noqa: F401  (BLAS before mlx)
from benchmarks.record import run_line, run_record
from mlx_slm.classifier.classifier import Classifier
from mlx_slm.engine.engine import Engine
from mlx_slm.ground.blas import matmul_peak
from mlx_slm.models import flops_per_token
from mlx_slm.text.calibration import fit_batch
from mlx_slm.text.labels import log_softmax

SYSTEM = "You route messages to a bank's support team. Answer with exactly one of: {labels}."
TEMPLATE = "Message: {text}\nIntent:"


def load_banking(root: Path) -> tuple[list[str], list[tuple[str, str]]]:
    intents = json.loads((root / "categories.json").read_text())
    with open(root / "test.csv", newline="", encoding="utf-8") as f:
        rows = [(r["text"], r["category"]) for r in csv.DictReader(f)]
    return intents, rows


def subset(intents: list[str], rows: list[tuple[str, str]], c: int, per_label: int):
    rng = np.random.default_rng(0)
    chosen = sorted(rng.choice(len(intents), size=c, replace=False).tolist()) if c < len(intents) else range(c)
    names = [intents[i] for i in chosen]
    texts, gold = [], []
    for k, name in enumerate(names):
        mine = [t for t, cat in rows if cat == name][:per_label]
        texts += mine
        gold += [k] * len(mine)
    order = np.random.default_rng(1).permutation(len(texts))  # not grouped by label
    return [n.replace("_", " ") for n in names], [texts[i] for i in order], np.array(gold)[order]


def many_labels(intents: list[str], n: int) -> list[str]:
    """n labels for a parity check: the intents' names, then "<intent> issue" for as many
    more as needed (each one shares all of an intent's tokens: the trie's deepest sharing)."""
    names = [i.replace("_", " ") for i in intents]
    return (names + [f"{x} issue" for x in names])[:n]


def classifier(engine: Engine, labels: list[str], label_pass: str = "trie") -> Classifier:
    return Classifier(engine, labels, SYSTEM.format(labels=", ".join(labels)), TEMPLATE, label_pass=label_pass)


def timed(clf: Classifier, texts: list[str]) -> tuple[np.ndarray, dict, float]:
    run = clf.run(texts, window=len(texts))
    t0 = time.perf_counter()
    preds = list(run)
    secs = time.perf_counter() - t0
    bad = [p for p in preds if not p.ok]
    if bad:
        raise SystemExit(f"item {bad[0].index}: {bad[0].error}")
    return np.array([[p.scores[k] for k in clf.labels] for p in preds]), run.stats.as_dict(), secs


def floor_seconds(engine: Engine, stats: dict, peak_gflops: float) -> float:
    """The run's tokens at the matmul peak: every token through every layer, and the
    vocabulary projection at each trie node (one per label token run)."""
    cfg = engine.model.args
    per_token = flops_per_token(json.loads((engine.path / "config.json").read_text()))
    head = 2.0 * cfg.hidden_size * cfg.vocab_size
    flops = stats["processed_tokens"] * per_token + stats["label_tokens"] * head
    return flops / (peak_gflops * 1e9)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("data", type=Path, help="the BANKING77 folder (categories.json, test.csv)")
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--counts", default="3,10,20,40,77")
    ap.add_argument("--per-label", type=int, default=3)
    ap.add_argument("--before-n", type=int, default=8, help="messages for the per-label side-by-side (0: skip)")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    ap.add_argument(
        "--print-labels", type=int, metavar="N", help="only print N labels, one a line (a --labels-file for parity)"
    )
    ap.add_argument("--print-texts", type=int, metavar="N", help="only print N test messages as JSONL (parity --input)")
    a = ap.parse_args(argv)
    intents, rows = load_banking(a.data)
    if a.print_labels or a.print_texts:
        if a.print_labels:
            print("\n".join(many_labels(intents, a.print_labels)))
        else:
            step = max(1, len(rows) // a.print_texts)
            for i, (t, cat) in enumerate(rows[::step][: a.print_texts]):
                print(json.dumps({"id": i, "text": t, "label": cat.replace("_", " ")}))
        return
    counts = [int(x) for x in a.counts.split(",")]
    engine = Engine.load(a.model)
    peak0 = matmul_peak()["mlx"]
    results = []
    for c in counts:
        labels, texts, gold = subset(intents, rows, c, a.per_label)
        clf = classifier(engine, labels)
        scores, stats, secs = timed(clf, texts)
        lp = log_softmax(scores)
        cal = fit_batch(lp, labels).probs(lp)
        row = {
            "labels": c,
            "texts": len(texts),
            "mode": clf.mode,
            "trie_nodes": clf.labelset.row_tokens,
            "label_tokens_total": int(sum(len(t) for t in clf.labelset.token_ids)),
            "seconds": round(secs, 2),
            "items_per_s": round(len(texts) / secs, 3),
            "accuracy_raw": round(float((lp.argmax(1) == gold).mean()), 4),
            "accuracy_batch": round(float((cal.argmax(1) == gold).mean()), 4),
            "stats": stats,
        }
        results.append(row)
        print(
            f"{c:>3} labels  {len(texts):>4} texts  {row['items_per_s']:.3f} items/s  trie {row['trie_nodes']} nodes  "
            f"raw {row['accuracy_raw']:.3f}  batch {row['accuracy_batch']:.3f}",
            file=sys.stderr,
        )
    before = None
    if a.before_n:
        c = max(counts)
        labels, texts, gold = subset(intents, rows, c, a.per_label)
        texts = texts[: a.before_n]
        runs: dict[str, list[float]] = {"trie": [], "per-label": []}
        got: dict[str, np.ndarray] = {}
        stats_of: dict[str, dict] = {}
        for label_pass in ("trie", "per-label", "per-label", "trie"):  # ABBA
            s, st, secs = timed(classifier(engine, labels, label_pass), texts)
            runs[label_pass].append(secs)
            got[label_pass], stats_of[label_pass] = s, st
            print(f"before/after, {c} labels, {len(texts)} texts: {label_pass} {secs:.1f} s", file=sys.stderr)
        t_trie, t_loop = float(np.median(runs["trie"])), float(np.median(runs["per-label"]))
        diff = float(np.abs(log_softmax(got["trie"]) - log_softmax(got["per-label"])).max())
        before = {
            "labels": c,
            "texts": len(texts),
            "seconds_trie": [round(x, 2) for x in runs["trie"]],
            "seconds_per_label": [round(x, 2) for x in runs["per-label"]],
            "speedup": round(t_loop / t_trie, 2),
            "labels_equal": int((got["trie"].argmax(1) == got["per-label"].argmax(1)).sum()),
            "max_abs_logprob_diff": diff,
            "label_tokens_trie": stats_of["trie"]["label_tokens"],
            "label_tokens_per_label": stats_of["per-label"]["label_tokens"],
        }
    peak1 = matmul_peak()["mlx"]
    peak = max(peak0, peak1)
    for row in results:
        row["floor_seconds"] = round(floor_seconds(engine, row["stats"], peak), 2)
        row["x_floor"] = round(row["seconds"] / row["floor_seconds"], 2)
    out = {
        **run_record("benchmarks.many_labels", a.model, argv, peak0, peak1),
        "rows": results,
        "before": before,
    }
    write(out, a.out)


def write(out: dict, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "many-labels.json").write_text(json.dumps(out, indent=2) + "\n")
    lines = [
        f"# Many labels: BANKING77 ({out['model']}, {out['date']})",
        "",
        run_line(out),
        "",
        "| labels | texts | trie nodes per row | items/s | s | floor s | x floor | raw acc | batch acc |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in out["rows"]:
        lines.append(
            f"| {r['labels']} | {r['texts']} | {r['trie_nodes']} | {r['items_per_s']:.3f} | {r['seconds']:.1f} | "
            f"{r['floor_seconds']:.1f} | {r['x_floor']:.2f} | {r['accuracy_raw']:.3f} | {r['accuracy_batch']:.3f} |"
        )
    b = out["before"]
    if b:
        lines += [
            "",
            f"Before (one batched pass per label) against the trie, {b['labels']} labels, the same {b['texts']} "
            "messages, one process, ABBA:",
            "",
            f"- per-label passes: {b['seconds_per_label']} s ({b['label_tokens_per_label']} label tokens run)",
            f"- trie: {b['seconds_trie']} s ({b['label_tokens_trie']} label tokens run)",
            f"- **{b['speedup']}x** by median; labels equal {b['labels_equal']}/{b['texts']}; "
            f"max |log-prob diff| {b['max_abs_logprob_diff']:.2e}",
        ]
    (folder / "many-labels.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot", file=sys.stderr)
        return
    xs = [r["labels"] for r in out["rows"]]
    fig, ax = plt.subplots(figsize=(5.5, 3.4))
    ax.plot(xs, [r["seconds"] / r["texts"] for r in out["rows"]], "o-", label="trie (measured)")
    ax.plot(xs, [r["floor_seconds"] / r["texts"] for r in out["rows"]], "s--", label="floor at matmul peak")
    if b:
        ax.plot([b["labels"]], [np.median(b["seconds_per_label"]) / b["texts"]], "x", ms=10, label="per-label passes")
    ax.set_xlabel("labels")
    ax.set_ylabel("seconds per message")
    ax.set_yscale("log")
    ax.set_title(f"BANKING77, {out['model']}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(folder / "many-labels.png", dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
