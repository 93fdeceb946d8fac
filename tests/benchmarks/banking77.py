"""A BANKING77-shaped folder for the rerank and sequence-classification benchmarks' tests."""

from __future__ import annotations

import csv

INTENTS = [f"intent_{k}" for k in range(9)]


def fake_banking77(folder, train_per_intent: int = 10):
    """A BANKING77-shaped folder: train.csv and test.csv (text, category), 9 intents."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, n in (("train.csv", train_per_intent), ("test.csv", 3)):
        with open(folder / name, "w", newline="", encoding="utf-8") as f:
            w = csv.writer(f)
            w.writerow(["text", "category"])
            for k, intent in enumerate(INTENTS):
                for i in range(n):
                    w.writerow([f"{name[:-4]} message {i} about my card {k} " + "please " * ((i + k) % 4), intent])
    return folder
