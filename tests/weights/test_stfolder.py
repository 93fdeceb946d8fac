"""A sentence-transformers folder's files as a conversion sees them (issue 47).

* The conversion's fingerprint covers every file the folder's modules read, subfolders
  included: a `1_Pooling/config.json` edited after the first conversion kept the old pooling
  (cosine 0.41-0.45 against sentence-transformers), as did an edited modules.json's modules,
  max_seq_length or prompt.
* A Transformer module in a subfolder (`0_Transformer/`, as sentence-transformers 2.x saved it,
  and still loads) converts from there and embeds as sentence-transformers does.
* Messages about a cache entry's files name the user's folder, not the copy under `converted/`.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from mlx_slm.classifier.embedder import Embedder, EmbeddingError
from mlx_slm.engine.engine import Engine
from mlx_slm.weights import sources
from mlx_slm.weights.convert import ConversionError, convert, source_files
from mlx_slm.weights.sources import materialise
from mlx_slm.weights.stfolder import backbone_dir, module_files

TEXTS = ["refund please", "The app crashes when I open settings", "x"]
BACKBONE = ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"]


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    h = tmp_path / "home"
    monkeypatch.setenv("MLX_SLM_HOME", str(h))
    return h


@pytest.fixture
def folder(tiny_arch, tmp_path) -> Path:
    """A copy of a tiny sentence-transformers folder (last token, Normalize, prompts), ours to edit."""
    return Path(shutil.copytree(tiny_arch.st(), tmp_path / "st"))


def reference(folder: Path, texts, prompt_name=None) -> np.ndarray:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from sentence_transformers import SentenceTransformer

        st = SentenceTransformer(str(folder), device="cpu")
        return np.stack([st.encode([t], prompt_name=prompt_name)[0] for t in texts]).astype(np.float32)


def assert_same(ours: np.ndarray, ref: np.ndarray) -> None:
    cos = (ours * ref).sum(1) / np.linalg.norm(ours, axis=1) / np.linalg.norm(ref, axis=1)
    assert cos.min() >= 0.9999, cos


def edit(folder: Path, name: str, fn) -> None:
    p = folder / name
    p.write_text(json.dumps(fn(json.loads(p.read_text()))))  # in place: the folder's own stat unchanged


def embedder(folder: Path) -> Embedder:
    return Embedder(Engine.load(str(folder), dtype="float32"))


def test_the_fingerprint_holds_every_module_file(folder, tmp_path):
    (folder / "2_Normalize").mkdir(exist_ok=True)
    (folder / "2_Normalize" / "note.json").write_text("{}")
    (folder / "1_Pooling" / ".hidden").write_text("x")
    names = set(source_files(folder))
    assert {"modules.json", "sentence_bert_config.json", "config_sentence_transformers.json"} <= names
    assert {"1_Pooling/config.json", "2_Normalize/note.json"} <= names and "1_Pooling/.hidden" not in names
    assert {"1_Pooling/config.json", "2_Normalize/note.json"} <= set(module_files(folder))
    assert all("/" in n for n in module_files(folder))  # the root's files are SOURCE_FILES' to list


def test_an_edited_pooling_config_is_converted_again(folder, home):
    """The issue's case: lasttoken -> mean in 1_Pooling/config.json after the first use."""
    before = embedder(folder)
    assert before.pooling.mode == "lasttoken"
    assert_same(before.encode(TEXTS), reference(folder, TEXTS))
    edit(folder, "1_Pooling/config.json", lambda c: {**c, "pooling_mode": "mean"})
    out = materialise(str(folder), "float32")
    assert sources.stale(sources.resolve(str(folder)), out) == []  # converted again, into the same entry
    after = embedder(folder)
    assert after.pooling.mode == "mean" and after.engine.path == before.engine.path
    assert_same(after.encode(TEXTS), reference(folder, TEXTS))


@pytest.mark.parametrize(
    "name, change, check",
    [
        ("modules.json", lambda m: m[:2], lambda p: not p.normalize),  # the Normalize module dropped
        ("sentence_bert_config.json", lambda c: {**c, "max_seq_length": 7}, lambda p: p.max_seq_length == 7),
        (
            "config_sentence_transformers.json",
            lambda c: {**c, "prompts": {**c["prompts"], "query": "Q: "}, "default_prompt_name": "query"},
            lambda p: dict(p.prompts)["query"] == "Q: " and p.default_prompt_name == "query",
        ),
    ],
)
def test_every_edited_module_file_is_converted_again(folder, home, name, change, check):
    assert not check(embedder(folder).pooling)
    edit(folder, name, change)
    assert check(embedder(folder).pooling)


def test_an_untouched_folder_is_not_converted_again(folder, home, monkeypatch):
    out = materialise(str(folder), "float32")

    def refuse(*_a, **_k):
        raise AssertionError("converted again")

    monkeypatch.setattr(sources, "convert", refuse)
    assert materialise(str(folder), "float32") == out


def subfolder_layout(folder: Path) -> Path:
    """The 2.x layout: the backbone and sentence_bert_config.json in 0_Transformer/."""
    sub = folder / "0_Transformer"
    sub.mkdir()
    for n in [*BACKBONE, "sentence_bert_config.json"]:
        if (folder / n).exists():
            (folder / n).rename(sub / n)
    edit(folder, "modules.json", lambda m: [{**m[0], "path": "0_Transformer"}, *m[1:]])
    return folder


