"""Auth (`server/auth.py`): a Bearer key (--api-key or MLX_SLM_API_KEY), refused at start when blank or
not sendable, compared as the bytes a client sends."""

from __future__ import annotations

import pytest

from tests.hostile import LiveServer, invoke, refused_cleanly

pytest.importorskip("starlette")


pytest.importorskip("uvicorn")


def _service(model, **kw):
    from mlx_slm.server import ServeOptions, Service, classifier_loader

    opts = kw.pop("opts", None) or ServeOptions(max_wait_ms=2)
    return Service(classifier_loader(str(model), ["billing", "technical"], **kw), opts)


# ----------------------------------------------------------------------------- the key


@pytest.mark.parametrize("key", ["", "   ", " pad", "tab\tkey", "\udcff"])
def test_a_blank_or_unsendable_api_key_is_refused_at_start(key, tmp_path):
    r = invoke(["serve", "--model", tmp_path / "no-model", "--api-key", key])
    refused_cleanly(r, "--api-key")
    assert "no-model" not in r.output  # before the model is looked for


def test_a_blank_key_in_the_environment_is_refused_and_an_empty_one_is_none(monkeypatch, tmp_path):
    from mlx_slm.server import ServeOptions, api_key_from_env

    monkeypatch.setenv("MLX_SLM_API_KEY", "  ")
    with pytest.raises(Exception, match="--api-key is blank"):
        ServeOptions(api_key=api_key_from_env(None))
    monkeypatch.setenv("MLX_SLM_API_KEY", "")
    assert api_key_from_env(None) is None


def test_a_utf8_key_is_compared_as_the_bytes_a_client_sends(tiny_qwen_mlx):
    from mlx_slm.server import ServeOptions

    svc = _service(tiny_qwen_mlx, opts=ServeOptions(max_wait_ms=2, api_key="clé-ü"))
    with LiveServer(svc) as s:
        body = b'{"text": "My card was charged twice"}'
        ok = s.post(body, headers={"authorization": "Bearer clé-ü".encode()})
        assert ok.status_code == 200, ok.text
        for wrong in ("Bearer clé-u".encode(), "Bearer clé-ü".encode("latin-1"), b"Bearer"):
            assert s.post(body, headers={"authorization": wrong}).status_code == 401
