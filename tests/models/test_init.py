"""Sequence-classification checkpoints against Transformers, float32, on tiny random checkpoints.

Tiny `Qwen2/Llama/Qwen3/Gemma3(Text)ForSequenceClassification` checkpoints saved by
Transformers (conftest.make_tiny_seqcls: 3 labels softmax, 4 labels multi-label, one label;
with and without id2label; pad_token_id set) are converted and loaded with
`models.load_model`, and their head's logits (`models.sequence_logits`: the score at each
row's last position of a left-padded batch, after a prefix KV cache too) compared with
`AutoModelForSequenceClassification` one item at a time: max |diff| <= 1e-4. The reference
path (`reference.SeqClsReference`: the pipeline's own encoding and probabilities) gives the
same numbers as ours; a checkpoint whose head does not match its config is refused at
convert and at load, and nothing is left behind.
"""

from __future__ import annotations

import json
import shutil

import mlx.core as mx
import numpy as np
import pytest
import torch
from transformers import AutoConfig, AutoModelForSequenceClassification

import mlx_slm  # noqa: F401  (the optimized BLAS before mlx.core)
from mlx_slm.ground.errors import ModelError, UserError
from mlx_slm.models import load_model, mlxlm, sequence_logits
from mlx_slm.parity.reference import SeqClsReference
from mlx_slm.text.prompts import encode_texts
from mlx_slm.weights.convert import ConversionError, convert, dequantized_copy
from tests.conftest import SEQCLS_LABELS, make_tokenizer
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


@pytest.mark.parametrize("ops", ["native", "fastmath"])
def test_left_padded_batch_matches_transformers(tiny, ops):
    arch, n, pt, _ = tiny.case
    m = load_model(tiny.mlx_dir, ops=ops)
    head = m.seqcls
    assert head.labels == tiny.labels and head.problem_type == pt and head.pad_token_id == tiny.pad
    assert head.architecture == tiny.hf.config.architectures[0] and not m.has_lm_head
    rows = [head.prompt_ids(p) for p in tiny.prompts]
    assert len(rows[1]) == LENGTHS[1] and len(rows[2]) == LENGTHS[2]
    ids, mask, offs = padded(rows, pad_id=tiny.pad)
    got = np.array(sequence_logits(m, ids, mask, offs))
    assert got.shape == (len(rows), n) and got.dtype == np.float32
    for r, p in enumerate(tiny.prompts):  # Transformers on the prompt as given, alone
        _check(f"{_name(tiny.case)}/batch/{ops}", got[r], tiny.ref(p))
    for r, p in enumerate(rows):  # and each row alone through our model
        _check(f"{_name(tiny.case)}/alone/{ops}", np.array(sequence_logits(m, mx.array([p])))[0], got[r])


def test_after_a_prefix_cache_matches_transformers(tiny):
    """A prefix at batch 1, then a padded batch after it (the rerank path: a query's tokens once)."""
    m = load_model(tiny.mlx_dir)
    prefix = tiny.prompts[0][:20]
    suffixes = [tiny.prompts[3][:30], tiny.prompts[2], [44]]
    _, kv = m(mx.array([prefix]))
    ids, mask, offs = padded(suffixes, 0, cache_len=len(prefix))
    got = np.array(sequence_logits(m, ids, mask, offs, cache=kv))
    for r, s in enumerate(suffixes):
        _check(f"{_name(tiny.case)}/prefix", got[r], tiny.ref(prefix + s))


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


def test_no_lm_head_refuses_label_scoring(tiny_arch, tiny_seqcls_mlx):
    m = load_model(tiny_seqcls_mlx)
    h, _ = m(mx.array([[5, 6, 7]]))
    for call in (lambda: m.logits(h), lambda: m.logits(h, mx.array([1, 2])), m.head_weight, m.head):
        with pytest.raises(ModelError, match="Qwen2ForSequenceClassification .*no LM head") as e:
            call()
        assert isinstance(e.value, UserError)
    lm = load_model(tiny_arch.mlx("qwen2"))
    assert lm.has_lm_head and lm.seqcls is None
    with pytest.raises(ModelError, match="causal LM .* no sequence-classification head"):
        sequence_logits(lm, mx.array([[5, 6, 7]]))
    with pytest.raises(ModelError, match="causal LM"):
        lm.score_logits(h)


def test_label_scoring_on_a_sequence_classifier_is_a_user_error(tiny_arch):
    from transformers import AutoTokenizer

    from mlx_slm.classifier.classifier import Classifier
    from mlx_slm.engine.engine import Engine
    from mlx_slm.kinds import LabelsSpec

    path = tiny_arch.seqcls_mlx("qwen2", 3)
    engine = Engine(load_model(path), AutoTokenizer.from_pretrained(str(path)))
    # Labels of one's own beside the model's: refused at once, naming the model's labels (the kinds
    # table chooses the model's head for it).
    with pytest.raises(
        UserError, match=r"its own labels \['negative', 'neutral', 'positive'\].*give its own labels, or none"
    ):
        Classifier(engine, ["a", "b"])
    # Label scoring asked for explicitly (a causal LM's task on this model): no LM head, said so.
    with pytest.raises(UserError, match="no LM head"):
        Classifier(engine, kind=LabelsSpec(("a", "b")))
    assert Classifier(engine).classify(["some text"])[0].label in ("negative", "neutral", "positive")


