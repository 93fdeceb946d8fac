"""The estimator tests' labelled tickets and prompt (shared; the `data` fixture is in conftest.py)."""

from __future__ import annotations

import numpy as np

from mlx_slm.text.workload import tickets

LABELS = ("billing", "technical", "account")
SYSTEM, TEMPLATE = "You classify tickets into {labels}.", "Ticket: {text}\nCategory:"


def labelled(n_per: int = 8, skip: int = 0) -> list[tuple[str, str]]:
    """`n_per` workload tickets of each label (after the first `skip`), shuffled with a fixed seed."""
    by: dict[str, list[str]] = {lab: [] for lab in LABELS}
    for t, lab in tickets(400)[skip:]:
        if len(by[lab]) < n_per:
            by[lab].append(t)
    rows = [(t, lab) for lab in LABELS for t in by[lab]]
    rng = np.random.default_rng(0)
    return [rows[i] for i in rng.permutation(len(rows))]


def train_and_test() -> tuple[list[str], list[str], list[str]]:
    """Ten tickets of each label with their labels, and twelve other tickets to predict."""
    rows = labelled(10)
    seen = {t for t, _ in rows}
    test = [t for t, _ in tickets(400) if t not in seen][:12]
    return [t for t, _ in rows], [lab for _, lab in rows], test
