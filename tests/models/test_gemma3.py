"""Gemma 3 (`models/gemma3.py`): transformers 4's and 5's config layouts read the same, the multimodal
checkpoint's text part found by its names, and a multimodal sequence classifier."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import AutoModelForSequenceClassification

import mlx_slm  # noqa: F401  (the optimized BLAS before mlx.core)  # noqa: F401  (the optimized BLAS before mlx.core)
from mlx_slm.models import (
    ModelArgs,
    load_model,
    sequence_logits,
)
from mlx_slm.models import gemma3 as gemma3_mod
from mlx_slm.weights.convert import convert
from tests.conftest import make_tokenizer
from tests.forward_parity import check_diff, padded


def test_gemma3_config_layouts_agree():
    """transformers 4 (rope_theta, rope_local_base_freq, rope_scaling, sliding_window_pattern)
    and 5 (rope_parameters per layer type, layer_types) read the same."""
    common = dict(
        model_type="gemma3_text",
        hidden_size=64,
        num_hidden_layers=6,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=1,
        vocab_size=10,
        head_dim=32,
        sliding_window=8,
    )
    v4 = ModelArgs.from_dict(
        {
            **common,
            "rope_theta": 1e6,
            "rope_local_base_freq": 1e4,
            "sliding_window_pattern": 3,
            "rope_scaling": {"rope_type": "linear", "factor": 8.0},
        }
    )
    v5 = ModelArgs.from_dict(
        {
            **common,
            "layer_types": ["sliding_attention", "sliding_attention", "full_attention"] * 2,
            "rope_parameters": {
                "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
                "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
            },
        }
    )
    assert v4 == v5
    assert v4.rope("full_attention") == (1e6, 0.125) and v4.rope("sliding_attention") == (1e4, 1.0)
    mm = ModelArgs.from_dict({"model_type": "gemma3", "text_config": {**common, "model_type": "gemma3_text"}})
    assert mm.hidden_size == 64 and mm.tie_word_embeddings
    with pytest.raises(ValueError, match="yarn"):
        ModelArgs.from_dict({**common, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}})
    with pytest.raises(ValueError, match="bidirectional"):
        ModelArgs.from_dict({**common, "use_bidirectional_attention": True})


def test_gemma3_multimodal_names_sanitized():
    args = ModelArgs.from_dict(
        {
            "model_type": "gemma3_text",
            "hidden_size": 8,
            "num_hidden_layers": 1,
            "intermediate_size": 8,
            "num_attention_heads": 1,
            "vocab_size": 4,
            "head_dim": 8,
        }
    )
    w = {
        "language_model.model.norm.weight": 1,
        "model.language_model.layers.0.mlp.up_proj.weight": 2,
        "vision_tower.x": 3,
        "multi_modal_projector.y": 4,
        "language_model.lm_head.weight": 5,
    }
    assert gemma3_mod.sanitize(w, args) == {"model.norm.weight": 1, "model.layers.0.mlp.up_proj.weight": 2}


TOL = 1e-4


MAX_DIFF: dict[str, float] = {}  # case -> max |diff| seen (in the run's summary: conftest)


def _check(name: str, ours, ref, tol: float = TOL) -> None:
    check_diff(MAX_DIFF, name, ours, ref, tol)


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
