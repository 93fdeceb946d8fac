"""`mlx-slm serve` with sequence classifiers and rerankers, over real HTTP on 127.0.0.1: our
/v1/classify, TEI's /predict and vLLM's /classify answer with the model's own head (pairs
included, equal to Transformers); /rerank (TEI's shape, and the Cohere/Jina shape vLLM answers
there), /v1/rerank and /v2/rerank answer best first, for Cohere's own Python SDK too, each
score equal to its pair scored alone, each query's tokens run once."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

from mlx_slm.server import ServeOptions, Service, classifier_loader  # noqa: E402
from tests.server.test_app import ThreadServer  # noqa: E402

PAIRS = [
    ("The invoice was paid twice.", "A payment was duplicated."),
    ("The app crashes on start.", "Everything works fine."),
    ("refund please", "The customer asks for money back."),
]
TEXTS = ["My card was charged twice for the same invoice.", "The mobile app crashes.", "x"]
QUERY = "card charged twice"
DOCS = [
    "My card was charged twice for the same invoice.",
    "The mobile app crashes whenever I open the settings page.",
    "I need to change the email address on my profile.",
    "refund status please",
    "Why was I billed again?",
]


def _serve(path, **kw):
    opts = ServeOptions(max_wait_ms=5, **kw.pop("opts", {}))
    return ThreadServer(Service(classifier_loader(str(path), **kw), opts)).start()


def _post(srv, path, body, **kw):
    return httpx.post(srv.url + path, json=body, timeout=60, **kw)


def _metric(srv, name: str) -> float:
    text = httpx.get(srv.url + "/metrics").text
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " "))


# ----------------------------------------------------------------------------- sequence classifiers


@pytest.fixture(scope="module", params=[(3, None), (4, "multi_label_classification"), (1, None)], ids=str)
def seqcls(request, tiny_arch):
    """A served tiny Qwen2ForSequenceClassification (softmax, multi-label, one output) and its
    Transformers reference on the same weights."""
    from mlx_slm.parity.reference import SeqClsReference

    n, problem = request.param
    path = tiny_arch.seqcls_mlx("qwen2", n, problem)
    srv = _serve(path)
    yield srv, SeqClsReference(path, threads=1), path
    srv.stop()


def test_seqcls_routes_answer_with_the_models_head_as_transformers(seqcls):
    srv, ref, _ = seqcls
    labels = list(ref.labels)
    items = TEXTS + [list(p) for p in PAIRS]
    _, _, probs = ref.classify(
        [t if isinstance(t, str) else t[0] for t in items], [None if isinstance(t, str) else t[1] for t in items]
    )
    r = _post(srv, "/v1/classify", {"texts": items})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["scoring"] == "seqcls"
    for rec, want in zip(body["results"], probs):
        if len(labels) == 1:  # one output: its sigmoid score and the raw logit
            assert rec["label"] == labels[0] and abs(rec["score"] - want[0]) < 1e-4 and "logit" in rec
        elif ref.model.config.problem_type == "multi_label_classification":  # every label's own sigmoid
            assert rec["labels"] == [lab for lab, p in zip(labels, want) if p >= 0.5]
            assert all(abs(rec["probs"][lab] - p) < 1e-4 for lab, p in zip(labels, want))
        else:
            assert rec["label"] == labels[int(np.argmax(want))]
            assert all(abs(rec["probs"][lab] - p) < 1e-4 for lab, p in zip(labels, want))
    # TEI's /predict: every label's score, best first, pairs as [[a, b]] (a batch of them)
    tei = _post(srv, "/predict", {"inputs": items}).json()
    assert len(tei) == len(items)
    for got, want in zip(tei, probs):
        assert [d["label"] for d in got] == [labels[i] for i in np.argsort(-want, kind="stable")]
        assert all(abs(d["score"] - want[labels.index(d["label"])]) < 1e-4 for d in got)
    (one_pair,) = _post(srv, "/predict", {"inputs": [list(PAIRS[0])]}).json()  # alone: the same within float32
    assert [(d["label"], pytest.approx(d["score"], abs=1e-5)) for d in one_pair] == [
        (d["label"], d["score"]) for d in tei[len(TEXTS)]
    ]
    # vLLM's /classify (texts only, as vLLM's): probs in label order, its label the most probable
    v = _post(srv, "/classify", {"model": "m", "input": TEXTS}).json()
    for row, want in zip(v["data"], probs):
        assert row["num_classes"] == len(labels) and row["label"] == labels[int(np.argmax(want))]
        assert np.allclose(row["probs"], want, atol=1e-4)


@pytest.mark.parametrize("fn", ["softmax", "sigmoid", "none"])
def test_tei_function_to_apply_is_the_pipelines_on_every_head_form(seqcls, fn):
    """TEI's /predict `parameters.function_to_apply` (Hugging Face InferenceClient's) gives what
    the text-classification pipeline gives with it, on a softmax, a multi-label and a one-output
    head alike (issue 40: a multi-label head ignored "softmax" and refused "sigmoid")."""
    import torch

    srv, ref, _ = seqcls
    labels = list(ref.labels)
    r = _post(srv, "/predict", {"inputs": TEXTS, "parameters": {"function_to_apply": fn}})
    assert r.status_code == 200, r.text
    for got, text in zip(r.json(), TEXTS):
        logits = ref.logits(ref.encode(text))
        want = ref.pipeline.postprocess({"logits": torch.tensor(logits[None])}, function_to_apply=fn, top_k=None)
        want = {d["label"]: d["score"] for d in want}
        assert sorted(d["label"] for d in got) == sorted(labels)
        assert all(abs(d["score"] - want[d["label"]]) < 1e-4 for d in got), (got, want)
    both = _post(srv, "/predict", {"inputs": "x", "raw_scores": True, "parameters": {"function_to_apply": fn}})
    assert both.status_code == (200 if fn == "none" else 422), both.text
    bad = _post(srv, "/predict", {"inputs": "x", "parameters": {"function_to_apply": "tanh"}})
    assert bad.status_code == 422 and "'tanh'" in bad.json()["error"]


def test_model_info_says_which_head(seqcls):
    srv, ref, _ = seqcls
    info = httpx.get(srv.url + "/v1/model").json()
    assert info["head"]["kind"] == "seqcls" and info["head"]["labels"] == list(ref.labels)
    assert info["head"]["architecture"] == "Qwen2ForSequenceClassification"
    assert info["task"]["head"]["seqcls"]["labels"] == list(ref.labels)
    if len(ref.labels) == 1:  # a one-output head reranks by default
        assert info["reranker"]["scorer"] == "seqcls"
        assert httpx.get(srv.url + "/info").json()["model_type"]["reranker"]["id2label"] == {"0": ref.labels[0]}
    else:
        assert info["reranker"]["scorer"] is None and "one output" in info["reranker"]["why"]


def test_seqcls_bad_requests(seqcls):
    srv, ref, _ = seqcls
    r = _post(srv, "/v1/classify", {"texts": ["a"], "labels": ["x", "y"]})
    assert r.status_code == 422 and r.json()["error"]["field"] == "labels"
    assert "own labels" in r.json()["error"]["message"] or "no LM head" in r.json()["error"]["message"]
    for bad, field in ((["a", "b", "c"], "texts[0]"), (["a", ""], "texts[0]"), (["a", 5], "texts[0]")):
        r = _post(srv, "/v1/classify", {"texts": [bad]})
        assert r.status_code == 422 and r.json()["error"]["field"] == field, r.text
    r = _post(srv, "/predict", {"inputs": [["a", "b", "c"]]})
    assert r.status_code == 422 and "pair of strings" in r.json()["error"]
    for bad, where in ((["A", 5], "inputs[0][1] must be a string"), ([None, "b"], "inputs[0][0] must be a string")):
        r = _post(srv, "/predict", {"inputs": [bad]})  # the non-string named, not "a list of 2 items"
        assert r.status_code == 422 and where in r.json()["error"] and "list of 2" not in r.json()["error"], r.text
    r = _post(srv, "/v1/classify", {"texts": [["A", 5]]})
    assert r.status_code == 422 and "texts[0][1] must be a string" in r.json()["error"]["message"], r.text
    if len(ref.labels) > 1 and ref.model.config.problem_type is None:  # a softmax head calibrates
        assert _post(srv, "/v1/classify", {"text": "a", "min_confidence": 0.9}).status_code == 200
    else:
        r = _post(srv, "/v1/classify", {"text": "a", "min_confidence": 0.9})
        assert r.status_code == 422 and r.json()["error"]["field"] == "min_confidence"
    if len(ref.labels) > 1:  # not a reranker: 400 saying how to serve one
        for path, body in (
            ("/rerank", {"query": "q", "texts": ["d"]}),
            ("/v1/rerank", {"query": "q", "documents": ["d"]}),
        ):
            r = _post(srv, path, body)
            assert r.status_code == 400, r.text
            msg = r.json()["error"] if path == "/rerank" else r.json()["error"]["message"]
            assert "reranker" in msg and "/v1/classify" in msg


# ----------------------------------------------------------------------------- rerankers


@pytest.fixture(scope="module")
def qwen3_reranker(tmp_path_factory):
    """A tiny causal LM whose tokenizer has one-token yes/no, in a folder named as a Qwen3 reranker
    (so --reranker auto asks it as Qwen3-Reranker asks)."""
    from mlx_slm.weights.convert import convert
    from tests.conftest import make_tiny

    hf = make_tiny(tmp_path_factory.mktemp("hf-rr"), "qwen2", words=("yes", "no"))
    return convert(hf, tmp_path_factory.mktemp("rr") / "tiny-Qwen3-Reranker", dtype="float32", progress=None)


@pytest.fixture(scope="module", params=["qwen3", "seqcls", "question"])
def reranker(request, qwen3_reranker, tiny_arch):
    """A served reranker of each scorer: a causal LM served with --reranker qwen3, a one-label
    sequence classifier served as it is (it reranks by default), a yes/no question."""
    kind = request.param
    if kind == "qwen3":
        srv = _serve(qwen3_reranker, reranker="qwen3")
    elif kind == "seqcls":
        srv = _serve(tiny_arch.seqcls_mlx("qwen2", 1))
    else:
        srv = _serve(qwen3_reranker, reranker="question")
    yield kind, srv
    srv.stop()


def _alone(srv, query: str, docs: list[str]) -> list[float]:
    """Each (query, document) scored alone: its whole prompt in one row, no cached head."""
    svc = srv.service
    clf = svc.tasks.back(svc.tasks.rerank_key(None))
    out = []
    for d in docs:
        (item,) = clf.prepare([(query, d)])
        item.prefix = None  # run the whole prompt, not after the query's cached tokens
        (p,) = list(clf.run_items([item]))
        out.append(p.value)
    return out


def test_tei_rerank_best_first_equal_to_each_pair_alone(reranker):
    kind, srv = reranker
    alone = _alone(srv, QUERY, DOCS)
    r = _post(srv, "/rerank", {"query": QUERY, "texts": DOCS, "return_text": True})
    assert r.status_code == 200, r.text
    got = r.json()
    assert [g["index"] for g in got] == sorted(range(len(DOCS)), key=lambda i: (-alone[i], i))
    for g in got:
        assert abs(g["score"] - alone[g["index"]]) < 1e-4 and g["text"] == DOCS[g["index"]]
    raw = _post(srv, "/rerank", {"query": QUERY, "texts": DOCS, "raw_scores": True}).json()
    for g in raw:  # the log-odds: the sigmoid of each is the score
        assert "text" not in g and abs(1 / (1 + math.exp(-g["score"])) - alone[g["index"]]) < 1e-4
    # our /v1/classify takes the same pairs, in input order
    ours = _post(srv, "/v1/classify", {"texts": [[QUERY, d] for d in DOCS]})
    if kind == "seqcls":  # served as a classifier: its one-output head on the pair is the reranker's score
        assert [abs(x["score"] - a) < 1e-4 for x, a in zip(ours.json()["results"], alone)] == [True] * len(DOCS)
    else:
        assert ours.json()["scoring"] == "rerank"
        assert all(abs(x["score"] - a) < 1e-4 for x, a in zip(ours.json()["results"], alone))


def test_cohere_shape_on_every_rerank_route(reranker):
    kind, srv = reranker
    alone = _alone(srv, QUERY, DOCS)
    best = sorted(range(len(DOCS)), key=lambda i: (-alone[i], i))
    docs = [d if i % 2 else {"text": d} for i, d in enumerate(DOCS)]  # strings and Cohere v1's objects
    for path in ("/rerank", "/v1/rerank", "/v2/rerank"):
        r = _post(srv, path, {"model": "any", "query": QUERY, "documents": docs, "top_n": 3})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["id"].startswith("rerank-") and body["model"]
        assert [x["index"] for x in body["results"]] == best[:3]
        for x in body["results"]:
            assert abs(x["relevance_score"] - alone[x["index"]]) < 1e-4
            assert x["document"] == {"text": DOCS[x["index"]]}
        assert body["usage"]["total_tokens"] == body["meta"]["tokens"]["input_tokens"] > 0
        assert body["meta"]["api_version"]["version"] == ("2" if path == "/v2/rerank" else "1")
    r = _post(srv, "/v2/rerank", {"query": QUERY, "documents": DOCS, "top_n": 99, "return_documents": False})
    assert [x["index"] for x in r.json()["results"]] == best and "document" not in r.json()["results"][0]
    r = _post(srv, "/v1/rerank", {"query": QUERY, "documents": DOCS, "top_n": 0})  # vLLM's default: all
    assert len(r.json()["results"]) == len(DOCS)


def test_cohere_sdk_v1_and_v2_and_httpx_tei(reranker):
    """Cohere's own Python SDK (`cohere.Client`, `cohere.ClientV2`) against the server, with a
    Bearer key, and TEI's /rerank through httpx."""
    cohere = pytest.importorskip("cohere")
    kind, srv = reranker
    alone = _alone(srv, QUERY, DOCS)
    best = sorted(range(len(DOCS)), key=lambda i: (-alone[i], i))
    srv.service.opts.api_key = "secret"
    try:
        v1 = cohere.Client(base_url=srv.url, api_key="secret", timeout=60)
        got = v1.rerank(query=QUERY, documents=DOCS, top_n=3, return_documents=True, model="local")
        assert [x.index for x in got.results] == best[:3]
        assert all(abs(x.relevance_score - alone[x.index]) < 1e-4 for x in got.results)
        assert [x.document.text for x in got.results] == [DOCS[i] for i in best[:3]]
        v2 = cohere.ClientV2(base_url=srv.url, api_key="secret", timeout=60)
        got2 = v2.rerank(model="local", query=QUERY, documents=DOCS)
        assert [x.index for x in got2.results] == best
        assert all(abs(x.relevance_score - alone[x.index]) < 1e-4 for x in got2.results)
        with pytest.raises(cohere.errors.UnprocessableEntityError):
            v2.rerank(model="local", query=QUERY, documents=DOCS, top_n=-1)
        with pytest.raises(cohere.errors.UnauthorizedError):
            cohere.ClientV2(base_url=srv.url, api_key="wrong").rerank(model="m", query=QUERY, documents=DOCS)
        r = httpx.post(
            srv.url + "/rerank",
            json={"query": QUERY, "texts": DOCS, "truncate": True},
            headers={"Authorization": "Bearer secret"},
            timeout=60,
        )
        assert [x["index"] for x in r.json()] == best
    finally:
        srv.service.opts.api_key = None


