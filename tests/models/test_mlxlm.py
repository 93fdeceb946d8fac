"""Architectures only mlx-lm covers, run through its own model class (mlx_slm/models/mlxlm.py).

Tiny random Hugging Face checkpoints of families our registry does not cover are built
here with Transformers' configs (non-default RoPE bases in transformers 5's
`rope_parameters`, varied norms and biases), converted, loaded through the registry's
fallback, and compared with Transformers float32 one prompt at a time: the last-position
logits over the whole vocabulary, max |diff| <= 1e-3, (a) unbatched, (b) in a left-padded
batch, (c) after a prefix KV cache and along label continuations, (d) through the
`Classifier` (prefix cache, buckets, sequence scoring; labels equal). The refused families
are refused with their reason, and one reason (Gemma 2's batch mask) is measured here.

    phi3    fused qkv and gate/up projections, untied head
    olmo2   RMSNorm after attention and MLP, q/k norms over the whole projection
    stablelm  partial rotary (a quarter of each head, from `rope_parameters`), LayerNorm, q/k/v biases
    cohere  parallel attention + MLP, LayerNorm, tied head scaled by logit_scale (the head
            replays mlx-lm's own tail on the label rows)
"""

from __future__ import annotations

import json
import shutil

import mlx.core as mx
import numpy as np
import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

import mlx_slm  # noqa: F401  (the optimized BLAS before mlx.core)
from mlx_slm.ground.errors import ModelError
from mlx_slm.models import get_model_class, load_model, mlxlm
from mlx_slm.weights.convert import ConversionError, convert
from tests.conftest import make_tokenizer
from tests.forward_parity import HFLogits, check_diff, padded, prefix_batch_continuation

FAMILIES = ["phi3", "olmo2", "stablelm", "cohere"]
TOL = 1e-3
LENGTHS = [45, 7, 23, 60]
MAX_DIFF: dict[str, float] = {}  # family/case -> max |diff| seen (in the run's summary: conftest)
EXTRA = {"cohere": dict(logit_scale=0.5), "stablelm": dict(use_qkv_bias=True)}


@pytest.fixture(autouse=True, scope="module")
def _on_cpu():
    prev = mx.default_device()
    mx.set_default_device(mx.cpu)
    yield
    mx.set_default_device(prev)


def tiny_config(family: str, tok, **extra):
    """A tiny random config of `family` on `tok`'s vocabulary (3 layers, 4 heads over 2 KV heads of
    16, no BOS), with `extra` over it: the checkpoints of this file's and the loader's tests."""
    return AutoConfig.for_model(
        family,
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=1024,
        initializer_range=0.15,
        pad_token_id=tok.pad_token_id,
        bos_token_id=None,
        **extra,
    )


def make_hf(out, family: str, **extra):
    """A random tiny checkpoint of `family`, saved as a Hugging Face directory (float32)."""
    tok = make_tokenizer(out)
    cfg = tiny_config(family, tok, eos_token_id=tok.eos_token_id, **{**EXTRA.get(family, {}), **extra})
    rp = getattr(cfg, "rope_parameters", None)
    if isinstance(rp, dict) and "rope_theta" in rp:
        rp["rope_theta"] = 54321.0  # not mlx-lm's default: a config read wrong shows
    torch.manual_seed(sum(map(ord, family)))
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.mul_(1 + 0.2 * torch.randn_like(p))
            if name.endswith("bias"):
                p.normal_(0, 0.2)
    model.save_pretrained(str(out), safe_serialization=True)
    return model


class Tiny:
    def __init__(self, family, tmp):
        self.family = family
        self.hf = make_hf(tmp / "hf", family)
        self.mlx_dir = convert(tmp / "hf", tmp / "mlx", dtype="float32", progress=None)
        from transformers import AutoTokenizer

        self.tok = AutoTokenizer.from_pretrained(str(self.mlx_dir))
        vocab = json.loads((self.mlx_dir / "config.json").read_text())["vocab_size"]
        rng = np.random.default_rng(7)
        self.prompts = [rng.integers(3, vocab, size=n).tolist() for n in LENGTHS]
        self.ref = HFLogits(self.hf)


