"""The sequence-classification head's description (mlx_slm/seqcls.py), without a model: a
config read as Transformers reads it, refused where it cannot be read right, and the
probabilities of Transformers' text-classification pipeline (its own `sigmoid`/`softmax`)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers.pipelines.text_classification import sigmoid as hf_sigmoid
from transformers.pipelines.text_classification import softmax as hf_softmax

from mlx_slm.ground.errors import ModelError, UserError
from mlx_slm.text.seqcls import SeqClsHead, check_head_tensor, seqcls_architecture

ARCH = "Qwen2ForSequenceClassification"


def cfg(**kw):
    return {"architectures": [ARCH], "model_type": "qwen2", "hidden_size": 64, **kw}


def test_a_causal_lm_has_no_head():
    assert SeqClsHead.from_config({"architectures": ["Qwen2ForCausalLM"], "id2label": {"0": "a"}}) is None
    assert SeqClsHead.from_config({"model_type": "llama"}) is None
    assert (
        seqcls_architecture({"architectures": ["LlamaForSequenceClassification"]}) == "LlamaForSequenceClassification"
    )
    with pytest.raises(ModelError, match="is not a list of class names"):  # checked, not taken for a causal LM
        seqcls_architecture({"architectures": "LlamaForSequenceClassification"})
    with pytest.raises(ModelError, match="names both 'LlamaForCausalLM' and 'LlamaForSequenceClassification'"):
        seqcls_architecture({"architectures": ["LlamaForCausalLM", "LlamaForSequenceClassification"]})


def test_labels_from_id2label_in_id_order():
    head = SeqClsHead.from_config(cfg(id2label={"2": "pos", "0": "neg", "1": "neu"}, pad_token_id=7))
    assert head.labels == ("neg", "neu", "pos") and head.num_labels == 3
    assert head.pad_token_id == 7 and head.problem_type is None and head.function == "softmax"
    assert head.to_dict() == {
        "architecture": ARCH,
        "labels": ["neg", "neu", "pos"],
        "problem_type": None,
        "function": "softmax",
        "pad_token_id": 7,
    }


@pytest.mark.parametrize(
    "extra,labels",
    [
        ({}, ("LABEL_0", "LABEL_1")),
        ({"num_labels": 3}, ("LABEL_0", "LABEL_1", "LABEL_2")),
        ({"num_labels": 1}, ("LABEL_0",)),
    ],
)
def test_labels_without_id2label_as_transformers(extra, labels):
    """No id2label: `num_labels` LABEL_i, 2 when the config says nothing (PreTrainedConfig's rule)."""
    from transformers import Qwen2Config

    head = SeqClsHead.from_config(cfg(**extra))
    assert head.labels == labels
    assert tuple(Qwen2Config(**extra).id2label[i] for i in range(len(labels))) == labels


def test_pad_token_id_of_the_text_config():
    """A multimodal Gemma 3 keeps its pad id in text_config (Transformers reads get_text_config())."""
    head = SeqClsHead.from_config(
        {"architectures": ["Gemma3ForSequenceClassification"], "text_config": {"pad_token_id": 0}, "pad_token_id": 9}
    )
    assert head.pad_token_id == 0


@pytest.mark.parametrize(
    "problem_type,n,function",
    [
        (None, 3, "softmax"),
        (None, 2, "softmax"),
        ("single_label_classification", 3, "softmax"),
        (None, 1, "sigmoid"),
        ("multi_label_classification", 4, "sigmoid"),
        ("multi_label_classification", 1, "sigmoid"),
        ("regression", 1, "none"),
        ("regression", 3, "none"),
    ],
)
def test_function_as_the_pipeline_chooses_it(problem_type, n, function):
    head = SeqClsHead(ARCH, tuple(f"l{i}" for i in range(n)), problem_type)
    assert head.function == function
    assert head.multi_label == (function == "sigmoid" and n > 1)


def test_probabilities_by_hand():
    three = SeqClsHead(ARCH, ("a", "b", "c"))
    np.testing.assert_allclose(three.probabilities([0.0, math.log(2), math.log(5)]), [1 / 8, 2 / 8, 5 / 8], atol=1e-15)
    one = SeqClsHead(ARCH, ("relevant",))
    np.testing.assert_allclose(one.probabilities([[0.0], [math.log(3)]]), [[0.5], [0.75]], atol=1e-15)
    multi = SeqClsHead(ARCH, ("a", "b"), "multi_label_classification")
    np.testing.assert_allclose(multi.probabilities([math.log(3), -math.log(3)]), [0.75, 0.25], atol=1e-15)
    reg = SeqClsHead(ARCH, ("score",), "regression")
    assert reg.probabilities([-3.25]).tolist() == [-3.25] and reg.probabilities([1.0]).dtype == np.float64
    with pytest.raises(ValueError, match="3 labels"):
        three.probabilities([1.0, 2.0])


@settings(max_examples=60, deadline=None)
@given(
    logits=st.lists(st.floats(-60, 60, allow_nan=False, width=32), min_size=1, max_size=6),
    problem_type=st.sampled_from([None, "multi_label_classification", "regression"]),
)
def test_probabilities_equal_the_pipelines_functions(logits, problem_type):
    """Against the pipeline module's own sigmoid and softmax (float64 in, as ours computes)."""
    x = np.array(logits, dtype=np.float64)
    head = SeqClsHead(ARCH, tuple(f"l{i}" for i in range(len(x))), problem_type)
    want = {"softmax": hf_softmax, "sigmoid": hf_sigmoid, "none": lambda v: v}[head.function](x)
    got = head.probabilities(x)
    assert got.shape == x.shape and np.all(np.isfinite(got))
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-300)
    if head.function == "softmax":
        assert abs(got.sum() - 1.0) < 1e-12