@pytest.mark.parametrize(
    "path, body, status, field",
    [
        ("/rerank", {"query": "", "texts": ["a"]}, 422, "query"),
        ("/rerank", {"texts": ["a"]}, 422, "query"),
        ("/rerank", {"query": "q", "texts": []}, 422, "texts"),
        ("/rerank", {"query": "q", "texts": ["a", " "]}, 422, "texts[1]"),
        ("/rerank", {"query": "q", "texts": ["a", 3]}, 422, "texts[1]"),
        ("/rerank", {"query": "q", "texts": ["a"] * 9}, 413, "texts"),
        ("/rerank", {"query": "q", "texts": ["a"], "bogus": 1}, 422, "bogus"),
        ("/rerank", {"query": "q", "documents": []}, 422, "documents"),
        ("/v1/rerank", {"query": "q", "documents": ["a"] * 9}, 413, "documents"),
        ("/v1/rerank", {"query": "q", "documents": ["a", {"title": "x"}]}, 422, "documents[1]"),
        ("/v2/rerank", {"query": "q", "documents": ["a"], "top_n": -1}, 422, "top_n"),
        ("/v2/rerank", {"query": "q", "documents": ["a"], "top_n": 1.5}, 422, "top_n"),
        ("/v2/rerank", {"query": "q", "documents": ["a"], "max_tokens_per_doc": 10}, 422, "max_tokens_per_doc"),
        ("/v2/rerank", {"query": "q", "documents": ["a"], "return_documents": "yes"}, 422, "return_documents"),
        ("/v1/rerank", {"query": "q", "documents": ["a"], "rank_fields": ["title"]}, 422, "rank_fields"),
        ("/v1/rerank", {"query": "q", "documents": ["word " * 3000]}, 422, "documents[0]"),
    ],
)
def test_rerank_bad_input(reranker, path, body, status, field):
    _, srv = reranker
    srv.service.opts.max_items_per_request = 8
    try:
        r = _post(srv, path, body)
    finally:
        srv.service.opts.max_items_per_request = 256
    assert r.status_code == status, r.text
    err = r.json()["error"]
    if path == "/rerank" and "texts" in body or path == "/rerank" and "documents" not in body:
        assert isinstance(err, str) and field.split("[")[0] in err  # TEI's {"error", "error_type"}
    else:
        assert err["field"] == field and err["param"] == field  # OpenAI/vLLM's error shape
    if body.get("documents") == ["word " * 3000]:
        assert "truncate_prompt_tokens" in err["message"]
        body = {**body, "truncate_prompt_tokens": -1}
        assert _post(srv, path, body).status_code == 200


