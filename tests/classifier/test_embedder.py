"""The embedder (`classifier/embedder.py`): embeddings against sentence-transformers' own `encode`, on tiny random folders it saved itself:
both pooling-config layouts (2.x-5.x booleans, 6.x `pooling_mode`), the three poolings, a prompt
included in a mean or left out, chat-rendered texts (6.x's message modality), and the architectures.
Ours runs batched (length-sorted, left-padded, the prompt's head cached); the reference each text
alone, float32. Plus the folder's refusals and the Python API's arguments, and what a hostile folder or caller
may give it (hostile round seven, issue 47)."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest

from mlx_slm.classifier.embedder import Embedder, EmbeddingError, finish, read_pooling
from mlx_slm.engine.engine import Engine
from mlx_slm.ground.errors import UserError
from mlx_slm.ground.textfiles import has_lone_surrogate
from tests.hostile import invoke, refused_cleanly

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


# Hostile round seven (issue 47) on embeddings: what a sentence-transformers folder may say and what
# `Embedder` may be given, each answered as sentence-transformers answers or refused by name.


D = 64  # the tiny backbone's hidden size


@pytest.fixture
def folder(tiny_arch, tmp_path) -> Path:
    return Path(shutil.copytree(tiny_arch.st(pooling="mean"), tmp_path / "st"))


@pytest.fixture(scope="module")
def emb(tiny_arch) -> Embedder:
    return Embedder(Engine.load(str(tiny_arch.st_mlx(pooling="mean"))))


def edit(folder: Path, name: str, fn) -> None:
    p = folder / name
    p.write_text(json.dumps(fn(json.loads(p.read_text()))))


# ----------------------------------------------------------------------------- the Pooling module's path


@pytest.mark.parametrize(
    "path, words",
    [
        ("", "the Pooling module's path is '' (the folder's root, whose config.json is the backbone's"),
        (".", "the Pooling module's path is '.' (the folder's root"),
        ("../x", "'../x' (no folder inside the model folder"),
        ("/etc", "'/etc' (no folder inside the model folder"),
        (3, "is 3 (no folder inside the model folder"),
    ],
)
def test_a_pooling_module_at_the_root_is_refused(folder, path, words):
    edit(folder, "modules.json", lambda m: [m[0], {**m[1], "path": path}, *m[2:]])
    with pytest.raises(EmbeddingError) as e:
        read_pooling(folder, D, False)
    msg = str(e.value)
    assert msg.startswith(f"{folder / 'modules.json'}: ") and words in msg
    assert 'set the Pooling module\'s "path"' in msg and "1_Pooling" in msg


def test_sentence_transformers_refuses_a_pooling_module_at_the_root_too(folder):
    import warnings

    edit(folder, "modules.json", lambda m: [m[0], {**m[1], "path": ""}, *m[2:]])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from sentence_transformers import SentenceTransformer

        with pytest.raises(Exception):  # noqa: B017 - whichever it raises: it does not load the folder
            SentenceTransformer(str(folder), device="cpu")


# ----------------------------------------------------------------------------- one string


def test_one_string_is_one_text(emb):
    one = emb.encode("hello")
    assert one.shape == (D,) and np.allclose(one, emb.encode(["hello"])[0])
    got = emb.embed("one string")  # a space inside: was "texts[3]: empty text"
    assert got.vectors.shape == (1, D) and got.errors == [None]
    np.testing.assert_allclose(got.vectors[0], emb.encode(["one string"])[0], atol=1e-6)
    with pytest.raises(EmbeddingError, match="^text: empty text"):
        emb.encode(" ")


@pytest.mark.parametrize("bad", [b"hello", bytearray(b"hi"), {"a": "b"}, 5])
def test_what_classify_refuses_embed_refuses(emb, bad):
    """The one check `Classifier.classify` uses (`text.inputs.as_texts`)."""
    from mlx_slm.text.inputs import as_texts

    with pytest.raises(TypeError) as theirs:
        as_texts(bad, None)
    with pytest.raises(TypeError) as ours:
        emb.embed(bad)
    assert str(ours.value) == str(theirs.value)


def test_a_frame_is_refused_naming_the_column(emb):
    pd = pytest.importorskip("pandas")
    with pytest.raises(TypeError, match=r"df\['text'\]"):
        emb.embed(pd.DataFrame({"text": ["a", "b"]}))
    assert emb.encode(pd.DataFrame({"text": ["a", "b"]})["text"]).shape == (2, D)


def test_a_text_with_a_lone_surrogate_is_an_error_row(emb):
    got = emb.embed(["fine", "bad \ud800 text"])
    assert got.errors[0] is None and "unpaired surrogate" in got.errors[1]


# ----------------------------------------------------------------------------- the folder's settings


@pytest.mark.parametrize(
    "change, words",
    [
        (lambda c: {**c, "prompts": {**c["prompts"], "query": "Q\ud800: "}}, "prompts['query'] holds an unpaired"),
        (lambda c: {**c, "prompts": {"\udc80": "x"}}, "prompts['\\udc80'] holds an unpaired"),
        (lambda c: {**c, "default_prompt_name": ["query"]}, "default_prompt_name ['query'] is not one of"),
        (lambda c: {**c, "default_prompt_name": {"a": 1}}, "default_prompt_name {'a': 1} is not one of"),
        (lambda c: {**c, "default_prompt_name": 0}, "default_prompt_name 0 is not one of"),
        (lambda c: {**c, "default_prompt_name": "nope"}, "default_prompt_name 'nope' is not one of"),
        (lambda c: {**c, "prompts": ["a"]}, "'prompts' must map names to prompt texts"),
        (lambda c: [c], "not a JSON object"),
    ],
)
def test_bad_prompts_are_refused_naming_the_file(folder, change, words):
    edit(folder, "config_sentence_transformers.json", change)
    with pytest.raises(EmbeddingError) as e:
        read_pooling(folder, D, False)
    assert str(e.value).startswith(f"{folder / 'config_sentence_transformers.json'}: ") and words in str(e.value)


@pytest.mark.parametrize("value", ["x", -1, 0, 1.5, True, [512], "512"])
def test_a_bad_max_seq_length_is_refused(folder, value):
    edit(folder, "sentence_bert_config.json", lambda c: {**c, "max_seq_length": value})
    with pytest.raises(EmbeddingError) as e:
        read_pooling(folder, D, False)
    assert str(e.value).startswith(f"{folder / 'sentence_bert_config.json'}: max_seq_length {value!r} is not")


@pytest.mark.parametrize("value, want", [(None, None), (16, 16)])
def test_a_max_seq_length_null_or_whole_is_taken(folder, value, want):
    edit(folder, "sentence_bert_config.json", lambda c: {**c, "max_seq_length": value})
    assert read_pooling(folder, D, False).max_seq_length == want


def test_a_given_prompt_with_a_lone_surrogate_is_refused(emb):
    with pytest.raises(EmbeddingError, match="^prompt holds an unpaired surrogate"):
        emb.encode(["x"], prompt="Q\ud800")
    with pytest.raises(EmbeddingError, match="prompt_name"):
        emb.encode(["x"], prompt_name=["query"])


@pytest.mark.parametrize(
    "name, change, words",
    [
        (
            "config_sentence_transformers.json",
            lambda c: {**c, "prompts": {**c["prompts"], "query": "\ud800"}},
            "holds an unpaired surrogate",
        ),
        ("config_sentence_transformers.json", lambda c: {**c, "default_prompt_name": ["query"]}, "default_prompt_name"),
        ("sentence_bert_config.json", lambda c: {**c, "max_seq_length": -1}, "max_seq_length -1"),
    ],
)
def test_the_cli_says_so_exit_2(folder, tmp_path, monkeypatch, name, change, words):
    monkeypatch.setenv("MLX_SLM_HOME", str(tmp_path / "home"))
    edit(folder, name, change)
    inp = tmp_path / "in.txt"
    inp.write_text("hello\n")
    r = invoke(["embed", inp, "--model", folder, "--dtype", "float32"])
    refused_cleanly(r, words, str(folder / name))
    error = next(ln for ln in r.output.splitlines() if "error:" in ln)
    assert str(tmp_path / "home") not in error  # the user's folder, not the cache's copy


def test_a_cli_prompt_not_utf8_is_refused(tiny_arch, tmp_path):
    inp = tmp_path / "in.txt"
    inp.write_text("hello\n")
    r = invoke(["embed", inp, "--model", tiny_arch.st_mlx(pooling="mean"), "--prompt", "Q\udcff"])
    refused_cleanly(r, "--prompt", "is not valid UTF-8")  # the CLI's own check of every option


from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from tests.suites.test_fuzz import FUZZ, doc_around, json_values  # noqa: E402

MODULES = [
    {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
    {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
]


HOSTILE_PATHS = ["", ".", "..", "../x", "/etc", "1_Pooling", "1_Pooling/", "a\\b", "\x00", "\ud800", None, 1]


HOSTILE_STRINGS = ["", " ", "\ud800", "query", "document", "lasttoken", "mean", "cls", "max", "x" * 300]


module_entry = st.fixed_dictionaries(
    {},
    optional={
        "type": st.one_of(st.sampled_from([m["type"] for m in MODULES] + ["x.Dense", ""]), json_values),
        "path": st.one_of(st.sampled_from(HOSTILE_PATHS), json_values),
    },
)


modules_json = st.one_of(st.just(MODULES), st.lists(module_entry, max_size=4), json_values)


pooling_json = doc_around(
    {"embedding_dimension": D, "pooling_mode": "mean", "include_prompt": True},
    ["embedding_dimension", "word_embedding_dimension", "pooling_mode", "include_prompt", "pooling_mode_mean_tokens"],
)


bert_json = doc_around(
    {"max_seq_length": 512, "do_lower_case": False},
    ["max_seq_length", "do_lower_case", "transformer_task", "modality_config"],
)


settings_json = doc_around(
    {"prompts": {"query": "Q: ", "document": ""}, "default_prompt_name": None},
    ["prompts", "default_prompt_name"],
) | st.dictionaries(
    st.sampled_from(["prompts", "default_prompt_name"]),
    st.one_of(st.dictionaries(st.sampled_from(HOSTILE_STRINGS), st.sampled_from(HOSTILE_STRINGS)), json_values),
)


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("st-fuzz")


@FUZZ
@given(modules=modules_json, pooling=pooling_json, bert=bert_json, settings=settings_json)
def test_any_folder_settings_give_a_usable_pooling_or_a_clean_refusal(work, modules, pooling, bert, settings):
    f = work / "st"
    shutil.rmtree(f, ignore_errors=True)
    (f / "1_Pooling").mkdir(parents=True)
    for name, value in [
        ("modules.json", modules),
        ("1_Pooling/config.json", pooling),
        ("sentence_bert_config.json", bert),
        ("config_sentence_transformers.json", settings),
    ]:
        (f / name).write_text(json.dumps(value))
    try:
        p = read_pooling(f, D, False)
    except EmbeddingError as e:
        assert str(e).startswith(str(f)) and not has_lone_surrogate(str(e))
        return
    assert p.mode in ("lasttoken", "mean", "cls") and p.dimension == D
    assert p.max_seq_length is None or (type(p.max_seq_length) is int and p.max_seq_length > 0)
    names = dict(p.prompts)
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in names.items())
    assert not any(has_lone_surrogate(k) or has_lone_surrogate(v) for k, v in names.items())
    assert p.default_prompt_name is None or p.default_prompt_name in names
    for name in [None, *names]:
        assert isinstance(p.prompt_text(name), str)


texts_arg = st.one_of(
    st.text(max_size=20),
    st.sampled_from(HOSTILE_STRINGS),
    st.binary(max_size=10),
    st.lists(st.one_of(st.text(max_size=20), st.sampled_from(HOSTILE_STRINGS), st.none(), st.integers()), max_size=5),
    st.dictionaries(st.text(max_size=3), st.text(max_size=3), max_size=2),
    st.integers(),
)


@FUZZ
@given(texts=texts_arg, prompt=st.one_of(st.none(), st.sampled_from(HOSTILE_STRINGS)))
def test_any_texts_give_one_row_each_or_a_clean_refusal(emb, texts, prompt):
    try:
        got = emb.embed(texts, prompt=prompt)
    except (TypeError, UserError):
        return
    n = 1 if isinstance(texts, str) else len(texts)
    assert got.vectors.shape == (n, D) and len(got.errors) == n
    for v, e in zip(got.vectors, got.errors):
        assert (e is None) == bool(np.isfinite(v).all())