@pytest.fixture(scope="module", params=FAMILIES)
def tiny(request, tmp_path_factory) -> Tiny:
    return Tiny(request.param, tmp_path_factory.mktemp(f"fallback-{request.param}"))


@pytest.fixture(scope="module")
def model(tiny):
    return load_model(tiny.mlx_dir)


def _check(name: str, ours, ref, tol: float = TOL) -> None:
    check_diff(MAX_DIFF, name, ours, ref, tol)


def test_loads_through_mlx_lm_with_a_note(tiny, capfd):
    m = load_model(tiny.mlx_dir)
    err = capfd.readouterr().err
    note = [line for line in err.splitlines() if "fast path does not cover" in line]
    assert len(note) == 1 and f"'{tiny.family}'" in note[0] and f"mlx_lm.models.{tiny.family}" in note[0]
    assert isinstance(m, mlxlm.MlxLmModel) and m.supports_prefix
    assert m.args.max_position_embeddings == 1024 and m.compute_dtype == m.head_weight().dtype == mx.float32
    cls, args_cls = get_model_class(tiny.family)  # the registry's (Model, ModelArgs) for it
    cfg = json.loads((tiny.mlx_dir / "config.json").read_text())
    assert issubclass(cls, mlxlm.MlxLmModel) and cls(args_cls.from_dict(cfg)).lm_class is type(m.lm)
    with pytest.raises(ModelError, match="native ops only"):
        load_model(tiny.mlx_dir, ops="fastmath")


def test_unbatched_and_left_padded_match_transformers(tiny, model):
    for ids in tiny.prompts:
        h, _ = model(mx.array([ids]))
        _check(f"{tiny.family}/a", np.array(model.logits(h))[0], tiny.ref(ids))
    ids = tiny.prompts[-1]
    h, _ = model(mx.array([ids]), last_only=False)
    _check(f"{tiny.family}/a-all", np.array(model.logits(h))[0], tiny.ref(ids, last=False))
    ids, mask, offs = padded(tiny.prompts, pad_id=5)
    h, _ = model(ids, mask, offs)
    got = np.array(model.logits(h))
    for r, p in enumerate(tiny.prompts):
        _check(f"{tiny.family}/b", got[r], tiny.ref(p))
    rows = mx.array([3, 17, 200])  # label rows only: the full head's numbers (logit scale included)
    np.testing.assert_allclose(np.array(model.logits(h, rows)), got[:, [3, 17, 200]], atol=1e-5)


def test_prefix_cache_and_continuation_match_transformers(tiny, model):
    prefix_batch_continuation(model, tiny.prompts, tiny.ref, _check, f"{tiny.family}/c-prefix", f"{tiny.family}/c-cont")


def test_classifier_path_matches_transformers(tiny, model):
    from mlx_slm.classifier.classifier import Classifier
    from mlx_slm.engine.engine import Engine
    from mlx_slm.parity.reference import Reference
    from mlx_slm.text.workload import tickets

    texts = [t for t, _ in tickets(9)][3:9]
    clf = Classifier(
        Engine(model, tiny.tok), ["ab", "ac", "b", "a"], keep_logits=True, batch_size=4, max_batch_tokens=None
    )
    assert clf.prefix is not None and clf.mode == "sequence"
    preds = clf.classify(texts)
    items = clf.prepare(texts)
    ref = Reference(tiny.mlx_dir, threads=1)
    for p, item in zip(preds, items):
        assert p.ok, p.error
        _check(f"{tiny.family}/d-clf", p.logits, tiny.ref(item.ids))
        s, _ = ref.label_scores(item.ids, clf.labelset)
        assert clf.labels[int(np.argmax(s))] == p.label
        ours = np.array([p.scores[lab] for lab in clf.labels])
        _check(f"{tiny.family}/d-scores", ours - ours.mean(), s - s.mean())


def test_self_check_passes_and_is_tight(model):
    assert mlxlm.self_check(model) < 1e-5