def test_64_documents_run_each_querys_tokens_once(reranker):
    """Concurrent rerank requests share micro-batches; 64 documents process at most 1.15x the
    floor (the query's tokens once + each document's own tokens, no padding), counted from the
    run's own figures (/metrics' processed tokens), and every score equals its pair alone.

    The documents are short and of varied lengths (their own tokens from about 7 to 22): one
    batch of them ran 1.38x the floor (the sequence classifier) before the batch plan bounded a batch's padding
    (`batching.MAX_PADDING`, issue 40)."""
    kind, srv = reranker
    query = f"why was my card charged twice {kind}"  # a query no earlier test cached
    svc = srv.service
    front = svc.tasks.front(svc.tasks.rerank_key(None))
    rng = random.Random(7)
    words = "card invoice refund app crash settings email profile charged twice billing password".split()
    docs = [" ".join(rng.choice(words) for _ in range(rng.randint(3, 12))) for _ in range(64)]
    items = front.prepare([(query, d) for d in docs])
    own = [len(it.ids) - len(it.prefix) for it in items]
    assert max(own) - min(own) >= 10  # varied: a batch of them all pads far over 15 %
    head = len(items[0].prefix)
    floor = head + sum(len(it.ids) - head for it in items)
    before = _metric(srv, "mlx_slm_processed_tokens_total")
    r = _post(srv, "/v2/rerank", {"model": "m", "query": query, "documents": docs})
    assert r.status_code == 200, r.text
    processed = _metric(srv, "mlx_slm_processed_tokens_total") - before
    assert floor < processed <= 1.15 * floor, (processed, floor)
    # every score is its pair's alone (first 8: the rest run the same path)
    alone = _alone(srv, query, docs[:8])
    got = {x["index"]: x["relevance_score"] for x in r.json()["results"]}
    assert all(abs(got[i] - alone[i]) < 1e-4 for i in range(8))


