import mlx.core as mx
import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from mlx_slm.models import FASTMATH, NATIVE, Model, ModelArgs, build_mask, choose_ops, load_model
from tests.forward_parity import padded


@pytest.fixture(autouse=True, scope="module")
def _on_cpu():
    """Exactness is checked on the CPU in float32 (where the fastmath ops run)."""
    prev = mx.default_device()
    mx.set_default_device(mx.cpu)
    yield
    mx.set_default_device(prev)


def hf_logits(path, ids):
    m = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    with torch.no_grad():
        return m(torch.tensor([ids])).logits[0].numpy()


IDS = [5, 17, 42, 99, 3, 250, 7, 81, 64, 12, 300, 2, 9]


def test_forward_matches_transformers(tiny_mlx):
    m = load_model(tiny_mlx)
    ref = hf_logits(tiny_mlx, IDS)
    h, _ = m(mx.array([IDS]), last_only=False)
    ours = np.array(m.logits(h))[0]
    assert np.abs(ours - ref).max() < 1e-4
    # last_only computes only the final position, and must equal it
    h_last, _ = m(mx.array([IDS]))
    assert np.abs(np.array(m.logits(h_last))[0] - ref[-1]).max() < 1e-4


def test_label_rows_equal_full_head(tiny_mlx):
    m = load_model(tiny_mlx)
    h, _ = m(mx.array([IDS]))
    rows = mx.array([7, 3, 200])
    full = np.array(m.logits(h))
    part = np.array(m.logits(h, rows))
    np.testing.assert_allclose(part, full[:, [7, 3, 200]], atol=1e-5)


SEQS = [IDS, IDS[4:], IDS[:3], [11]]


@pytest.mark.parametrize("pad_id", [0, 123])
def test_left_padded_batch_equals_rows_alone(tiny_mlx, pad_id):
    m = load_model(tiny_mlx)
    ids, mask, offs = padded(SEQS, pad_id)
    h, _ = m(ids, mask, offs)
    batched = np.array(m.logits(h))
    for r, s in enumerate(SEQS):
        alone, _ = m(mx.array([s]))
        np.testing.assert_allclose(batched[r], np.array(m.logits(alone))[0], atol=2e-5)


def test_pad_token_ids_change_nothing(tiny_mlx):
    m = load_model(tiny_mlx)
    outs = []
    for pad in (0, 1, 399):
        ids, mask, offs = padded(SEQS, pad)
        h, _ = m(ids, mask, offs)
        outs.append(np.array(m.logits(h)))
    np.testing.assert_allclose(outs[0], outs[1], atol=1e-6)
    np.testing.assert_allclose(outs[0], outs[2], atol=1e-6)


def test_prefix_cache_composes_with_padding(tiny_mlx):
    m = load_model(tiny_mlx)
    prefix = IDS[:5]
    suffixes = [IDS[5:], IDS[5:8], [44]]
    _, kv = m(mx.array([prefix]))
    kv_before = [(np.array(k), np.array(v)) for k, v in kv]
    ids, mask, offs = padded(suffixes, 0, cache_len=len(prefix))
    h, _ = m(ids, mask, offs, cache=kv)
    batched = np.array(m.logits(h))
    for r, s in enumerate(suffixes):
        alone, _ = m(mx.array([prefix + s]))
        np.testing.assert_allclose(batched[r], np.array(m.logits(alone))[0], atol=2e-5)
    for (k0, v0), (k1, v1) in zip(kv_before, kv):  # the shared cache is untouched
        np.testing.assert_array_equal(k0, np.array(k1))
        np.testing.assert_array_equal(v0, np.array(v1))


def test_padding_rows_stay_finite_without_prefix(tiny_mlx):
    m = load_model(tiny_mlx)
    ids, mask, offs = padded([IDS, [4]], 0)
    h, kv = m(ids, mask, offs, last_only=False)
    assert np.isfinite(np.array(h)).all()


def test_build_mask_shapes_and_semantics():
    am = mx.array([[0, 1, 1], [1, 1, 1]])
    m = np.array(build_mask(am, None, 2, last_only=False))
    assert m.shape == (2, 1, 3, 5)
    assert m[0, 0, 2].tolist() == [True, True, False, True, True]  # padding key hidden
    assert m[0, 0, 0].tolist() == [True, True, True, False, False]  # padded query sees itself
    assert m[1, 0, 0].tolist() == [True, True, True, False, False]  # causal


def test_matches_mlx_lm_forward(tiny_mlx):
    from mlx_lm import load as mlxlm_load

    ref_model, _ = mlxlm_load(str(tiny_mlx))
    ref = np.array(ref_model(mx.array([IDS]))[0].astype(mx.float32))
    m = load_model(tiny_mlx)
    h, _ = m(mx.array([IDS]), last_only=False)
    np.testing.assert_allclose(np.array(m.logits(h))[0], ref, atol=1e-4)


def test_unsupported_architecture_refused():
    with pytest.raises(ValueError, match="supported: qwen2, llama, qwen3, gemma3"):
        ModelArgs.from_dict(
            {
                "model_type": "gpt2",
                "hidden_size": 8,
                "num_hidden_layers": 1,
                "intermediate_size": 8,
                "num_attention_heads": 2,
                "num_key_value_heads": 2,
                "vocab_size": 10,
            }
        )


def test_float16_weights_upcast_on_cpu(tiny_hf, tmp_path):
    from mlx_slm.weights.convert import convert

    out = convert(tiny_hf, tmp_path / "f16", dtype="float16", progress=None)
    m = load_model(out)
    assert m.head_weight().dtype == mx.float32
    assert isinstance(m, Model)


def test_fastmath_ops_equal_native_ops(tiny_mlx):
    """numpy SiLU/softmax (the CPU float32 default, chosen at load) against MLX's native ops,
    padded batch with a prefix."""
    m = load_model(tiny_mlx)
    assert m.ops is choose_ops(mx.float32, mx.cpu) is FASTMATH
    _, kv = m(mx.array([IDS[:5]]))
    ids, mask, offs = padded([IDS[5:], [44, 45]], 0, cache_len=5)
    outs = []
    for ops in (FASTMATH, NATIVE):
        m.ops = ops
        h, _ = m(ids, mask, offs, cache=kv)
        outs.append(np.array(m.logits(h)))
    np.testing.assert_allclose(outs[0], outs[1], atol=2e-5)
    assert load_model(tiny_mlx, ops="native").ops is NATIVE
