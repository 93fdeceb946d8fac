"""`mlx-slm serve`'s embedding routes over real HTTP on 127.0.0.1: OpenAI's own Python SDK
(`openai.OpenAI(base_url=...).embeddings.create`: base64, its default, and float, `dimensions`,
token ids) and TEI's /embed, each vector equal to the `Embedder`'s (itself held to
sentence-transformers in tests/classifier/test_embedder.py); every request through the worker's queue; the
bad requests in each API's own error shape; a served embedding model refusing to classify, and a
causal LM that classifies and embeds."""

from __future__ import annotations

import numpy as np
import pytest

httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")
pytest.importorskip("starlette")

from mlx_slm.classifier.embedder import Embedder, finish  # noqa: E402
from mlx_slm.engine.engine import Engine  # noqa: E402
from mlx_slm.server import ServeOptions, Service, classifier_loader  # noqa: E402
from tests.server.test_app import ThreadServer  # noqa: E402

TEXTS = ["My card was charged twice for the same invoice.", "The mobile app crashes.", "x", "refund please"]


def _serve(path):
    return ThreadServer(Service(classifier_loader(str(path)), ServeOptions(max_wait_ms=5))).start()


@pytest.fixture(scope="module")
def st(tiny_arch):
    """A served tiny sentence-transformers folder (Qwen3 backbone, mean pooling, not normalized)
    and an `Embedder` on the same conversion."""
    path = tiny_arch.st_mlx(pooling="mean", normalize=False)
    srv = _serve(path)
    yield srv, Embedder(Engine.load(str(path)))
    srv.stop()


def _client(srv):
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)


def _items(srv) -> float:
    text = httpx.get(srv.url + "/metrics").text
    return sum(float(x.split()[-1]) for x in text.splitlines() if x.startswith('mlx_slm_items_total{outcome="ok"}'))


def test_openai_sdk_base64_float_and_dimensions(st):
    srv, emb = st
    want = emb.encode(TEXTS)  # the folder does not normalize; nor does the route without dimensions
    before = _items(srv)
    got = _client(srv).embeddings.create(model="anything", input=TEXTS)  # the SDK asks for base64
    assert [d.index for d in got.data] == [0, 1, 2, 3] and got.object == "list"
    np.testing.assert_allclose(np.array([d.embedding for d in got.data]), want, rtol=1e-6, atol=1e-6)
    assert got.usage.prompt_tokens == got.usage.total_tokens == sum(len(it.ids) for it in emb.prepare(TEXTS))
    assert _items(srv) - before == len(TEXTS)  # through the worker's queue
    flt = _client(srv).embeddings.create(model="m", input=TEXTS[0], encoding_format="float")
    np.testing.assert_allclose(flt.data[0].embedding, want[0], rtol=1e-6, atol=1e-6)
    short = _client(srv).embeddings.create(model="m", input=TEXTS, dimensions=8)
    np.testing.assert_allclose(np.array([d.embedding for d in short.data]), finish(want, True, 8), atol=1e-6)


def test_openai_sdk_token_ids(st):
    srv, emb = st
    ids = [emb.engine.tokenizer(t)["input_ids"] for t in TEXTS[:2]]
    got = _client(srv).embeddings.create(model="m", input=ids, encoding_format="float")
    np.testing.assert_allclose(np.array([d.embedding for d in got.data]), emb.encode(TEXTS[:2]), atol=1e-6)
    one = _client(srv).embeddings.create(model="m", input=ids[0], encoding_format="float")
    np.testing.assert_allclose(one.data[0].embedding, got.data[0].embedding, atol=1e-6)


@pytest.mark.parametrize(
    "kwargs, param, words",
    [
        ({"input": TEXTS, "dimensions": 0}, "dimensions", "from 1 to 64"),
        ({"input": TEXTS, "dimensions": 65}, "dimensions", "from 1 to 64"),
        ({"input": [[1, 2, 10**6]]}, "input[0]", "out of the vocabulary"),
        ({"input": []}, "input", "is empty"),
        ({"input": ["fine", ""]}, "input[1]", "is empty"),
        ({"input": "word " * 3000}, "input", "over the model's limit"),
        ({"input": "x", "encoding_format": "int8"}, "encoding_format", "'float' or 'base64'"),
    ],
)
def test_openai_bad_requests_are_400_in_openais_shape(st, kwargs, param, words):
    srv, _ = st
    with pytest.raises(openai.BadRequestError) as e:
        _client(srv).embeddings.create(model="m", **kwargs)
    err = e.value.body
    assert e.value.status_code == 400 and err["type"] == "invalid_request_error" and err["param"] == param
    assert words in err["message"]


