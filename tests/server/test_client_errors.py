"""The service under hostile clients: every client-caused failure is a 4xx, counted, with no
traceback logged; a request that timed out never holds up the next one.

Was tests/test_service_robustness.py."""

from __future__ import annotations

import json
import logging
import socket
import time

import pytest

from tests.hostile import LiveServer as _Server

httpx = pytest.importorskip("httpx")


pytest.importorskip("starlette")


uvicorn = pytest.importorskip("uvicorn")


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record):
        self.records.append(record)


@pytest.fixture(scope="module")
def server(tiny_qwen_mlx):
    from mlx_slm.server import ServeOptions, Service, classifier_loader

    with _Server(Service(classifier_loader(str(tiny_qwen_mlx)), ServeOptions(max_wait_ms=2))) as s:
        yield s


def test_service_hostile_bodies_are_422_and_counted(server):
    before = server.metric("invalid")
    bodies = {
        "deep": b'{"text": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",  # 200 KB, nested past the recursion limit
        "deep object": b'{"text": "x", "labels": ' + b'{"a":' * 60_000 + b"1" + b"}" * 60_000 + b"}",
        "surrogate text": b'{"text": "hello \\ud800 there"}',
        "surrogate texts": b'{"texts": ["ok", "\\udfff"]}',
        "surrogate id": b'{"texts": ["ok"], "ids": ["\\ud800"]}',
        "surrogate label": b'{"text": "ok", "labels": ["a\\ud800", "b"]}',
        "surrogate system": b'{"text": "ok", "system": "\\ud800"}',
        "surrogate template": b'{"text": "ok", "template": "{text}\\ud800"}',
        "surrogate field name": b'{"text": "ok", "\\ud800": 1}',
        "not utf-8": b'{"text": "\xff"}',
        "big int": b'{"text": "ok", "min_confidence": ' + b"9" * 5000 + b"}",
        "nan": b'{"text": "ok", "min_confidence": NaN}',
    }
    for what, body in bodies.items():
        r = server.post(body)
        assert r.status_code == 422, (what, r.status_code, r.text[:300])
        assert r.json()["error"]["status"] == 422, what
    assert server.metric("invalid") - before == len(bodies)
    assert server.metric("error") == 0
    assert server.post(b'{"text": "My card was charged twice."}').status_code == 200


def test_client_gone_mid_upload_logs_no_traceback(server):
    rec = _Records()
    loggers = [logging.getLogger(n) for n in ("uvicorn.error", "uvicorn", "mlx_slm.server", "")]
    for lg in loggers:
        lg.addHandler(rec)
    try:
        before = server.metric("client_gone")
        for _ in range(5):
            s = socket.create_connection(("127.0.0.1", server.port))
            s.sendall(
                b"POST /v1/classify HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: 100000\r\n\r\n" + b'{"text": "' + b"a" * 5000
            )
            time.sleep(0.05)
            s.close()
        end = time.time() + 10
        while server.metric("client_gone") - before < 5:
            assert time.time() < end, "disconnects were not counted"
            time.sleep(0.05)
    finally:
        for lg in loggers:
            lg.removeHandler(rec)
    tracebacks = [
        r for r in rec.records if r.exc_info or "Traceback" in r.getMessage() or "Exception" in r.getMessage()
    ]
    assert not tracebacks, [r.getMessage() for r in tracebacks]


def test_a_timed_out_forward_does_not_hold_up_the_next_request(tiny_qwen_mlx):
    """Compute is made slow (a sleep per padded token in the forward pass); the request timeout
    is shorter than a full micro-batch would take. A request of many texts times out (504), and
    one of a very long text, priced over the whole timeout, is refused before its forward (413);
    the trivial request sent right after each gets its answer (200)
    rather than waiting behind work for a request nobody waits for. Nothing here asserts a
    duration: only the status codes."""
    from mlx_slm.server import ServeOptions, Service, classifier_loader

    per_token = 0.012  # seconds of "compute" per token: a full micro-batch (512 tokens) takes ~6 s
    inner = classifier_loader(str(tiny_qwen_mlx))

    def slow_loader():
        loaded = inner()
        eng = loaded.clf.engine
        fwd, pre = eng.forward, eng.prefix

        def forward(batch, *a, **k):
            time.sleep(per_token * batch.padded_tokens)
            return fwd(batch, *a, **k)

        def prefix(tokens):
            cache, computed = pre(tokens)
            if computed:
                time.sleep(per_token * len(tokens))
            return cache, computed

        eng.forward, eng.prefix = forward, prefix
        return loaded

    opts = ServeOptions(max_wait_ms=2, request_timeout_s=2.0)
    many = {"texts": [f"ticket {i}: my invoice shows the wrong amount again" for i in range(96)]}
    long = {"text": " ".join(["the invoice and the app and my account"] * 70)}  # ~900 tokens: ~11 s
    with _Server(Service(slow_loader, opts)) as s:
        for heavy, status in ((many, 504), (long, 413)):
            r = s.post(json.dumps(heavy).encode(), timeout=60)
            assert r.status_code == status, r.text[:300]
            nxt = s.post(b'{"text": "My card was charged twice."}', timeout=60)
            assert nxt.status_code == 200, nxt.text[:300]
        text = httpx.get(s.url + "/metrics").text
        dropped = sum(float(ln.split()[-1]) for ln in text.splitlines() if 'outcome="dropped"' in ln)
        assert dropped > 0  # the timed-out work was dropped, not computed