def test_quantized_conversion_matches_mlx_lm(tmp_path):
    """`convert --quantize` for a fallback family: mlx-lm's loader quantizes the layers it packed;
    kept packed, the logits are mlx-lm's own forward's (same dtype); dequantized (the CPU
    default), the labels are."""
    from mlx_lm.utils import load_model as mlx_lm_load

    make_hf(tmp_path / "hf", "phi3")
    out = convert(tmp_path / "hf", tmp_path / "q8", quantize=8, group_size=32, progress=None)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["quantization"] == {"group_size": 32, "bits": 8, "mode": "affine"}
    ref, _ = mlx_lm_load(out, model_config=mlxlm.normalize_config(cfg))  # mlx-lm reads transformers 4 RoPE fields
    rng = np.random.default_rng(3)
    prompts = [rng.integers(3, cfg["vocab_size"], size=n).tolist() for n in (30, 9, 17)]
    want = [np.array(ref(mx.array([p]))[0, -1].astype(mx.float32)) for p in prompts]
    packed = load_model(out, keep_quantized=True, dtype=mx.float16)
    assert type(packed.lm.model.layers[0].mlp.gate_up_proj).__name__ == "QuantizedLinear"
    assert packed.quantized == "8-bit (group 32)" and packed.compute_dtype == mx.float16
    dense = load_model(out)
    assert dense.quantized is None and dense.compute_dtype == mx.float32 and dense.head_weight().dtype == mx.float32
    for m, tol in ((packed, 1e-6), (dense, 0.1)):
        ids, mask, offs = padded(prompts, 0)
        got = np.array(m.logits(m(ids, mask, offs)[0]).astype(mx.float32))
        for r, w in enumerate(want):
            assert np.abs(got[r] - w).max() <= tol and np.argmax(got[r]) == np.argmax(w)


# --------------------------------------------------------------------------- refusals


def _with_type(src, dst, model_type, **changes):
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg.update(model_type=model_type, **changes)
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


@pytest.mark.parametrize("family", sorted(mlxlm.UNSUPPORTED))
def test_unsupported_families_are_refused_with_the_reason(family, tiny_qwen_hf, tmp_path):
    why = mlxlm.UNSUPPORTED[family]
    bad = _with_type(tiny_qwen_hf, tmp_path / "hf", family)
    with pytest.raises(ConversionError, match="not supported: " + why[:30]):
        convert(bad, tmp_path / "out", progress=None)
    assert not (tmp_path / "out").exists()
    with pytest.raises(ModelError, match="not supported: " + why[:30]):
        load_model(bad)
    with pytest.raises(ModelError, match=why[:30]):
        get_model_class(family)


def test_config_refusals_and_unknown_types(tiny_qwen_hf, tmp_path):
    # Mistral's sliding window slides every layer; mlx-lm's llama class cannot
    bad = _with_type(tiny_qwen_hf, tmp_path / "mistral", "mistral", sliding_window=16)
    with pytest.raises(ConversionError, match="cannot slide every layer"):
        convert(bad, tmp_path / "out", progress=None)
    # neither ours nor mlx-lm's
    with pytest.raises(ModelError, match="unsupported architecture 'bert'; supported: qwen2, llama"):
        get_model_class("bert")
    bad = _with_type(tiny_qwen_hf, tmp_path / "bert", "bert")
    with pytest.raises(ConversionError, match="'bert'"):
        convert(bad, tmp_path / "out", progress=None)
    # recurrent state: mlx-lm knows mamba, the per-row KV cache cannot hold it
    args = mlxlm.model_args(
        {
            "model_type": "mamba",
            "vocab_size": 32,
            "hidden_size": 16,
            "intermediate_size": 32,
            "state_size": 4,
            "num_hidden_layers": 1,
            "conv_kernel": 4,
            "use_bias": False,
            "use_conv_bias": True,
            "time_step_rank": 2,
        }
    )
    with pytest.raises(ModelError, match="ArraysCache|MambaCache"):
        mlxlm.MlxLmModel(args, mlxlm.get_classes({"model_type": "mamba"})[0](args))


def test_gemma2_reason_is_measured(tmp_path, monkeypatch):
    """Why gemma2 is listed: let it through, and the load-time probe finds a padded row wrong."""
    make_hf(tmp_path / "hf", "gemma2", sliding_window=16, final_logit_softcapping=5.0)
    monkeypatch.delitem(mlxlm.UNSUPPORTED, "gemma2")
    out = convert(tmp_path / "hf", tmp_path / "mlx", dtype="float32", progress=None)
    with pytest.raises(ModelError, match="differs from mlx-lm.s own forward"):
        load_model(out)