def test_tei_embed(st):
    srv, emb = st
    raw = emb.encode(TEXTS)
    r = httpx.post(srv.url + "/embed", json={"inputs": TEXTS})
    assert r.status_code == 200, r.text
    np.testing.assert_allclose(np.array(r.json()), finish(raw, True), atol=1e-6)  # TEI normalizes by default
    r = httpx.post(srv.url + "/embed", json={"inputs": TEXTS[0], "normalize": False, "dimensions": 8})
    np.testing.assert_allclose(np.array(r.json()), raw[:1, :8], atol=1e-6)
    r = httpx.post(srv.url + "/embed", json={"inputs": TEXTS[:2], "prompt_name": "query", "normalize": False})
    np.testing.assert_allclose(np.array(r.json()), emb.encode(TEXTS[:2], prompt_name="query"), atol=1e-6)
    r = httpx.post(srv.url + "/embed", json={"inputs": "word " * 3000, "truncate": True})
    assert r.status_code == 200 and len(r.json()[0]) == 64


@pytest.mark.parametrize(
    "body, field, words",
    [
        ({"inputs": "x", "prompt_name": "nope"}, "prompt_name", "'query'"),
        ({"inputs": "x", "truncation_direction": "Left"}, "truncation_direction", "only 'Right'"),
        ({"inputs": "x", "dimensions": 0}, "dimensions", "from 1 to 64"),
        ({"inputs": []}, "inputs", "is empty"),
        ({"inputs": "word " * 3000}, "inputs", '"truncate": true'),
        ({"inputs": "x", "colour": 1}, "colour", "unknown field"),
    ],
)
def test_tei_bad_requests_in_teis_shape(st, body, field, words):
    srv, _ = st
    r = httpx.post(srv.url + "/embed", json=body)
    assert r.status_code == 422, r.text
    assert r.json()["error_type"] == "Validation" and words in r.json()["error"]


def test_embedding_model_refuses_to_classify_and_says_what_it_does(st):
    srv, _ = st
    r = httpx.post(srv.url + "/v1/classify", json={"text": "x"})
    assert r.status_code == 400 and "/v1/embeddings" in r.json()["error"]["message"]
    info = httpx.get(srv.url + "/v1/model").json()
    assert info["embeddings"]["pooling"] == "mean" and info["embeddings"]["prompts"]["query"]
    assert info["head"]["kind"].startswith("none")
    assert httpx.get(srv.url + "/info").json()["model_type"] == {"embedding": {"pooling": "mean"}}


def test_causal_lm_classifies_and_embeds(tiny_arch):
    path = tiny_arch.mlx("qwen2")
    srv = _serve(path)
    try:
        got = _client(srv).embeddings.create(model="m", input=TEXTS[:2])
        want = Embedder(Engine.load(str(path))).encode(TEXTS[:2])
        np.testing.assert_allclose(np.array([d.embedding for d in got.data]), want, rtol=1e-5, atol=1e-5)
        assert httpx.post(srv.url + "/v1/classify", json={"text": "x"}).status_code == 200
        assert httpx.get(srv.url + "/v1/model").json()["embeddings"]["source"] == "causal LM"
    finally:
        srv.stop()


def test_sequence_classifier_does_not_embed(tiny_arch):
    srv = _serve(tiny_arch.seqcls_mlx("qwen2", 3))
    try:
        with pytest.raises(openai.BadRequestError, match="no pooling config"):
            _client(srv).embeddings.create(model="m", input="x")
        r = httpx.post(srv.url + "/embed", json={"inputs": "x"})
        assert r.status_code == 400 and "ForSequenceClassification" in r.json()["error"]
        assert httpx.get(srv.url + "/v1/model").json()["embeddings"]["pooling"] is None
    finally:
        srv.stop()
