"""Request checks (`server/checks.py`): the body (size, JSON) and each route's fields. A request over the
items limit is a 413 naming the limit that applied (issue 40): the
items-per-request limit, or the queue's (--max-queue-items) where that is lower (a request is
queued whole), or the most documents one rerank query takes; on every route's body check."""

from __future__ import annotations

import gzip
import json

import pytest

pytest.importorskip("starlette")

from mlx_slm.server.checks import check_request  # noqa: E402
from mlx_slm.server.errors import HTTPError  # noqa: E402
from mlx_slm.server.rerank import check_cohere, check_tei_rerank  # noqa: E402
from mlx_slm.server.tei import check_tei  # noqa: E402
from mlx_slm.service import ServeOptions  # noqa: E402

BODIES = [
    (lambda d, o: check_request({"texts": d}, o), "texts"),
    (lambda d, o: check_tei({"inputs": d}, o), "inputs"),
    (lambda d, o: check_tei_rerank({"query": "q", "texts": d}, o), "texts"),
    (lambda d, o: check_cohere({"query": "q", "documents": d}, o), "documents"),
]


@pytest.mark.parametrize("check, field", BODIES, ids=["ours", "tei", "tei-rerank", "cohere"])
@pytest.mark.parametrize(
    "opts, named",
    [
        (dict(max_queue_items=4, max_items_per_request=256), "--max-queue-items"),
        (dict(max_queue_items=1024, max_items_per_request=4), "--max-items-per-request"),
    ],
)
def test_a_413_names_the_limit_that_applied(check, field, opts, named):
    o = ServeOptions(**opts)
    assert o.items_limit == (4, named)
    check(["a"] * 4, o)  # at the limit: fine
    with pytest.raises(HTTPError) as e:
        check(["a"] * 5, o)
    assert e.value.status == 413 and e.value.field == field
    assert "5" in e.value.message and "limit of 4" in e.value.message and named in e.value.message
    other = "--max-items-per-request" if named == "--max-queue-items" else "--max-queue-items"
    assert other not in e.value.message


# Hostile round eight (issue 53): every POST route says a too-long number is too long (not Python's
# advice), and every 413 over the body limit names --max-body-bytes (as sent, declared or decoded).


httpx = pytest.importorskip("httpx")


pytest.importorskip("starlette")


pytest.importorskip("uvicorn")


from mlx_slm.server import Service, classifier_loader, create_app, parse_body  # noqa: E402
from tests.hostile import LiveServer  # noqa: E402

NAMES = ("tickets-v1", "tickets-v2")


def post_routes() -> list[str]:
    app = create_app(Service(classifier_loader("unused"), ServeOptions()))
    return [r.path for r in app.routes if "POST" in (getattr(r, "methods", None) or ())]


@pytest.fixture(scope="module")
def live(tiny_qwen_mlx):
    opts = ServeOptions(max_wait_ms=5, served_model_names=NAMES, max_body_bytes=8192)
    with LiveServer(Service(classifier_loader(str(tiny_qwen_mlx)), opts)) as srv:
        yield srv


# ----------------------------------------------------------------------------- numbers and 413s

HUGE = b'{"texts": [' + b"9" * 5000 + b"]}"


def test_a_huge_integer_is_a_number_too_long_not_python_advice():
    with pytest.raises(HTTPError) as e:
        parse_body(HUGE)
    assert e.value.status == 422 and "number too long" in e.value.message
    assert "sys." not in e.value.message and "set_int_max_str_digits" not in e.value.message


def test_every_route_says_the_number_is_too_long(live):
    for path in post_routes():
        r = httpx.post(live.url + path, content=HUGE, headers={"content-type": "application/json"}, timeout=30)
        assert 400 <= r.status_code < 500, (path, r.status_code, r.text)
        assert "too long" in r.text and "set_int_max_str_digits" not in r.text, (path, r.text)


def _chunks(data: bytes):
    yield data[:100]
    yield data[100:]


@pytest.mark.parametrize("how", ["content-length", "streamed", "gzip"])
def test_every_413_names_max_body_bytes_on_every_route(live, how):
    big = json.dumps({"texts": ["x" * 10000]}).encode()
    for path in post_routes():
        headers = {"content-type": "application/json"}
        if how == "content-length":
            r = httpx.post(live.url + path, content=big, headers=headers, timeout=30)
        elif how == "streamed":  # no Content-Length: the limit found while reading
            r = httpx.post(live.url + path, content=_chunks(big), headers=headers, timeout=30)
        else:
            r = httpx.post(
                live.url + path, content=gzip.compress(big), headers={**headers, "content-encoding": "gzip"}, timeout=30
            )
        assert r.status_code == 413, (path, how, r.status_code, r.text)
        assert "--max-body-bytes" in r.text, (path, how, r.text)


def test_the_embeddings_413_names_the_items_option(live):
    r = httpx.post(live.url + "/v1/embeddings", json={"input": ["a"] * 300}, timeout=30)
    assert r.status_code == 413 and "--max-items-per-request" in r.text, r.text
