"""Embeddings against sentence-transformers' own `encode`, on tiny random folders it saved itself:
both pooling-config layouts (2.x-5.x booleans, 6.x `pooling_mode`), the three poolings, a prompt
included in a mean or left out, chat-rendered texts (6.x's message modality), and the architectures.
Ours runs batched (length-sorted, left-padded, the prompt's head cached); the reference each text
alone, float32. Plus the folder's refusals and the Python API's arguments."""

from __future__ import annotations

import json
import shutil
import warnings

import numpy as np
import pytest

from mlx_slm.classifier.embedder import Embedder, EmbeddingError, finish, read_pooling
from mlx_slm.engine.engine import Engine

TEXTS = [
    "refund please",
    "My card was charged twice for the same order and nobody answers my emails about it.",
    "x",
    "The app crashes when I open settings",
    "where is my parcel? it was due last week, the tracking page says nothing, and support is closed",
    "ok",
]


def reference(folder, texts, prompt_name=None):
    """sentence-transformers' `encode`, each text alone, float32 on the CPU."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from sentence_transformers import SentenceTransformer

        st = SentenceTransformer(str(folder), device="cpu")
        return np.stack([st.encode([t], prompt_name=prompt_name)[0] for t in texts]).astype(np.float32)


def assert_close(ours, ref):
    """Cosine >= 0.9999 and every value within 1e-4 of the reference vector's largest."""
    cos = (ours * ref).sum(1) / np.linalg.norm(ours, axis=1) / np.linalg.norm(ref, axis=1)
    assert cos.min() >= 0.9999, cos
    scale = np.abs(ref).max(axis=1, keepdims=True)
    assert (np.abs(ours - ref) / scale).max() <= 1e-4


def check(tiny_arch, arch="qwen3", prompt_names=(None, "query"), batch_size=4, **kw):
    emb = Embedder(Engine.load(str(tiny_arch.st_mlx(arch, **kw))), batch_size=batch_size)
    for name in prompt_names:
        assert_close(emb.encode(TEXTS, prompt_name=name), reference(tiny_arch.st(arch, **kw), TEXTS, name))
    return emb


@pytest.mark.parametrize("pooling", ["lasttoken", "mean", "cls"])
def test_six_layout_each_pooling(tiny_arch, pooling):
    emb = check(tiny_arch, pooling=pooling, normalize=pooling != "mean")
    assert emb.pooling.mode == pooling and emb.pooling.normalize == (pooling != "mean")


@pytest.mark.parametrize("pooling", ["lasttoken", "mean", "cls"])
def test_five_layout_each_pooling(tiny_arch, pooling):
    emb = check(tiny_arch, layout="5", pooling=pooling)
    assert emb.pooling.mode == pooling and emb.pooling.max_seq_length == 512


def test_five_layout_lasttoken_is_qwen3_embeddings(tiny_arch):
    """Qwen3-Embedding's own layout: the backbone without `model.` and without an LM head, the
    booleans, last token, Normalize, an instruction prompt for queries."""
    emb = check(tiny_arch, layout="5")
    assert not emb.engine.model.has_lm_head
    assert emb.pooling.describe().startswith("sentence-transformers: lasttoken pooling")


@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_prompt_left_out_of_the_pooling(tiny_arch, pooling):
    """include_prompt false: the prompt's tokens (as sentence-transformers counts them) are not
    pooled, though they run (and are cached) as the text's head."""
    emb = check(tiny_arch, layout="5", pooling=pooling, include_prompt=False)
    head, skip, _ = emb.prompt_head(dict(emb.pooling.prompts)["query"])
    assert skip > 0 and len(head) >= skip - 1


@pytest.mark.parametrize("pooling", ["lasttoken", "mean"])
def test_chat_rendered_texts(tiny_arch, pooling):
    """6.x's message modality: each text a user message, the prompt a system message."""
    emb = check(tiny_arch, pooling=pooling, chat=True)
    assert emb.pooling.chat


@pytest.mark.parametrize("arch", ["qwen2", "llama", "gemma3"])
def test_architectures(tiny_arch, arch):
    """qwen2's head is untied: the backbone folder has none at all; gemma3 scales its embeddings."""
    emb = check(tiny_arch, arch, pooling="mean", prompt_names=("query",))
    assert not emb.engine.model.has_lm_head


def test_prefix_cache_and_batching_change_nothing(tiny_arch):
    """The prompt's head cached or not, one batch or one text per batch: the same vectors."""
    path = tiny_arch.st_mlx(pooling="mean")
    eng = Engine.load(str(path))
    a = Embedder(eng, batch_size=8).encode(TEXTS, prompt_name="query")
    b = Embedder(eng, batch_size=1, use_prefix_cache=False).encode(TEXTS, prompt_name="query")
    np.testing.assert_allclose(a, b, atol=2e-6)
    items = Embedder(eng).prepare(TEXTS, "Instruct: find the tickets about this\nQuery: ")
    assert all(it.prefix and it.ids[: len(it.prefix)] == list(it.prefix) for it in items)


