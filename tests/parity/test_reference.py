"""The reference path (`parity/reference.py`): Transformers in float32, one item at a time, which every
fast path is checked against; here `SeqClsReference` on our converted sequence classifiers, in this
process and in a child."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import AutoModelForSequenceClassification

import mlx_slm  # noqa: F401  (the optimized BLAS before mlx.core)  # noqa: F401  (the optimized BLAS before mlx.core)
from mlx_slm.models import (
    load_model,
    sequence_logits,
)
from mlx_slm.parity.reference import SeqClsReference
from mlx_slm.text.prompts import encode_texts
from tests.conftest import SEQCLS_LABELS
from tests.forward_parity import check_diff, padded

TOL = 1e-4


LENGTHS = [45, 7, 23, 60]


MAX_DIFF: dict[str, float] = {}  # case -> max |diff| seen (in the run's summary: conftest)


MULTI = "multi_label_classification"


# (arch, num_labels, problem_type, id2label): each architecture single-label, multi-label and
# one label, half of them without id2label (labels LABEL_i), and two more problem types.
CASES = [
    (arch, n, pt, named)
    for i, arch in enumerate(["qwen2", "llama", "qwen3", "gemma3"])
    for j, (n, pt) in enumerate([(3, None), (4, MULTI), (1, None)])
    for named in [(i + j) % 2 == 0]
] + [("qwen2", 3, "single_label_classification", False), ("llama", 1, "regression", True), ("qwen3", 2, None, False)]


def _name(case) -> str:
    arch, n, pt, named = case
    return f"{arch}-{n}-{pt or 'unset'}-{'named' if named else 'plain'}"


def _check(name: str, ours, ref, tol: float = TOL) -> None:
    check_diff(MAX_DIFF, name, ours, ref, tol)


class Tiny:
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


@pytest.fixture(scope="module", params=CASES, ids=_name)
def tiny(request, tiny_arch) -> Tiny:
    return Tiny(request.param, tiny_arch)


def test_reference_path_gives_our_numbers(tiny):
    """SeqClsReference (Transformers on our converted directory, the pipeline's encoding and
    probabilities) against our logits and `SeqClsHead.probabilities`, texts and pairs."""
    m = load_model(tiny.mlx_dir)
    ref = SeqClsReference(tiny.mlx_dir, threads=1)
    assert ref.labels == tiny.labels
    texts = ["I was charged twice", "app crashes on login", "x"]
    pairs = ["refund please", "", "a much longer second text than the first one"]
    for prs in (None, pairs):
        ids, logits, probs = ref.classify(texts, prs)
        assert ids == encode_texts(ref.tokenizer, texts, prs)  # our encoding is the pipeline's
        ours = np.array(sequence_logits(m, *padded(ids, 0)))
        _check(f"{_name(tiny.case)}/reference", ours, logits)
        _check(f"{_name(tiny.case)}/probs", m.seqcls.probabilities(ours), probs)
        assert probs.dtype == np.float64 and probs.shape == (3, len(tiny.labels))
    lg = ref.logits(tiny.prompts[1])
    _check(f"{_name(tiny.case)}/reference", lg, tiny.ref(tiny.prompts[1]))


@pytest.mark.slow
def test_reference_in_a_child_process(tiny_seqcls_mlx):
    """What `parity` will call: Transformers in a child process (no OpenBLAS preload), on ids or on texts."""
    from mlx_slm.parity.reference import seqcls_in_child

    m = load_model(tiny_seqcls_mlx)
    rows = [[5, 9, 30, 2, 77], [12, 13], [40]]
    got = seqcls_in_child(tiny_seqcls_mlx, prompts=rows)
    ours = np.array(sequence_logits(m, *padded(rows, 0)))
    assert got["labels"] == list(m.seqcls.labels) and got["seconds"] > 0
    _check("qwen2-child", ours, got["logits"])
    _check("qwen2-child", m.seqcls.probabilities(ours), got["probs"])
    texts, pairs = ["I was charged twice", "x"], ["refund", ""]
    got = seqcls_in_child(tiny_seqcls_mlx, texts=texts, pairs=pairs)
    from transformers import AutoTokenizer

    assert got["ids"] == encode_texts(AutoTokenizer.from_pretrained(str(tiny_seqcls_mlx)), texts, pairs)
    _check("qwen2-child", np.array(sequence_logits(m, *padded(got["ids"], 0))), got["logits"])
    with pytest.raises(ValueError, match="either prompts"):
        seqcls_in_child(tiny_seqcls_mlx)
