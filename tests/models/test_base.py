"""The blocks every architecture shares (`models/base.py`): the forward against Transformers (one
prompt, left-padded batches, pad ids, a prefix cache), the masks (padding, sliding windows counted in
RoPE positions), the ops chosen once, and every architecture against Transformers on its tiny random
checkpoint (see the section below)."""

import json

import mlx.core as mx
import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

import mlx_slm  # noqa: F401  (the optimized BLAS before mlx.core)
from mlx_slm.models import (
    FASTMATH,
    NATIVE,
    Model,
    ModelArgs,
    build_mask,
    choose_ops,
    load_model,
)
from mlx_slm.weights.convert import convert
from tests.forward_parity import ARCHS, Tiny, check_diff, padded, prefix_batch_continuation


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


# Every architecture (qwen2, llama, qwen3 and gemma3, built in conftest.make_tiny; gemma3 and qwen3 with
# sliding-window layers whose window, 16, is shorter than the prompts) against Transformers, float32:
# the last-position logits over the whole vocabulary, max |diff| <= 1e-3, for one prompt, a left-padded
# batch, the classifier's path (prefix KV cache, buckets, label scoring), the label trie, the features,
# each with the native and the fastmath ops; and GGUF files written here with `gguf.GGUFWriter`
# (llama.cpp's names, permutations and norm shifts) convert back to the same model.
# (Was tests/models/test_architectures.py.)


OPS = ["native", "fastmath"]


TOL = 1e-3


MAX_DIFF: dict[str, float] = {}  # arch/case/ops -> max |diff| seen (in the run's summary: conftest)


@pytest.fixture(scope="module", params=ARCHS)
def tiny(request, tiny_arch) -> Tiny:
    return Tiny(request.param, tiny_arch)


def _check(name: str, ours: np.ndarray, ref: np.ndarray, tol: float = TOL) -> None:
    check_diff(MAX_DIFF, name, ours, ref, tol)


@pytest.mark.parametrize("ops", OPS)
def test_unbatched_matches_transformers(tiny, ops):
    m = load_model(tiny.mlx_dir, ops=ops)
    assert m.ops is (FASTMATH if ops == "fastmath" else NATIVE)
    for ids in tiny.prompts:
        h, _ = m(mx.array([ids]))
        _check(f"{tiny.arch}/a/{ops}", np.array(m.logits(h))[0], tiny.ref(ids))
    ids = tiny.prompts[-1]  # every position too (the non-last-layer path)
    h, _ = m(mx.array([ids]), last_only=False)
    _check(f"{tiny.arch}/a-all/{ops}", np.array(m.logits(h))[0], tiny.ref(ids, last=False))


@pytest.mark.parametrize("ops", OPS)
def test_left_padded_batch_matches_transformers(tiny, ops):
    m = load_model(tiny.mlx_dir, ops=ops)
    ids, mask, offs = padded(tiny.prompts, pad_id=5)
    h, _ = m(ids, mask, offs)
    got = np.array(m.logits(h))
    for r, p in enumerate(tiny.prompts):
        _check(f"{tiny.arch}/b/{ops}", got[r], tiny.ref(p))
    # label rows only: the same numbers as the full head (softcapping included)
    rows = mx.array([3, 17, 200])
    np.testing.assert_allclose(np.array(m.logits(h, rows)), got[:, [3, 17, 200]], atol=1e-5)


@pytest.mark.parametrize("ops", OPS)
def test_prefix_cache_and_padding_match_transformers(tiny, ops):
    """A prefix longer than the window, then a padded batch after it, then label tokens after that."""
    m = load_model(tiny.mlx_dir, ops=ops)
    prefix_batch_continuation(
        m, tiny.prompts, tiny.ref, _check, f"{tiny.arch}/c-model/{ops}", f"{tiny.arch}/c-cont/{ops}"
    )