def test_probabilities_never_overflow():
    one = SeqClsHead(ARCH, ("x",))
    with np.errstate(over="raise", invalid="raise", divide="raise"):
        got = one.probabilities(np.array([[-1000.0], [1000.0]]))
        three = SeqClsHead(ARCH, ("a", "b", "c")).probabilities([1000.0, -1000.0, 0.0])
    assert got.ravel().tolist() == [0.0, 1.0] and three.tolist() == [1.0, 0.0, 0.0]


def test_prompt_ids_drop_trailing_pad_tokens_as_transformers_reads_past_them():
    head = SeqClsHead(ARCH, ("a", "b"), pad_token_id=0)
    assert head.prompt_ids([5, 0, 6, 0, 0]) == [5, 0, 6]  # a pad id inside the text stays
    assert head.prompt_ids([0, 0]) == [0]  # all pad: Transformers reads position 0
    assert head.prompt_ids([5, 6]) == [5, 6] and head.prompt_ids([]) == []
    assert SeqClsHead(ARCH, ("a", "b")).prompt_ids([5, 0, 0]) == [5, 0, 0]  # no pad id: the last token


@pytest.mark.parametrize(
    "bad,field",
    [
        (dict(id2label={"0": "a", "2": "b"}), "id2label keys \\[0, 2\\] are not 0..1"),
        (dict(id2label={"x": "a"}), "id2label key 'x' is not an id"),
        (dict(id2label={"0": "a", "1": "a"}), "names 'a' for several ids"),
        (dict(id2label={"0": ""}), "id2label\\[0\\] is ''"),
        (dict(id2label={"0": 3}), "id2label\\[0\\] is 3"),
        (dict(id2label=["a", "b"]), "is not a mapping"),
        (dict(num_labels=0), "num_labels 0 is not a positive integer"),
        (dict(problem_type="ordinal"), "problem_type 'ordinal' is not one Transformers knows"),
        (dict(problem_type="single_label_classification", num_labels=1), "needs more than one label"),
        (dict(pad_token_id="0"), "pad_token_id '0' is not a token id"),
    ],
)
def test_a_config_that_cannot_be_read_right_is_refused_naming_file_and_field(bad, field):
    with pytest.raises(ModelError, match=f"^/x/config.json: .*{field}") as e:
        SeqClsHead.from_config(cfg(**bad), "/x/config.json")
    assert isinstance(e.value, UserError)


def test_score_weight_checked_against_the_config():
    head = SeqClsHead(ARCH, ("a", "b", "c"))
    check_head_tensor(head, (3, 64), 64, "m.safetensors")
    check_head_tensor(head, (3, 8), 64, "m.safetensors", packed=True)  # packed: its shape says nothing
    with pytest.raises(ModelError, match=r"m.safetensors: score.weight has shape \(2, 64\).*3 labels.*\(3, 64\)"):
        check_head_tensor(head, (2, 64), 64, "m.safetensors")
    with pytest.raises(ModelError, match=r"\(3, 32\)"):
        check_head_tensor(head, (3, 32), 64, "m.safetensors")
    with pytest.raises(ModelError, match="m.safetensors: no score.weight, though config.json names Qwen2For"):
        check_head_tensor(head, None, 64, "m.safetensors")
    with pytest.raises(ModelError, match="holds score.weight .* names no \\*ForSequenceClassification"):
        check_head_tensor(None, (3, 64), 64, "m.safetensors")
    check_head_tensor(None, None, 64, "m.safetensors")  # a causal LM


def test_no_lm_head_message_says_what_to_do():
    msg = SeqClsHead(ARCH, tuple(f"l{i}" for i in range(10))).no_lm_head()
    assert ARCH in msg and "10-label" in msg and "l7, ..." in msg and "drop --labels/--questions" in msg
