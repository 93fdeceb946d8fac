"""The reference path (`parity/reference.py`): Transformers in float32, one item at a time, which every
fast path is checked against; here `SeqClsReference` on our converted sequence classifiers, in this
process and in a child."""

from __future__ import annotations

import numpy as np
import pytest

import mlx_slm  # noqa: F401  (the optimized BLAS before mlx.core)
from mlx_slm.models import (
    load_model,
    sequence_logits,
)
from mlx_slm.parity.reference import SeqClsReference
from mlx_slm.text.prompts import encode_texts
from tests.forward_parity import check_diff, padded
from tests.seqcls_cases import CASES, Tiny
from tests.seqcls_cases import case_name as _name

TOL = 1e-4


MAX_DIFF: dict[str, float] = {}  # case -> max |diff| seen (in the run's summary: conftest)


def _check(name: str, ours, ref, tol: float = TOL) -> None:
    check_diff(MAX_DIFF, name, ours, ref, tol)


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
