"""The architectures' loader and registry (`models/__init__.py`): `load_model` and `sequence_logits` on
sequence-classification checkpoints against Transformers, float32, on tiny random checkpoints; an
architecture found by its model_type, and its FLOPs per token.

Tiny `Qwen2/Llama/Qwen3/Gemma3(Text)ForSequenceClassification` checkpoints saved by
Transformers (conftest.make_tiny_seqcls: 3 labels softmax, 4 labels multi-label, one label;
with and without id2label; pad_token_id set) are converted and loaded with
`models.load_model`, and their head's logits (`models.sequence_logits`: the score at each
row's last position of a left-padded batch, after a prefix KV cache too) compared with
`AutoModelForSequenceClassification` one item at a time: max |diff| <= 1e-4. (Their conversion is
tested in tests/weights/test_convert.py, the reference path in tests/parity/test_reference.py.)
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
import torch
from transformers import AutoModelForSequenceClassification

import mlx_slm  # noqa: F401  (the optimized BLAS before mlx.core)
from mlx_slm.ground.errors import ModelError, UserError
from mlx_slm.models import (
    SUPPORTED_ARCHITECTURES,
    flops_per_token,
    get_model_class,
    load_model,
    mlxlm,
    sequence_logits,
)
from mlx_slm.models import gemma3 as gemma3_mod
from mlx_slm.weights.convert import convert
from tests.conftest import make_tokenizer
from tests.forward_parity import check_diff, padded
from tests.models.test_mlxlm import tiny_config
from tests.seqcls_cases import CASES, LENGTHS, MULTI, Tiny
from tests.seqcls_cases import case_name as _name

TOL = 1e-4
MAX_DIFF: dict[str, float] = {}  # case -> max |diff| seen (in the run's summary: conftest)


def _check(name: str, ours, ref, tol: float = TOL) -> None:
    check_diff(MAX_DIFF, name, ours, ref, tol)


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


# --------------------------------------------------------------------------- mlx-lm's families


@pytest.mark.parametrize("family", ["mistral", "phi3"])
def test_a_family_only_mlx_lm_covers(family, tmp_path):
    """mlx-lm's class with a score head in place of its LM head (models/mlxlm.py)."""
    tok = make_tokenizer(tmp_path / "hf")
    cfg = tiny_config(family, tok, sliding_window=None, id2label={0: "no", 1: "yes"}, label2id={"no": 0, "yes": 1})
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


# The registry: an architecture found by its model_type, and its FLOPs per token.


# --------------------------------------------------------------------------- registry and config


def test_registry():
    assert set(SUPPORTED_ARCHITECTURES) >= {"qwen2", "llama", "qwen3", "gemma3", "gemma3_text"}
    model_cls, args_cls = get_model_class("gemma3_text")
    assert model_cls is gemma3_mod.Model and args_cls is gemma3_mod.ModelArgs
    with pytest.raises(ValueError, match="unsupported architecture 'bert'; supported: qwen2, llama"):
        get_model_class("bert")  # neither ours nor mlx-lm's (those run through mlx-lm: test_mlxlm_fallback.py)


def test_flops_per_token_per_architecture():
    base = dict(
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=10,
    )
    assert flops_per_token({**base, "model_type": "qwen2"}) == 2 * 3 * (2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 160)
    # qwen3 and gemma3: head_dim from the config (q/o: 64 x 4*24, k/v: 64 x 2*24)
    assert flops_per_token({**base, "model_type": "qwen3", "head_dim": 24}) == 2 * 3 * (
        2 * 64 * 96 + 2 * 64 * 48 + 3 * 64 * 160
    )