@pytest.mark.parametrize("ops", OPS)
def test_classifier_path_matches_transformers(tiny, ops):
    from mlx_slm.classifier.classifier import Classifier
    from mlx_slm.engine.engine import Engine
    from mlx_slm.parity.reference import Reference
    from mlx_slm.text.workload import tickets

    texts = [t for t, _ in tickets(9)][3:9]
    clf = Classifier(
        Engine(load_model(tiny.mlx_dir, ops=ops), tiny.tok),
        ["ab", "ac", "b", "a"],
        keep_logits=True,
        batch_size=4,
        max_batch_tokens=None,
    )
    assert clf.prefix is not None and clf.mode == "sequence"
    preds = clf.classify(texts)
    items = clf.prepare(texts)
    assert max(len(it.ids) for it in items) > 40
    ref = Reference(tiny.mlx_dir, threads=1)
    for p, item in zip(preds, items):
        assert p.ok, p.error
        _check(f"{tiny.arch}/c-clf/{ops}", p.logits, tiny.ref(item.ids))
        s, _ = ref.label_scores(item.ids, clf.labelset)
        assert clf.labels[int(np.argmax(s))] == p.label
        ours = np.array([p.scores[lab] for lab in clf.labels])  # raw first logit + continuation: up to a shift
        _check(f"{tiny.arch}/c-scores/{ops}", ours - ours.mean(), s - s.mean())


def _many_label_ids(vocab: int, n_random: int, seed: int = 3) -> list[tuple[int, ...]]:
    """Label token sequences with shared leading tokens (1, 2 and 3 of them), a label that is
    another's prefix, lengths 1 to 8, and `n_random` more over a small alphabet (much sharing)."""
    t = list(range(30, 30 + 26))
    fixed = [
        (t[0],), (t[1],), (t[2],),  # one-token labels, one of them a prefix of two others
        (t[2], t[3]), (t[2], t[4], t[5]),  # share 1 token
        (t[6], t[7], t[8]), (t[6], t[7], t[9], t[10]),  # share 2
        (t[11], t[12], t[13], t[14]), (t[11], t[12], t[13], t[15], t[16], t[17]),  # share 3
        tuple(t[18:26]),  # 8 tokens
    ]  # fmt: skip
    rng = np.random.default_rng(seed)
    alphabet = rng.choice(np.arange(3, vocab), size=9, replace=False)
    out = list(fixed)
    while len(out) < len(fixed) + n_random:
        cand = tuple(int(x) for x in rng.choice(alphabet, size=int(rng.integers(1, 9))))
        if cand not in out:
            out.append(cand)
    return out


@pytest.mark.parametrize(
    "n_random,max_nodes,ops",
    [
        (0, 256, "native"),
        (0, 256, "fastmath"),
        pytest.param(140, 10_000, "fastmath", marks=pytest.mark.slow),
        pytest.param(140, 24, "fastmath", marks=pytest.mark.slow),
    ],
)
def test_label_trie_pass_matches_transformers(tiny, n_random, max_nodes, ops):
    """Many multi-token labels in one packed pass (or chunks of it), through the classifier's
    path (prefix cache, padded buckets with the trie counted in the budget): equal to
    Transformers scoring every label afresh after every prompt, and to the per-label passes."""
    from mlx_slm.classifier.classifier import Classifier
    from mlx_slm.engine.engine import Engine
    from mlx_slm.text.labels import LabelSet, log_softmax
    from mlx_slm.text.workload import tickets

    ids = _many_label_ids(tiny.config["vocab_size"], n_random)
    names = tuple(f"label{k}" for k in range(len(ids)))
    texts = [t for t, _ in tickets(5)][1:5]
    out = {}
    for label_pass in ("trie", "per-label"):
        clf = Classifier(
            Engine(load_model(tiny.mlx_dir, ops=ops), tiny.tok),
            ["a", "b"],
            batch_size=4,
            max_batch_tokens=300,
            label_pass=label_pass,
        )
        clf.kind.labelset = LabelSet(names, tuple(ids), "sequence", max_trie_nodes=max_nodes)
        run = clf.run(texts, window=len(texts))
        out[label_pass] = (list(run), run.stats)
    preds, stats = out["trie"]
    chunks = clf.labelset.trie
    assert (len(chunks) > 1) == (max_nodes < 100) and max(map(len, chunks)) <= max(max_nodes, 7)
    items = clf.prepare(texts)
    assert stats.batches > 1  # the trie's tokens, counted in the 300-token budget, split the 4 rows
    for p, q, item in zip(preds, out["per-label"][0], items):
        assert p.ok, p.error
        first = log_softmax(tiny.ref(item.ids))
        ref = []
        for toks in ids:
            s = first[toks[0]]
            if len(toks) > 1:
                lg = log_softmax(tiny.ref(list(item.ids) + list(toks[:-1]), last=False)[len(item.ids) :])
                s += sum(lg[k, toks[k + 1]] for k in range(len(toks) - 1))
            ref.append(s)
        ref = np.array(ref)
        ours = np.array([p.scores[n] for n in names])
        _check(f"{tiny.arch}/trie-vs-hf", ours - ours.mean(), ref - ref.mean())
        loop = np.array([q.scores[n] for n in names])
        _check(f"{tiny.arch}/trie-vs-loop", ours, loop, 1e-4)
        assert p.label == names[int(np.argmax(ref))] == q.label