def test_concurrent_rerank_requests_share_a_micro_batch(reranker):
    """Two rerank requests (two queries) waiting together run as one micro-batch, each row
    after its own query's cached tokens, each answer as its pairs alone."""
    import threading
    import time

    kind, srv = reranker
    svc = srv.service
    queries = [f"{QUERY} {kind}", f"app crashes {kind}"]
    batches = _metric(srv, "mlx_slm_batches_total")
    outs: dict[str, list] = {}

    def one(q):
        outs[q] = _post(srv, "/rerank", {"query": q, "texts": DOCS}).json()

    def wait(cond):
        end = time.time() + 30
        while not cond() and time.time() < end:
            time.sleep(0.01)

    svc.opts.max_wait_ms = 0  # the worker takes what is queued, at once
    svc.opts.max_batch_tokens = 1 << 16  # room for both requests' documents in one micro-batch
    try:
        with svc.loaded.clf.engine.lock:  # hold the worker inside a first request's batch
            first = threading.Thread(target=_post, args=(srv, "/rerank", {"query": "first", "texts": DOCS[:1]}))
            first.start()
            wait(lambda: svc.inflight == 1 and svc.depth == 0)
            threads = [threading.Thread(target=one, args=(q,)) for q in queries]
            for t in threads:
                t.start()
            wait(lambda: svc.depth == 2 * len(DOCS))  # both requests' documents queued
        for t in [first, *threads]:
            t.join(60)
    finally:
        svc.opts.max_wait_ms, svc.opts.max_batch_tokens = 5, None
    assert _metric(srv, "mlx_slm_batches_total") - batches == 2  # the first request's, then both queries' together
    for q in queries:
        alone = _alone(srv, q, DOCS)
        assert [x["index"] for x in outs[q]] == sorted(range(len(DOCS)), key=lambda i: (-alone[i], i))
        assert all(abs(x["score"] - alone[x["index"]]) < 1e-4 for x in outs[q])