# --------------------------------------------------------------------------- dtypes and quantization


def test_float16_conversion_matches_transformers_on_its_values(tiny_arch, tmp_path):
    src = tiny_arch.seqcls_hf("qwen2", 4, MULTI)
    out = convert(src, tmp_path / "f16", dtype="float16", progress=None)
    m = load_model(out, dtype=mx.float32)
    assert m.score.weight.dtype == mx.float32
    ref = SeqClsReference(out, threads=1)  # Transformers on the float16 values, computed in float32
    rows = [[5, 9, 30, 2, 77], [12, 13]]
    got = np.array(sequence_logits(m, *padded(rows, 0)))
    for r, p in enumerate(rows):
        _check("qwen2-f16", got[r], ref.logits(p))


@pytest.mark.parametrize("bits", [4, 8])
def test_quantized_conversion_keeps_the_score_head_in_floating_point(tiny_arch, tmp_path, bits):
    src = tiny_arch.seqcls_hf("llama", 3)
    out = convert(src, tmp_path / f"q{bits}", dtype="float32", quantize=bits, group_size=32, progress=None)
    stored = mx.load(str(out / "model.safetensors"))
    assert "score.weight" in stored and "score.scales" not in stored and stored["score.weight"].dtype == mx.float32
    assert "model.layers.0.mlp.up_proj.scales" in stored
    m = load_model(out)  # dequantized at load on the CPU
    ref = SeqClsReference(dequantized_copy(out, tmp_path / f"deq{bits}"), threads=1)
    rows = [[5, 9, 30, 2, 77], [12, 13]]
    got = np.array(sequence_logits(m, *padded(rows, 0)))
    for r, p in enumerate(rows):
        _check(f"llama-q{bits}", got[r], ref.logits(p))
    packed = load_model(out, dequantize=False)  # kept packed: the same head, the same numbers up to matmul order
    assert packed.quantized and not hasattr(packed.score, "scales")
    np.testing.assert_allclose(np.array(sequence_logits(packed, *padded(rows, 0))), got, atol=1e-3)


# --------------------------------------------------------------------------- bad checkpoints


def _copy(src, dst, **config):
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    for k, v in config.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


@pytest.mark.parametrize(
    "edit,match",
    [
        (dict(id2label={"0": "a", "1": "b"}, label2id=None), r"score.weight has shape \(3, 64\).*2 labels.*\(2, 64\)"),
        (dict(id2label={"0": "a", "1": "b", "3": "c"}), r"config.json: id2label keys \[0, 1, 3\] are not 0..2"),
        (dict(problem_type="ranking"), r"config.json: problem_type 'ranking' is not one Transformers knows"),
        (dict(architectures=["Qwen2ForCausalLM"]), r"holds score.weight .* names no \*ForSequenceClassification"),
    ],
)
def test_a_head_that_does_not_match_its_config_is_refused_at_convert(tiny_arch, tmp_path, edit, match):
    src = _copy(tiny_arch.seqcls_hf("qwen2", 3), tmp_path / "src", **edit)
    out = tmp_path / "cache" / "m"
    out.parent.mkdir()
    with pytest.raises(ConversionError, match=match) as e:
        convert(src, out, dtype="float32", progress=None)
    assert str(src) in str(e.value) and isinstance(e.value, UserError)
    assert list(out.parent.iterdir()) == []  # nothing half-converted, no temporary folder


def test_a_missing_score_weight_is_refused_at_convert(tiny_arch, tmp_path):
    from safetensors.numpy import load_file, save_file

    src = _copy(tiny_arch.seqcls_hf("qwen2", 3), tmp_path / "src")
    weights = load_file(str(src / "model.safetensors"))
    del weights["score.weight"]
    save_file(weights, str(src / "model.safetensors"))
    with pytest.raises(ConversionError, match=r"model.safetensors: no score.weight, though config.json names Qwen2For"):
        convert(src, tmp_path / "out", dtype="float32", progress=None)
    assert not (tmp_path / "out").exists()


def test_a_converted_directory_edited_after_is_refused_at_load(tiny_arch, tmp_path):
    mlx_dir = _copy(tiny_arch.seqcls_mlx("qwen2", 3), tmp_path / "m", id2label={"0": "a", "1": "b"}, label2id=None)
    with pytest.raises(ModelError, match=r"m/model.safetensors: score.weight has shape \(3, 64\)"):
        load_model(mlx_dir)
    causal = _copy(tiny_arch.seqcls_mlx("qwen2", 3), tmp_path / "c", architectures=["Qwen2ForCausalLM"])
    with pytest.raises(ModelError, match="holds score.weight"):
        load_model(causal)


# --------------------------------------------------------------------------- mlx-lm's families