@pytest.mark.parametrize("ops", OPS)
def test_features_match_transformers_hidden_states(tiny, ops):
    """Last-position hidden states after chosen layers (a learned head's input), left padded,
    equal Transformers' `hidden_states[l]` of each prompt alone; the forward stops at the deepest."""
    m = load_model(tiny.mlx_dir, ops=ops)
    n = len(m.layers)
    ids, mask, offs = padded(tiny.prompts, pad_id=5)
    for layers in ([n], [1, n - 1], [2]):
        got = np.array(m.features(ids, layers, mask, offs)["last"])
        assert got.shape == (len(tiny.prompts), len(layers), tiny.config["hidden_size"])
        for r, p in enumerate(tiny.prompts):
            with torch.no_grad():
                hs = tiny.hf(torch.tensor([p]), output_hidden_states=True, use_cache=False).hidden_states
            for j, layer in enumerate(layers):
                _check(f"{tiny.arch}/features/{ops}", got[r, j], hs[layer][0, -1].numpy())


def test_sliding_window_matters(tiny):
    """Guard against a vacuous test: on the sliding archs, a full mask gives other logits."""
    if tiny.arch not in ("gemma3", "qwen3"):
        pytest.skip("no sliding layers")
    m = load_model(tiny.mlx_dir, ops="native")
    assert "sliding_attention" in m.args.layer_types and m.args.sliding_window == 16
    ids = tiny.prompts[3]
    m.args.sliding_window = 10_000  # as if every layer saw everything
    try:
        h, _ = m(mx.array([ids]))
    finally:
        m.args.sliding_window = 16
    assert np.abs(np.array(m.logits(h))[0] - tiny.ref(ids)).max() > 1e-2


# --------------------------------------------------------------------------- GGUF