def test_a_causal_lm_is_not_a_reranker_unless_served_as_one(tiny_qwen_mlx):
    srv = _serve(tiny_qwen_mlx)
    try:
        r = _post(srv, "/rerank", {"query": "q", "texts": ["d"]})
        assert r.status_code == 400 and "--reranker" in r.json()["error"]
        assert r.json()["error_type"] == "Backend"  # TEI's type for "model is not a re-ranker model"
        r = _post(srv, "/v2/rerank", {"query": "q", "documents": ["d"]})
        assert r.status_code == 400 and "start mlx-slm serve with --reranker" in r.json()["error"]["message"]
        info = httpx.get(srv.url + "/v1/model").json()
        assert info["head"] == {"kind": "lm"} and info["reranker"]["scorer"] is None
        paths = httpx.get(srv.url + "/openapi.json").json()["paths"]
        assert {"/rerank", "/v1/rerank", "/v2/rerank"} <= set(paths)
        assert (
            "top_n" in paths["/v2/rerank"]["post"]["requestBody"]["content"]["application/json"]["schema"]["properties"]
        )
        r = httpx.get(srv.url + "/rerank")  # a wrong method: TEI's error shape, with Allow
        assert r.status_code == 405 and r.headers["allow"] == "POST" and r.json()["error_type"] == "MethodNotAllowed"
        # a pair on a one-text prompt: 422 naming the item
        r = _post(srv, "/v1/classify", {"texts": ["a", ["b", "c"]]})
        assert r.status_code == 422 and r.json()["error"]["field"] == "texts[1]"
    finally:
        srv.stop()


