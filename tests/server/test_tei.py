"""text-embeddings-inference's API (`server/tei.py`) over real HTTP on 127.0.0.1, as the clients people
already have see it: /predict and /info, Hugging Face's `InferenceClient`, TEI-shaped errors."""

from __future__ import annotations

import math

import pytest

httpx = pytest.importorskip("httpx")


pytest.importorskip("starlette")


pytest.importorskip("uvicorn")


from tests.server.test_app import TEXTS, classify_results  # noqa: E402

LABELS = ["billing", "technical", "account"]


# ----------------------------------------------------------------------------- TEI


def test_tei_predict_one_string_and_a_list(srv):
    ours = classify_results(srv, TEXTS[:3])
    r = httpx.post(srv.url + "/predict", json={"inputs": TEXTS[0]}, timeout=30)
    assert r.status_code == 200, r.text
    one = r.json()
    assert isinstance(one, list) and len(one) == 1 and isinstance(one[0], list)
    got = one[0]
    assert [d["label"] for d in got] == sorted(LABELS, key=lambda lab: -ours[0]["probs"][lab])
    assert [d["score"] for d in got] == sorted((d["score"] for d in got), reverse=True)
    assert math.isclose(sum(d["score"] for d in got), 1.0, abs_tol=1e-6)
    for d in got:  # the same probabilities as our own route (which rounds to 6 places)
        assert abs(d["score"] - ours[0]["probs"][d["label"]]) < 1e-6
    many = httpx.post(srv.url + "/predict", json={"inputs": TEXTS[:3]}, timeout=30).json()
    assert len(many) == 3
    for lst, rec in zip(many, ours):
        assert lst[0]["label"] == rec["label"] and len(lst) == 3
    # POST / is /predict, as TEI serves it
    assert httpx.post(srv.url + "/", json={"inputs": TEXTS[0]}, timeout=30).json() == one


def test_tei_raw_scores_truncate_and_parameters(srv):
    raw = httpx.post(srv.url + "/predict", json={"inputs": "hello", "raw_scores": True}, timeout=30).json()[0]
    probs = httpx.post(srv.url + "/predict", json={"inputs": "hello"}, timeout=30).json()[0]
    assert [d["label"] for d in raw] == [d["label"] for d in probs]
    assert not math.isclose(sum(d["score"] for d in raw), 1.0, abs_tol=1e-3)  # logits, not probabilities
    top = httpx.post(
        srv.url + "/", json={"inputs": "hello", "parameters": {"top_k": 1, "function_to_apply": None}}, timeout=30
    ).json()
    assert top == [probs[:1]]
    long = "word " * 5000
    r = httpx.post(srv.url + "/predict", json={"inputs": long}, timeout=60)
    assert r.status_code == 422 and r.json()["error_type"] == "Validation"
    assert '"truncate": true' in r.json()["error"]
    r = httpx.post(srv.url + "/predict", json={"inputs": long, "truncate": True}, timeout=60)
    assert r.status_code == 200 and len(r.json()[0]) == 3


@pytest.mark.parametrize(
    "body, needle",
    [
        ({}, "'inputs' is missing"),
        ({"inputs": ""}, "empty"),
        ({"inputs": []}, "empty"),
        ({"inputs": [["a", "b"]]}, "second text (text_pair)"),  # a pair, on a prompt of one text
        ({"inputs": 3}, "string or a list"),
        ({"inputs": "x", "raw_scores": "yes"}, "raw_scores"),
        ({"inputs": "x", "parameters": {"function_to_apply": "tanh"}}, "tanh"),
        ({"inputs": "x", "raw_scores": True, "parameters": {"function_to_apply": "softmax"}}, "send one"),
        ({"inputs": "x", "parameters": {"top_k": 0}}, "top_k"),
        ({"inputs": "x", "bogus": 1}, "unknown field 'bogus'"),
    ],
)
def test_tei_errors_are_tei_shaped(srv, body, needle):
    r = httpx.post(srv.url + "/predict", json=body, timeout=30)
    assert r.status_code == 422, r.text
    err = r.json()
    assert isinstance(err["error"], str) and needle in err["error"] and err["error_type"] == "Validation"


def test_tei_info(srv):
    info = httpx.get(srv.url + "/info").json()
    assert info["model_type"]["classifier"]["id2label"] == {"0": "billing", "1": "technical", "2": "account"}
    assert info["max_input_length"] > 0 and info["max_batch_tokens"] > 0 and info["version"]
    assert len(info["model_sha"]) == 64 and info["model_id"]


def _client_labels(url, token=None):
    from huggingface_hub import InferenceClient

    return InferenceClient(base_url=url, api_key=token).text_classification("My card was charged twice")


def test_huggingface_inference_client(srv):
    pytest.importorskip("huggingface_hub")
    out = _client_labels(srv.url)
    assert sorted(e.label for e in out) == sorted(LABELS)
    assert math.isclose(sum(e.score for e in out), 1.0, abs_tol=1e-6)
    assert [e.score for e in out] == sorted((e.score for e in out), reverse=True)
    ours = classify_results(srv, ["My card was charged twice"])[0]
    assert out[0].label == ours["label"]


def test_huggingface_inference_client_with_api_key(srv):
    pytest.importorskip("huggingface_hub")
    from huggingface_hub.errors import HfHubHTTPError

    o = srv.service.opts
    o.api_key = "s3cret"
    try:
        with pytest.raises(HfHubHTTPError) as ei:
            _client_labels(srv.url)  # no token
        assert ei.value.response.status_code == 401 and "API key" in str(ei.value)
        with pytest.raises(HfHubHTTPError):
            _client_labels(srv.url, "wrong")
        out = _client_labels(srv.url, "s3cret")
        assert sorted(e.label for e in out) == sorted(LABELS)
        assert httpx.get(srv.url + "/info").status_code == 401
        assert httpx.get(srv.url + "/v1/models").status_code == 401
        r = httpx.post(srv.url + "/classify", json={"input": "x"})
        assert r.status_code == 401 and r.json()["error"]["type"] == "invalid_request_error"
    finally:
        o.api_key = None
