"""Hostile round seven (issue 47) on embeddings: what a sentence-transformers folder may say and
what `Embedder` may be given, each answered as sentence-transformers answers or refused by name.

* A Pooling module at "" reads the backbone's config.json as its own: refused (as
  sentence-transformers refuses it), naming modules.json and the fix.
* One `str` is one text (`encode` gives its vector, as sentence-transformers' does), never a
  vector per character; bytes and mappings are refused, as `Classifier.classify` refuses them.
* A prompt holding a lone surrogate, a `default_prompt_name` that is no string, a
  `max_seq_length` that is no positive whole number: refused naming the file and the field
  (they were tracebacks, exit 70, or silently ignored).
* Fuzzing (Hypothesis): any JSON in the folder's four files gives a `Pooling` whose every
  value is usable, or an `EmbeddingError`; any texts argument gives vectors or a clean refusal.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from mlx_slm.classifier.embedder import Embedder, EmbeddingError, read_pooling
from mlx_slm.engine.engine import Engine
from mlx_slm.ground.errors import UserError
from mlx_slm.ground.textfiles import has_lone_surrogate
from tests.hostile import invoke, refused_cleanly

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


# ----------------------------------------------------------------------------- fuzzing

hypothesis = pytest.importorskip("hypothesis")
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