@pytest.mark.parametrize("family", ["mistral", "phi3"])
def test_a_family_only_mlx_lm_covers(family, tmp_path):
    """mlx-lm's class with a score head in place of its LM head (models/mlxlm.py)."""
    tok = make_tokenizer(tmp_path / "hf")
    cfg = AutoConfig.for_model(
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
        sliding_window=None,
        id2label={0: "no", 1: "yes"},
        label2id={"no": 0, "yes": 1},
    )
    torch.manual_seed(5)
    hf = AutoModelForSequenceClassification.from_config(cfg, dtype=torch.float32).eval()
    hf.save_pretrained(str(tmp_path / "hf"))
    m = load_model(convert(tmp_path / "hf", tmp_path / "mlx", dtype="float32", progress=None))
    assert isinstance(m, mlxlm.MlxLmModel) and not m.has_lm_head and m.seqcls.labels == ("no", "yes")
    with pytest.raises(ModelError, match="no LM head"):
        m.head_weight()
    rows = [[int(x) for x in np.random.default_rng(k).integers(3, len(tok), size=n)] for k, n in enumerate([9, 30, 4])]
    got = np.array(sequence_logits(m, *padded(rows, 0)))
    for r, p in enumerate(rows):
        with torch.no_grad():
            _check(f"{family}-fallback", got[r], hf(torch.tensor([p])).logits[0].numpy())


def test_a_multimodal_gemma3_sequence_classifier(tmp_path):
    """Gemma3ForSequenceClassification (model_type gemma3): the text model under
    `model.language_model.`, a vision tower (dropped), the pad id in text_config, the labels on top."""
    from transformers import Gemma3Config

    from tests.conftest import tiny_config

    tok = make_tokenizer(tmp_path / "hf")
    text = {k: v for k, v in tiny_config("gemma3", tok).to_dict().items() if k not in ("architectures", "id2label",
            "label2id", "model_type", "transformers_version", "dtype", "torch_dtype")}  # fmt: skip
    vision = dict(
        hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=28, patch_size=14
    )
    cfg = Gemma3Config(
        text_config=text,
        vision_config=vision,
        mm_tokens_per_image=4,
        image_token_index=1,
        boi_token_index=1,
        eoi_token_index=2,
        id2label={0: "neg", 1: "pos"},
        label2id={"neg": 0, "pos": 1},
    )
    torch.manual_seed(6)
    hf = AutoModelForSequenceClassification.from_config(cfg, dtype=torch.float32).eval()
    with torch.no_grad():
        hf.score.weight.normal_(0, 0.3)  # the multimodal config's initializer range (0.02) gives tiny logits
    hf.save_pretrained(str(tmp_path / "hf"))
    out = convert(tmp_path / "hf", tmp_path / "mlx", dtype="float32", progress=None)
    m = load_model(out)
    assert m.seqcls.architecture == "Gemma3ForSequenceClassification" and m.seqcls.labels == ("neg", "pos")
    assert m.seqcls.pad_token_id == tok.pad_token_id and not hasattr(m, "vision_tower")
    rows = [[int(x) for x in np.random.default_rng(k).integers(3, len(tok), size=n)] for k, n in enumerate([40, 5])]
    got = np.array(sequence_logits(m, *padded(rows, 0)))
    assert np.abs(got).max() > 0.1
    for r, p in enumerate(rows):
        with torch.no_grad():
            _check("gemma3-multimodal", got[r], hf(torch.tensor([p])).logits[0].numpy())


def test_engine_classify_is_the_model_level_read(tiny_arch):
    """`Engine.sequence_logits` (the one engine primitive a sequence-classification kind needs): a
    batch from `batching.pad`, after a prefix from the engine's LRU too."""
    from transformers import AutoTokenizer

    from mlx_slm.engine.engine import Engine
    from mlx_slm.text.batching import pad

    path = tiny_arch.seqcls_mlx("qwen3", 4, MULTI)
    tiny = Tiny(("qwen3", 4, MULTI, False), tiny_arch)
    engine = Engine(load_model(path), AutoTokenizer.from_pretrained(str(path)))
    rows = [engine.model.seqcls.prompt_ids(p) for p in tiny.prompts]
    got = engine.sequence_logits(pad(rows, np.arange(len(rows)), engine.pad_id))
    assert got.shape == (4, 4) and got.dtype == np.float32
    for r, p in enumerate(tiny.prompts):
        _check("qwen3-engine", got[r], tiny.ref(p))
    head = rows[0][:20]
    prefix, _ = engine.prefix(head)
    tails = [rows[0][20:], rows[3][20:]]
    got = engine.sequence_logits(pad(tails, np.arange(2), engine.pad_id, cache_len=len(head)), prefix)
    for r, i in enumerate([0, 3]):
        _check("qwen3-engine", got[r], tiny.ref(head + rows[i][20:]))
    lm = Engine(load_model(tiny_arch.mlx("qwen2")), engine.tokenizer)
    with pytest.raises(ModelError, match="causal LM"):
        lm.sequence_logits(pad(rows, np.arange(1), 0))
