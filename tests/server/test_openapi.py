"""The OpenAPI document (`server/openapi.py`) at /openapi.json: every route of every wire API; a route it
does not list, or a method, answers JSON."""

from __future__ import annotations

import pytest

httpx = pytest.importorskip("httpx")


pytest.importorskip("starlette")


pytest.importorskip("uvicorn")


from mlx_slm.server import ServeOptions, Service, classifier_loader  # noqa: E402
from tests.server.test_app import ThreadServer  # noqa: E402


@pytest.fixture(scope="module")
def srv(tiny_qwen_mlx):
    s = ThreadServer(Service(classifier_loader(str(tiny_qwen_mlx)), ServeOptions(max_wait_ms=5))).start()
    yield s
    s.stop()


# ----------------------------------------------------------------------------- every error is JSON


def test_unknown_routes_and_methods_answer_json(srv):
    r = httpx.get(srv.url + "/nope")
    assert r.status_code == 404 and r.headers["content-type"].startswith("application/json")
    assert r.json()["error"]["status"] == 404 and "/openapi.json" in r.json()["error"]["message"]
    r = httpx.get(srv.url + "/v1/classify")
    assert r.status_code == 405 and "POST" in r.headers["allow"]
    assert r.json()["error"]["status"] == 405 and "POST" in r.json()["error"]["message"]
    r = httpx.get(srv.url + "/predict")
    assert r.status_code == 405 and r.json()["error_type"] == "MethodNotAllowed"
    r = httpx.delete(srv.url + "/health")
    assert r.status_code == 405 and r.json()["error"]["status"] == 405
    # Starlette builds Allow from a set; ours is sorted, so it does not change with the hash seed.
    assert r.headers["allow"] == "GET, HEAD" and r.json()["error"]["message"].endswith("use GET, HEAD")


def test_openapi_lists_the_new_routes(srv):
    paths = httpx.get(srv.url + "/openapi.json").json()["paths"]
    for p, method in (
        ("/v1/classify", "post"),
        ("/classify", "post"),
        ("/predict", "post"),
        ("/", "post"),
        ("/info", "get"),
        ("/v1/models", "get"),
    ):
        assert method in paths[p], p
