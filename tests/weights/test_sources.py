"""Model sources: what a name, path, hub id or GGUF resolves to, fetched and converted once.

`sources.resolve` is pure (no network, no writes), so most of these need no model at all:
a folder with a config.json is a Hugging Face directory to it, a folder with a conversion
record and weights file a converted one. The hub is never reached: offline mode
(HF_HUB_OFFLINE) and an empty hub cache in a temporary folder stand in for a machine
without a network. Every cache these tests write is a temporary MLX_SLM_HOME.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
from click.testing import CliRunner

from mlx_slm.cli import main
from mlx_slm.ground.errors import ModelError, UserError
from mlx_slm.weights import sources
from mlx_slm.weights.convert import RECORD, WEIGHTS, ConversionError, convert
from mlx_slm.weights.registry import BUILTINS
from mlx_slm.weights.sources import Source, cached_path, fetch, is_hub_id, materialise, resolve


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    """A private model cache for the test."""
    h = tmp_path / "home"
    monkeypatch.setenv("MLX_SLM_HOME", str(h))
    return h


@pytest.fixture
def offline(tmp_path, monkeypatch) -> None:
    """No network: huggingface_hub offline, with an empty hub cache of the test's own."""
    import huggingface_hub.constants as hub

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # what mlx-slm reads (sources.hub_offline)
    monkeypatch.setattr(hub, "HF_HUB_OFFLINE", True)  # what huggingface_hub read at its import
    monkeypatch.setattr(hub, "HF_HUB_CACHE", str(tmp_path / "hub-cache"))


