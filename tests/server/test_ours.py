"""Our own API (`server/ours.py`): POST /v1/classify, /v1/model, /health, /metrics."""

from __future__ import annotations

import json

import pytest


def _strict(text: str) -> list[dict]:
    """JSON lines as a strict parser reads them (NaN and Infinity are not JSON)."""

    def refuse(c):
        raise ValueError(f"{c} is not JSON")

    return [json.loads(x, parse_constant=refuse) for x in text.splitlines() if x.strip()]


def test_serve_answers_a_non_finite_probability_as_an_error_in_json(nan_seqcls):
    httpx = pytest.importorskip("httpx")
    pytest.importorskip("uvicorn")
    from mlx_slm.server import ServeOptions, Service, classifier_loader
    from tests.server.test_app import ThreadServer

    s = ThreadServer(Service(classifier_loader(str(nan_seqcls)), ServeOptions(max_wait_ms=5))).start()
    try:
        r = httpx.post(s.url + "/v1/classify", json={"texts": ["hello there", "my bill"]}, timeout=60)
    finally:
        s.stop()
    body = _strict(r.text)[0]  # strict JSON: no NaN or Infinity in it
    assert all("non-finite probability" in str(x.get("error")) for x in body["results"]), body