def test_a_transformer_in_a_subfolder_converts_and_embeds_as_sentence_transformers(folder, home, tmp_path):
    subfolder_layout(folder)
    assert backbone_dir(folder) == folder / "0_Transformer"
    assert "0_Transformer/model.safetensors" in source_files(folder)
    emb = embedder(folder)
    assert emb.pooling.mode == "lasttoken" and emb.pooling.normalize
    for name in (None, "query"):
        assert_same(emb.encode(TEXTS, prompt_name=name), reference(folder, TEXTS, name))
    # the conversion is today's layout (the Transformer at its root): sentence-transformers loads it too
    out = emb.engine.path
    assert json.loads((out / "modules.json").read_text())[0]["path"] == ""
    assert_same(emb.encode(TEXTS), reference(out, TEXTS))
    rec = json.loads((out / "conversion.json").read_text())
    assert rec["sentence_transformers_files"]["sentence_bert_config.json"] == "0_Transformer/sentence_bert_config.json"
    # convert --out: the same
    got = convert(folder, tmp_path / "out", dtype="float32", progress=None)
    assert_same(Embedder(Engine.load(str(got))).encode(TEXTS), reference(folder, TEXTS))
    # an edit inside 0_Transformer/ converts again
    edit(folder, "0_Transformer/sentence_bert_config.json", lambda c: {**c, "max_seq_length": 9})
    assert embedder(folder).pooling.max_seq_length == 9


@pytest.mark.parametrize(
    "path, words",
    [
        ("../elsewhere", "'../elsewhere' is not a folder inside"),
        ("/abs", "'/abs' is not a folder inside"),
        ("missing", "'missing' holds no config.json"),
    ],
)
def test_a_transformer_path_that_holds_no_backbone_is_named(folder, home, path, words):
    subfolder_layout(folder)
    edit(folder, "modules.json", lambda m: [{**m[0], "path": path}, *m[1:]])
    with pytest.raises((ConversionError, EmbeddingError, sources.ModelError)) as e:
        Engine.load(str(folder))
    assert words in str(e.value) and "modules.json" in str(e.value) and "set" in str(e.value)


def test_messages_name_the_users_folder_not_the_cache_copy(folder, home):
    edit(folder, "1_Pooling/config.json", lambda c: {**c, "pooling_mode": "max"})
    with pytest.raises(EmbeddingError) as e:
        embedder(folder)
    assert str(e.value).startswith(f"{folder / '1_Pooling' / 'config.json'}: pooling 'max'")
    assert str(home) not in str(e.value)


def test_messages_name_the_users_file_in_a_transformer_subfolder(folder, home):
    subfolder_layout(folder)
    edit(folder, "0_Transformer/sentence_bert_config.json", lambda c: {**c, "max_seq_length": "x"})
    with pytest.raises(EmbeddingError) as e:
        embedder(folder)
    assert str(e.value).startswith(f"{folder / '0_Transformer' / 'sentence_bert_config.json'}: max_seq_length 'x'")


def test_a_converted_folder_used_in_place_names_itself(folder, tmp_path):
    """`convert --out` is the user's own folder: its files are named there."""
    out = convert(folder, tmp_path / "out", dtype="float32", progress=None)
    edit(out, "1_Pooling/config.json", lambda c: {**c, "pooling_mode": "max"})
    with pytest.raises(EmbeddingError, match=f"^{out / '1_Pooling' / 'config.json'}: pooling 'max'"):
        Embedder(Engine.load(str(out)))


# ----------------------------------------------------------------------------- fuzzing

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from tests.suites.test_fuzz import FUZZ  # noqa: E402

ST_FILES = [
    "modules.json",
    "sentence_bert_config.json",
    "config_sentence_transformers.json",
    "1_Pooling/config.json",
    "2_Normalize/config.json",
    "3_Dense/config.json",
    "3_Dense/model.safetensors",
]


@pytest.fixture(scope="module")
def fuzz_folder(tiny_arch, tmp_path_factory) -> Path:
    """The tiny folder's sentence-transformers files (no weights needed: only fingerprints are compared),
    with a Dense module's folder added to modules.json."""
    f = tmp_path_factory.mktemp("st-fp") / "st"
    src = tiny_arch.st()
    for n in ST_FILES[:5]:
        (f / n).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src / n, f / n)
    (f / "3_Dense").mkdir()
    (f / "3_Dense" / "config.json").write_text('{"in_features": 64}')
    (f / "3_Dense" / "model.safetensors").write_bytes(b"\0" * 64)
    mods = json.loads((f / "modules.json").read_text())
    mods.append({"idx": 3, "name": "3", "path": "3_Dense", "type": "sentence_transformers.models.Dense"})
    (f / "modules.json").write_text(json.dumps(mods))
    return f


@FUZZ
@given(name=st.sampled_from(ST_FILES), data=st.binary(max_size=64))
def test_any_module_file_rewritten_is_a_change(fuzz_folder, tmp_path_factory, name, data):
    """Whatever a module file of any module's folder becomes, the check says so by its name."""
    from mlx_slm.weights.convert import RECORD, source_changes

    f = tmp_path_factory.mktemp("fp") / "st"
    shutil.copytree(fuzz_folder, f)
    out = f.parent / "out"
    out.mkdir()
    (out / RECORD).write_text(json.dumps({"source_files": source_files(f)}))
    assert source_changes(out, f) == []
    before = (f / name).read_bytes()
    (f / name).write_bytes(data)
    changes = source_changes(out, f)
    if data == before:
        assert changes == []
    else:  # a modules.json rewritten may also drop the module files it named: they count as changed too
        assert name in changes and (name == "modules.json" or changes == [name]), (name, changes)
