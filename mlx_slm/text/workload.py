"""The 600-ticket support-ticket workload of the benchmark (SPEC.md), reconstructed.

It reproduces the published statistics: under the Qwen2.5 tokenizer the prompts are
48 / 94 / 449 tokens (min / median / max), 73,555 in all.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .prompts import PromptFormat, render, tokenize

LABELS = ("billing", "technical", "account")
BASE_TICKETS = (
    ("My card was charged twice for the same invoice.", "billing"),
    ("The mobile app crashes whenever I open the settings page.", "technical"),
    ("I need to change the email address on my profile.", "account"),
)
FILLER = (
    "I have been waiting for a response for several days now and would really appreciate "
    "an update on this whenever someone gets a chance to look at it."
).split()


def tickets(n: int = 600, seed: int = 0) -> list[tuple[str, str]]:
    """(text, gold label) for the first `n` tickets."""
    rng = np.random.default_rng(seed)
    n_words = np.clip(rng.lognormal(np.log(60), 0.9, size=n), 12, 400).astype(int)
    out = []
    for i in range(n):
        base, label = BASE_TICKETS[i % 3]
        words = base.split()
        while len(words) < n_words[i]:
            words += FILLER
        out.append((" ".join(words[: n_words[i]]), label))
    return out


def stratified_sample(lengths: list[int] | np.ndarray, n: int) -> list[int]:
    """Indices of `n` items spread evenly over the length-sorted order (keeps the distribution)."""
    lengths = np.asarray(lengths)
    if n >= len(lengths):
        return list(range(len(lengths)))
    order = np.argsort(lengths, kind="stable")
    picks = order[np.linspace(0, len(lengths) - 1, n).round().astype(int)]
    return sorted(int(i) for i in picks)


def sample(tokenizer: Any, n: int, fmt: Any = None) -> tuple[list[int], list[str], list[list[int]]]:
    """A length-stratified sample of `n` workload tickets: (indices, texts, prompt ids).

    The prompts are rendered with `fmt` (default: the default prompt) and tokenized, and
    the sample keeps the workload's length distribution (parity checks and benchmarks)."""

    fmt = fmt or PromptFormat()
    texts = [t for t, _ in tickets()]
    ids = tokenize(tokenizer, [render(tokenizer, fmt, t) for t in texts])
    keep = stratified_sample([len(x) for x in ids], n)
    return keep, [texts[i] for i in keep], [ids[i] for i in keep]
