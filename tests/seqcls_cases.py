"""The tiny sequence-classification checkpoints the loader's and the reference path's tests share:
every case (architecture, labels, problem type, with or without id2label) and, per case, the
Transformers model with prompts that hold pad ids where Transformers reads them as tokens."""

from __future__ import annotations

import json

import numpy as np
import torch
from transformers import AutoModelForSequenceClassification

from mlx_slm.text.workload import tickets
from tests.conftest import SEQCLS_LABELS

LENGTHS = [45, 7, 23, 60]
MULTI = "multi_label_classification"
# (arch, num_labels, problem_type, id2label): each architecture single-label, multi-label and
# one label, half of them without id2label (labels LABEL_i), and two more problem types.
CASES = [
    (arch, n, pt, named)
    for i, arch in enumerate(["qwen2", "llama", "qwen3", "gemma3"])
    for j, (n, pt) in enumerate([(3, None), (4, MULTI), (1, None)])
    for named in [(i + j) % 2 == 0]
] + [("qwen2", 3, "single_label_classification", False), ("llama", 1, "regression", True), ("qwen3", 2, None, False)]


def case_name(case) -> str:
    arch, n, pt, named = case
    return f"{arch}-{n}-{pt or 'unset'}-{'named' if named else 'plain'}"


class Tiny:
    """One case: its Hugging Face and converted folders, Transformers' model, labels and prompts."""

    def __init__(self, case, models):
        self.case = case
        arch, n, pt, named = case
        self.hf_dir = models.seqcls_hf(arch, n, pt, named)
        self.mlx_dir = models.seqcls_mlx(arch, n, pt, named)
        self.hf = AutoModelForSequenceClassification.from_pretrained(str(self.hf_dir), dtype=torch.float32).eval()
        self.labels = SEQCLS_LABELS[n] if named else tuple(f"LABEL_{i}" for i in range(n))
        self.pad = self.hf.config.pad_token_id
        rng = np.random.default_rng(11)
        vocab = self.hf.config.vocab_size
        self.prompts = [[int(x) for x in rng.integers(3, vocab, size=k)] for k in LENGTHS]
        self.prompts[1] += [self.pad, self.pad]  # trailing pad tokens: Transformers reads past them
        self.prompts[2][5] = self.pad  # a pad id inside the text: read as any token

    def ref(self, ids) -> np.ndarray:
        with torch.no_grad():
            return self.hf(torch.tensor([list(ids)]), use_cache=False).logits[0].numpy()


# The front ends' and parity's rows on the three head forms (architecture, outputs, problem type).
FORMS = {"label": ("qwen2", 3, None, True), "multi": ("llama", 4, MULTI, True), "score": ("qwen3", 1, None, True)}
GOLD = ("negative", "neutral", "positive")
_T = [t for t, _ in tickets(60)]


def seqcls_rows(n: int = 30, gold: bool = False) -> list[dict]:
    """n rows, every third with a text_pair, row 7 empty (an error row); `gold`: a label each."""
    rows = []
    for i in range(n):
        r = {"id": i, "text": "" if i == 7 else _T[i][: 10 + (i * 31) % 140]}
        if i % 3 == 0:
            r["text_pair"] = _T[-1 - i][:40]
        if gold:
            r["label"] = GOLD[i % 3]
        rows.append(r)
    return rows


def write_jsonl(path, rows) -> str:
    """`rows` as JSONL at `path`; the path as a string (a CLI argument)."""
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)