def test_doctor_says_which_head_a_model_has(tiny_arch, tiny_qwen_mlx, qwen3_reranker, monkeypatch):
    from click.testing import CliRunner

    from mlx_slm.cli import main
    from mlx_slm.ground import blas as _blas

    peak = _blas.matmul_peak
    monkeypatch.setattr(_blas, "matmul_peak", lambda: peak(sizes=(64,), reps=1))
    for path, head, rerank in (
        (tiny_arch.seqcls_mlx("qwen2", 3), "Qwen2ForSequenceClassification: a score head of 3 label(s)", "no: "),
        (tiny_arch.seqcls_mlx("qwen2", 1), "a score head of 1 label(s) (relevant), sigmoid", "seqcls (what"),
        (tiny_qwen_mlx, "Qwen2ForCausalLM: the LM head", "no: "),
        (qwen3_reranker, "Qwen2ForCausalLM: the LM head", "qwen3 (what"),
    ):
        r = CliRunner().invoke(main, ["doctor", "--model", str(path)])
        assert r.exit_code == 0, r.output
        lines = {line[:14].strip(): line[15:] for line in r.output.splitlines()}
        assert lines["head"].startswith(head) or head in lines["head"], lines["head"]
        assert lines["reranker"].startswith(rerank), lines["reranker"]