def hf_dir(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    return path


def converted_dir(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / RECORD).write_text(json.dumps({"source_kind": "hf"}))
    (path / WEIGHTS).write_bytes(struct.pack("<Q", 2) + b"{}")  # a whole (empty) safetensors file
    (path / "config.json").write_text("{}")
    (path / "tokenizer.json").write_text("{}")
    return path


def no_fetching(*_a, **_k):
    raise AssertionError("fetched although the source is local or cached")


# --------------------------------------------------------------------------- the rule


@pytest.mark.parametrize(
    "spelling, hub",
    [
        ("Qwen/Qwen2.5-0.5B-Instruct", True),
        ("HuggingFaceTB/SmolLM2-135M-Instruct", True),
        ("org/name", True),
        ("a/b/c", False),  # a path, not a repository
        ("./org/name", False),
        ("/org", False),
        ("~/models", False),
        ("org/model.gguf", False),  # a GGUF file name
        ("org--x/name", False),  # huggingface_hub forbids -- and ..
        ("org/na..me", False),
        ("qwen2.5-coder-0.5b", False),  # no owner
        ("org/" + "x" * 100, False),  # longer than the hub allows
    ],
)
def test_the_one_hub_id_rule(spelling, hub):
    assert is_hub_id(spelling) is hub


def test_a_built_in_name_resolves_without_fetching(monkeypatch):
    monkeypatch.setattr(sources, "fetch_gguf", no_fetching)
    for name in BUILTINS:
        assert resolve(name) == Source(name, "builtin")


def test_local_sources_resolve_to_their_kind_and_path(tmp_path):
    hf = hf_dir(tmp_path / "hf")
    assert resolve(str(hf)) == Source(str(hf), "hf", hf, str(hf))
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    assert resolve(gguf) == Source(str(gguf), "gguf", gguf, str(gguf))
    done = converted_dir(tmp_path / "done")
    assert resolve(done).type == "mlx" and resolve(done).path == done


def test_an_existing_path_wins_over_the_hub_spelling(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    hf_dir(tmp_path / "org" / "name")
    s = resolve("org/name")
    assert s.type == "hf" and s.path == Path("org/name")


def test_a_hub_id_resolves_without_the_network(monkeypatch):
    monkeypatch.setattr(sources, "hub_snapshot", no_fetching)
    assert resolve("Qwen/Qwen2.5-0.5B-Instruct") == Source("Qwen/Qwen2.5-0.5B-Instruct", "hub")


@pytest.mark.parametrize(
    "spelling, message",
    [
        ("no-such-model", "not a built-in name (smollm2-135m, qwen2.5-coder-0.5b), an existing path, or a hub id"),
        ("./missing", "./missing: no such file or directory, and not a hub id like 'Qwen/Qwen2.5-0.5B-Instruct'"),
        ("a/b/c", "a/b/c: no such file or directory"),
        ("missing.gguf", "missing.gguf: no such GGUF file"),
        ("org/missing.gguf", "org/missing.gguf: no such GGUF file"),
    ],
)
def test_a_source_that_does_not_exist_is_a_user_error_naming_it(tmp_path, monkeypatch, spelling, message):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError) as e:
        resolve(spelling)
    assert message in str(e.value)


def test_a_path_that_is_no_model_says_why(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ConversionError, match=f"no config.json in {empty}: not a Hugging Face or MLX model"):
        resolve(empty)
    text = tmp_path / "notes.txt"
    text.write_text("hi")
    with pytest.raises(ConversionError, match="notes.txt: not a directory, a .gguf file or a hub id"):
        resolve(text)
    folder = tmp_path / "x.gguf"
    folder.mkdir()
    with pytest.raises(ConversionError, match="x.gguf: no such GGUF file"):
        resolve(folder)


# --------------------------------------------------------------------------- fetching


def test_a_hub_id_offline_is_a_clear_error_naming_the_fix(offline, home):
    with pytest.raises(ModelError) as e:
        fetch(resolve("no-such-org/no-such-model"))
    msg = str(e.value)
    assert msg.startswith("no-such-org/no-such-model: could not fetch from the Hugging Face hub (")
    assert "HF_HUB_OFFLINE is set" in msg and "hf download no-such-org/no-such-model --local-dir DIR" in msg
    assert "built-in name (smollm2-135m, qwen2.5-coder-0.5b)" in msg and "\n" not in msg
    assert not home.exists()  # nothing written to our cache


def test_local_sources_are_fetched_as_they_are(tmp_path, monkeypatch):
    monkeypatch.setattr(sources, "hub_snapshot", no_fetching)
    monkeypatch.setattr(sources, "fetch_gguf", no_fetching)
    hf = hf_dir(tmp_path / "hf")
    assert fetch(resolve(hf)) == resolve(hf)


def test_a_hub_snapshot_becomes_a_local_hf_source_recorded_by_its_id(tmp_path, monkeypatch):
    snap = hf_dir(tmp_path / "snapshot")
    monkeypatch.setattr(sources, "hub_snapshot", lambda repo: snap)
    assert fetch(resolve("org/name")) == Source("org/name", "hf", snap, "org/name")


# --------------------------------------------------------------------------- the cache


def test_a_converted_directory_is_used_in_place(tmp_path, home, monkeypatch):
    monkeypatch.setattr(sources, "convert", no_fetching)
    done = converted_dir(tmp_path / "done")
    assert materialise(str(done)) == done
    assert not home.exists()


def test_a_hub_id_converted_once_loads_with_no_network(home, offline, monkeypatch):
    hub_snapshot = sources.hub_snapshot
    monkeypatch.setattr(sources, "hub_snapshot", no_fetching)
    entry = converted_dir(cached_path(resolve("org/name"), "float16"))
    assert entry.parent == home / "converted"
    assert materialise("org/name") == entry
    monkeypatch.setattr(sources, "hub_snapshot", hub_snapshot)
    with pytest.raises(ModelError, match="org/name: could not fetch"):  # another dtype is not cached: the hub
        materialise("org/name", dtype="float32")
    assert [p.name for p in (home / "converted").iterdir()] == [entry.name]  # a failed fetch leaves nothing


def test_a_local_checkpoint_is_converted_once_into_the_cache(tiny_qwen_hf, home, monkeypatch):
    out = materialise(str(tiny_qwen_hf), dtype="float32")
    assert out.parent == home / "converted" and out.name.endswith("-float32")
    rec = json.loads((out / RECORD).read_text())
    assert rec["source"] == str(tiny_qwen_hf) and rec["source_kind"] == "hf"
    monkeypatch.setattr(sources, "convert", no_fetching)
    assert materialise(str(tiny_qwen_hf), dtype="float32") == out  # the second time: found, not converted


def test_convert_reads_local_files_only(tmp_path):
    with pytest.raises(ConversionError, match="org/name: no such file or directory .convert reads local files"):
        convert("org/name", tmp_path / "out", progress=None)
    assert not (tmp_path / "out").exists()


def test_the_convert_command_fetches_through_sources(tmp_path, offline, home):
    r = CliRunner().invoke(main, ["convert", "no-such-org/no-such-model", "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and "could not fetch from the Hugging Face hub" in r.output
    assert "Traceback" not in r.output and not (tmp_path / "o").exists()
    r = CliRunner().invoke(main, ["convert", "no-such-model", "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and "not a built-in name" in r.output


def test_doctor_says_where_models_come_from(monkeypatch):
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert "hub, offline" in sources.describe() and "smollm2-135m" in sources.describe()
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    assert "hub, online" in sources.describe()