def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf permutation of q/k rows (the inverse of `models.llama.unpermute`)."""
    rows = w.shape[0]
    return w.reshape(n_head, 2, rows // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _write_gguf(tiny: Tiny, path) -> None:
    """The tiny HF model as llama.cpp's convert_hf_to_gguf writes it (float32 tensors)."""
    import gguf

    cfg = tiny.config
    n_layers = cfg["num_hidden_layers"]
    w = gguf.GGUFWriter(str(path), tiny.arch)
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(n_layers)
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_key_length(cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"])
    args = ModelArgs.from_dict(cfg)
    w.add_rope_freq_base(args.rope_theta)
    if tiny.arch == "gemma3":
        w.add_sliding_window(cfg["sliding_window"])
        w.add_sliding_window_pattern([t == "sliding_attention" for t in cfg["layer_types"]])
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(1.0 / args.rope_scale)
        w.add_final_logit_softcapping(cfg["final_logit_softcapping"])
    # tokenizer: the tiny byte-level BPE
    tj = json.loads((tiny.mlx_dir / "tokenizer.json").read_text())
    vocab = sorted(tj["model"]["vocab"].items(), key=lambda kv: kv[1])
    special = {t["content"] for t in tj["added_tokens"]}
    merges = [m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list([t for t, _ in vocab])
    w.add_token_types([3 if t in special else 1 for t, _ in vocab])
    w.add_token_merges(merges)
    w.add_eos_token_id(tiny.tok.eos_token_id)
    w.add_pad_token_id(tiny.tok.pad_token_id)
    names = gguf.get_tensor_name_map(next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == tiny.arch), n_layers)
    for name, t in tiny.hf.state_dict().items():
        if name == "lm_head.weight" and cfg.get("tie_word_embeddings"):
            continue
        a = t.float().numpy().copy()
        g = names.get_name(name, try_suffixes=(".weight", ".bias"))
        assert g is not None, name
        if tiny.arch == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
            a = permute(a, cfg["num_attention_heads" if "q_proj" in name else "num_key_value_heads"])
        if tiny.arch == "gemma3" and name.endswith("norm.weight"):
            a = a + np.float32(1.0)  # llama.cpp's Gemma RMSNorm multiplies by w, not 1 + w
        w.add_tensor(g, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_gguf_round_trip(tiny, tmp_path):
    gguf_path = tmp_path / f"{tiny.arch}.gguf"
    _write_gguf(tiny, gguf_path)
    out = convert(gguf_path, tmp_path / "from-gguf", dtype="float32", progress=None)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model_type"] == ("gemma3_text" if tiny.arch == "gemma3" else tiny.arch)
    m = load_model(out, ops="native")
    if tiny.arch == "gemma3":  # llama.cpp scales Gemma 3 attention by head_dim (query_pre_attn_scalar is not stored)
        assert m.args.query_pre_attn_scalar == m.args.head_dim
        for layer in tiny.hf.model.layers:
            layer.self_attn.scaling = m.args.head_dim**-0.5
        tiny.ref.clear()
    prompts = tiny.prompts[:2]
    if tiny.arch == "qwen3":  # llama.cpp's qwen3 has no sliding window: compare within it
        assert "sliding_attention" not in m.args.layer_types
        prompts = [p[:16] for p in prompts]
    try:
        for ids in prompts:
            h, _ = m(mx.array([ids]))
            _check(f"{tiny.arch}/gguf", np.array(m.logits(h))[0], tiny.ref(ids), tol=1e-4)
    finally:
        if tiny.arch == "gemma3":
            for layer in tiny.hf.model.layers:
                layer.self_attn.scaling = tiny.hf.config.query_pre_attn_scalar**-0.5
            tiny.ref.clear()


def test_ops_chosen_once_by_device_and_dtype():
    assert choose_ops(mx.float32, mx.cpu) is FASTMATH
    assert choose_ops(mx.float16, mx.cpu) is NATIVE
    assert choose_ops(mx.float32, mx.gpu) is NATIVE
    assert choose_ops(mx.float32, mx.cpu, "native") is NATIVE
    with pytest.raises(ValueError, match="float32 only"):
        choose_ops(mx.float16, mx.cpu, "fastmath")


def test_sliding_mask_uses_rope_positions():
    """Left padding and a cache with holes: the window counts positions, not columns."""
    am = mx.array([[0, 0, 1, 1], [1, 1, 1, 1]])
    cache_mask = mx.array([[1, 1, 0], [1, 1, 1]])  # row 0: 2 real cached keys, then padding
    offs = mx.array([2 - 2, 3])  # row 0: 2 real cached, 2 pads; row 1: 3 cached
    m = np.array(build_mask(am, cache_mask, 3, last_only=True, offsets=offs, window=3))[:, 0, 0]
    # row 0, last query at position 3: keys at positions 1 (cached), 2, 3 (new); not 0, not padding
    assert m[0].tolist() == [False, True, False, False, False, True, True]
    # row 1, last query at position 6: keys at 4, 5, 6
    assert m[1].tolist() == [False, False, False, False, True, True, True]