def test_causal_lm_embeds_by_its_last_token(tiny_arch):
    """A plain causal LM: the last token's final-norm hidden state, not normalized, as
    Transformers' last hidden state gives it."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    emb = Embedder(Engine.load(str(tiny_arch.mlx("qwen2"))))
    assert emb.pooling.source == "causal LM" and not emb.pooling.normalize
    got = emb.encode(TEXTS[:3])
    hf = tiny_arch.hf("qwen2")
    model, tok = AutoModel.from_pretrained(str(hf), dtype=torch.float32), AutoTokenizer.from_pretrained(str(hf))
    with torch.no_grad():
        ref = np.stack([model(**tok(t, return_tensors="pt")).last_hidden_state[0, -1].numpy() for t in TEXTS[:3]])
    assert_close(got, ref)


def test_dimensions_truncate_then_normalize(tiny_arch):
    emb = Embedder(Engine.load(str(tiny_arch.st_mlx(pooling="mean", normalize=False))))
    full = emb.encode(TEXTS)
    short = emb.encode(TEXTS, dimensions=16)
    np.testing.assert_allclose(short, finish(full, True, 16), atol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(short, axis=1), 1, atol=1e-6)
    raw = emb.encode(TEXTS, dimensions=16, normalize=False)
    np.testing.assert_allclose(raw, full[:, :16])
    for bad in (0, emb.dimension + 1, 2.5, True):
        with pytest.raises(EmbeddingError, match="dimensions"):
            emb.encode(TEXTS, dimensions=bad)


def test_errors_per_text_in_order(tiny_arch):
    emb = Embedder(Engine.load(str(tiny_arch.st_mlx())))
    got = emb.embed(["fine", "", None, "also fine", "word " * 5000])
    assert [e is None for e in got.errors] == [True, False, False, True, False]
    assert "empty text" in got.errors[1] and "not a string" in got.errors[2] and "--truncate" in got.errors[4]
    assert np.isnan(got.vectors[[1, 2, 4]]).all() and np.isfinite(got.vectors[[0, 3]]).all()
    cut = Embedder(emb.engine, truncate=True).embed(["word " * 5000])
    assert cut.truncated == [True] and cut.n_tokens == [emb.max_length]


def test_unknown_prompt_name_is_named(tiny_arch):
    emb = Embedder(Engine.load(str(tiny_arch.st_mlx())))
    with pytest.raises(EmbeddingError, match=r"'nope'.*'query'"):
        emb.encode(["x"], prompt_name="nope")
    np.testing.assert_array_equal(emb.encode(["x"], prompt=""), emb.encode(["x"], prompt_name="document"))


def test_token_ids_as_given(tiny_arch):
    emb = Embedder(Engine.load(str(tiny_arch.st_mlx())))
    ids = emb.engine.tokenizer("refund please")["input_ids"]
    items = emb.prepare_ids([ids, [], [1, 10**6], "text"])
    assert [it.error is None for it in items] == [True, False, False, False]
    assert "out of the vocabulary" in items[2].error
    (e, *_) = [x for x in emb.run_items(items) if x.ok]
    np.testing.assert_allclose(finish(e.vector[None], True)[0], emb.encode(["refund please"])[0], atol=1e-6)


def test_sequence_classifier_does_not_embed(tiny_arch):
    with pytest.raises(
        EmbeddingError, match=r"no pooling config \(.*\) and no causal LM head.*ForSequenceClassification"
    ):
        Embedder(Engine.load(str(tiny_arch.seqcls_mlx("qwen2", 3))))


def test_folder_refusals(tmp_path, tiny_arch):
    src = tiny_arch.st(pooling="mean")
    folder = tmp_path / "f"
    shutil.copytree(src, folder)

    def edit(name, fn):
        p = folder / name
        p.write_text(json.dumps(fn(json.loads(p.read_text()))))

    edit("1_Pooling/config.json", lambda c: {**c, "pooling_mode": "max"})
    with pytest.raises(EmbeddingError, match="pooling 'max' is not supported"):
        read_pooling(folder, 64, False)
    edit("1_Pooling/config.json", lambda c: {**c, "pooling_mode": "lasttoken"})
    edit("modules.json", lambda m: m + [{"idx": 3, "name": "3", "path": "3_Dense", "type": "x.Dense"}])
    with pytest.raises(EmbeddingError, match="a Dense module"):
        read_pooling(folder, 64, False)
    (folder / "modules.json").unlink()
    with pytest.raises(EmbeddingError, match=r"no pooling config \(.*\) and no causal LM head"):
        read_pooling(folder, 64, False)
    assert read_pooling(folder, 64, True).source == "causal LM"


def test_classifier_on_an_embedding_folder_says_it_embeds(tiny_arch):
    from mlx_slm import Classifier

    with pytest.raises(Exception, match="bare backbone without an LM head.*mlx-slm embed"):
        Classifier(Engine.load(str(tiny_arch.st_mlx())), ["a", "b"]).classify(["x"])


def test_python_api_on_a_classifiers_engine(tiny_arch):
    """`Embedder` from the package root, on the engine a `Classifier` already holds (one model, both uses)."""
    import mlx_slm

    clf = mlx_slm.Classifier.load(str(tiny_arch.mlx("qwen2")), ["billing", "bug"])
    emb = mlx_slm.Embedder(clf.engine)
    assert emb.engine is clf.engine and emb.encode(TEXTS[:2]).shape == (2, 64)
    assert clf.classify(["refund please"])[0].label in ("billing", "bug")


def test_backbone_whose_config_says_causal_lm(tiny_arch, tmp_path):
    """Qwen3-Embedding's config.json names Qwen3ForCausalLM though its weights are the bare
    backbone's (no `model.` prefix, no LM head): the weights decide, and it embeds as saved."""
    from mlx_slm.cli.misc import model_head_lines
    from mlx_slm.weights.convert import convert

    src = tmp_path / "q3e"
    shutil.copytree(tiny_arch.st(layout="5"), src)
    cfg = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**cfg, "architectures": ["Qwen3ForCausalLM"]}))
    out = convert(src, tmp_path / "m", dtype="float32", progress=None)
    emb = Embedder(Engine.load(str(out)))
    assert not emb.engine.model.has_lm_head
    assert_close(emb.encode(TEXTS, prompt_name="query"), reference(tiny_arch.st(layout="5"), TEXTS, "query"))
    assert "none (a bare backbone" in dict(model_head_lines(str(out)))["head"]
