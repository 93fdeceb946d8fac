"""vLLM's classification API (`server/vllm.py`) over real HTTP on 127.0.0.1: /classify with the docs'
body, vLLM-shaped errors, /v1/models."""

from __future__ import annotations

import math

import pytest

httpx = pytest.importorskip("httpx")


pytest.importorskip("starlette")


pytest.importorskip("uvicorn")


from tests.server.test_app import TEXTS, classify_results  # noqa: E402

LABELS = ["billing", "technical", "account"]


# ----------------------------------------------------------------------------- vLLM

# Exactly the body of vLLM's docs (Classification API, "Example Request").
VLLM_DOCS_BODY = {
    "model": "jason9693/Qwen2.5-1.5B-apeach",
    "input": ["Loved the new café—coffee was great.", "This update broke everything. Frustrating."],
}


def _check_vllm_shape(got, n, srv):
    assert set(got) == {"id", "object", "created", "model", "data", "usage"}
    assert got["object"] == "list" and got["id"].startswith("classify-") and isinstance(got["created"], int)
    assert got["model"] == srv.service.loaded.model
    assert [d["index"] for d in got["data"]] == list(range(n))
    for d in got["data"]:
        assert set(d) == {"index", "label", "probs", "num_classes"}
        assert d["num_classes"] == 3 and len(d["probs"]) == 3 and d["label"] in LABELS
        assert math.isclose(sum(d["probs"]), 1.0, abs_tol=1e-6)
        assert d["label"] == LABELS[max(range(3), key=lambda k: d["probs"][k])]  # the task's label order
    u = got["usage"]
    assert u["prompt_tokens"] > 0 and u["total_tokens"] == u["prompt_tokens"]


def test_vllm_classify_docs_body(srv):
    r = httpx.post(srv.url + "/classify", json=VLLM_DOCS_BODY, timeout=30)
    assert r.status_code == 200, r.text
    got = r.json()
    _check_vllm_shape(got, 2, srv)
    ours = classify_results(srv, VLLM_DOCS_BODY["input"])
    for d, rec in zip(got["data"], ours):
        assert d["label"] == rec["label"]
        assert all(abs(p - rec["probs"][lab]) < 1e-6 for p, lab in zip(d["probs"], LABELS))
    # /v1/classify answers vLLM's shape for vLLM's body, and our own for ours
    v1 = httpx.post(srv.url + "/v1/classify", json=VLLM_DOCS_BODY, timeout=30).json()
    _check_vllm_shape(v1, 2, srv)
    assert [d["probs"] for d in v1["data"]] == [d["probs"] for d in got["data"]]
    one = httpx.post(srv.url + "/classify", json={"model": "x", "input": TEXTS[0]}, timeout=30).json()
    _check_vllm_shape(one, 1, srv)


def test_vllm_errors_and_models(srv):
    r = httpx.post(srv.url + "/classify", json={"model": "m", "input": [1, 2]}, timeout=30)
    assert r.status_code == 422
    err = r.json()["error"]
    assert err["param"] == "input[0]" and err["type"] == "invalid_request_error" and err["code"] == 422
    r = httpx.post(srv.url + "/classify", json={"input": "x", "truncate_prompt_tokens": 5}, timeout=30)
    assert r.status_code == 422 and "truncate_prompt_tokens" in r.json()["error"]["message"]
    r = httpx.post(srv.url + "/v1/classify", json={"input": ""}, timeout=30)
    assert r.status_code == 422 and r.json()["error"]["field"] == "input"
    r = httpx.post(srv.url + "/v1/classify", json={"inputs": "x"}, timeout=30)
    assert r.status_code == 422 and "/predict" in r.json()["error"]["message"]
    models = httpx.get(srv.url + "/v1/models").json()
    assert models["object"] == "list" and models["data"][0]["id"] == srv.service.loaded.model
    assert models["data"][0]["object"] == "model" and models["data"][0]["max_model_len"] > 0
