"""The 600-ticket benchmark workload (SPEC.md) and the check of its published statistics.

python -m benchmarks.workload                  # statistics under the Qwen2.5 tokenizer
python -m benchmarks.workload --jsonl t.jsonl  # the workload as classify input
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mlx_slm.text.batching import padding_stats, plan
from mlx_slm.text.prompts import PromptFormat, render, tokenize
from mlx_slm.text.workload import LABELS, stratified_sample, tickets

__all__ = ["LABELS", "tickets", "stratified_sample", "prompt_lengths", "check_statistics"]


def prompt_lengths(tokenizer: Any) -> list[int]:
    fmt = PromptFormat()
    return [len(x) for x in tokenize(tokenizer, [render(tokenizer, fmt, t) for t, _ in tickets()])]


def check_statistics(tokenizer: Any) -> dict[str, float]:
    n = prompt_lengths(tokenizer)
    real = sum(n)
    _, sorted_padded = padding_stats(n, plan(n, 32, sort=True))
    _, arb_padded = padding_stats(n, plan(n, 32, sort=False))
    return {
        "min": min(n),
        "median": int(np.median(n)),
        "max": max(n),
        "total": real,
        "global_max_ratio": len(n) * max(n) / real,
        "sorted32_padding_pct": 100 * (sorted_padded - real) / sorted_padded,
        "arbitrary32_padding_pct": 100 * (arb_padded - real) / arb_padded,
    }


def write_jsonl(path: str) -> None:
    """The workload as classify input: id, text and the gold label (`label`, what eval reads)."""
    import json

    with open(path, "w", encoding="utf-8") as f:
        for i, (text, label) in enumerate(tickets()):
            f.write(json.dumps({"id": i, "text": text, "label": label}) + "\n")


def score(tickets_path: str, predictions_path: str) -> str:
    import json

    gold = {json.loads(x)["id"]: json.loads(x)["label"] for x in open(tickets_path, encoding="utf-8")}
    preds = [json.loads(x) for x in open(predictions_path, encoding="utf-8")]
    right = sum(1 for p in preds if p.get("label") == gold.get(p["id"]))
    errors = sum(1 for p in preds if "error" in p)
    return f"{len(preds)} predictions, {errors} errors, {right}/{len(gold)} equal to the gold label"


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jsonl", metavar="PATH", help="write the workload as JSONL (id, text, label) and exit")
    ap.add_argument("--score", nargs=2, metavar=("TICKETS", "PREDICTIONS"), help="compare predictions with gold")
    args = ap.parse_args()
    if args.jsonl:
        write_jsonl(args.jsonl)
    elif args.score:
        print(score(*args.score))
    else:
        from transformers import AutoTokenizer

        from mlx_slm.weights.sources import fetch_gguf

        g = fetch_gguf("qwen2.5-coder-0.5b")
        for k, v in check_statistics(AutoTokenizer.from_pretrained(str(g.parent), gguf_file=g.name)).items():
            print(f"{k:26s} {v:.4g}" if isinstance(v, float) else f"{k:26s} {v}")