@pytest.mark.slow  # a child process (imports, load, warm-up: ~10 s)
def test_mlx_slm_serve_reranker_command_with_cohere_sdk(qwen3_reranker, tmp_path):
    """`mlx-slm serve --reranker qwen3 --instruction ...` as a user starts it: Cohere's SDK (v1 and
    v2) and TEI's /rerank get the scores `mlx-slm rerank` writes for the same query, best first."""
    import json
    import os
    import subprocess
    import sys
    import time
    from pathlib import Path

    from click.testing import CliRunner

    from mlx_slm.cli import main
    from tests.server.test_app import _free_port

    cohere = pytest.importorskip("cohere")
    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps({"text": d}) + "\n" for d in DOCS))
    out = tmp_path / "ranked.jsonl"
    common = ["--model", str(qwen3_reranker), "--reranker", "qwen3", "--instruction", "Find the ticket"]
    r = CliRunner().invoke(main, ["rerank", "--query", QUERY, str(docs), "-o", str(out), "-q", *common])
    assert r.exit_code == 0, r.output
    want = [json.loads(line) for line in out.read_text().splitlines()]
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "MLX_SLM_API_KEY": "k"}
    cmd = [sys.executable, "-m", "mlx_slm.cli", "serve", *common, "--port", str(port), "-q"]
    root = str(Path(__file__).resolve().parents[2])
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=root, env=env)
    try:
        end = time.time() + 120
        while True:
            assert proc.poll() is None, proc.stderr.read().decode()
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.time() < end
            time.sleep(0.1)
        model = httpx.get(url + "/v1/model", headers={"Authorization": "Bearer k"}).json()
        assert model["reranker"] == {"scorer": "qwen3", "instruction": "Find the ticket"}
        v1 = cohere.Client(base_url=url, api_key="k", timeout=60).rerank(query=QUERY, documents=DOCS, top_n=3)
        assert [x.index for x in v1.results] == [w["index"] for w in want[:3]]
        assert all(abs(x.relevance_score - w["score"]) < 1e-4 for x, w in zip(v1.results, want))
        v2 = cohere.ClientV2(base_url=url, api_key="k", timeout=60).rerank(model="m", query=QUERY, documents=DOCS)
        assert [x.index for x in v2.results] == [w["index"] for w in want]
        assert all(abs(x.relevance_score - w["score"]) < 1e-4 for x, w in zip(v2.results, want))
        tei = httpx.post(
            url + "/rerank", json={"query": QUERY, "texts": DOCS}, headers={"Authorization": "Bearer k"}, timeout=60
        )
        assert [x["index"] for x in tei.json()] == [w["index"] for w in want]
    finally:
        proc.terminate()
        proc.wait(30)
