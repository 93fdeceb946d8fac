"""Hostile round seven (issue 47), the server's side, on a tiny model: no client stalls the server
and the server says when it is busy.

* A chat request's choices are priced whole (every chunk of their trie), built and tokenized off
  the worker under the request's deadline, and refused up front over `MAX_LABEL_TOKENS` (413).
* /metrics shows the micro-batch the worker computes (a timed-out request's too); /health answers
  503 "stalled" while one micro-batch runs past the request timeout.
* `response_format` schemas of the wrong types, `/v1/embeddings`' `encoding_format`, `model` and
  `user` of the wrong types are 4xx naming the field; `mlx_slm_requests_total` has a route label;
  a subclass of a core error answers its parent's status."""

from __future__ import annotations

import json
import os
import threading
import time

import pytest

from mlx_slm.server import ServeOptions, Service, classifier_loader
from mlx_slm.server.errors import http_error
from mlx_slm.service import MAX_LABEL_TOKENS, Invalid, ServiceError, TimedOut
from mlx_slm.service.scheduler import row_work
from tests.hostile import LiveServer

httpx = pytest.importorskip("httpx")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

WORDS = "card charged twice invoice app crash login refund account billing technical password".split()
MSGS = [{"role": "user", "content": "My card was charged twice for the same invoice."}]


def _choices(n: int, words: int = 4) -> list[str]:
    return [f"choice {i} " + " ".join(WORDS[(i * 7 + k) % len(WORDS)] for k in range(words)) for i in range(n)]


@pytest.fixture(scope="module")
def live(tiny_qwen_mlx):
    svc = Service(classifier_loader(str(tiny_qwen_mlx), ["billing", "technical"]), ServeOptions(max_wait_ms=2))
    with LiveServer(svc) as s:
        yield s


def _chat(s, body, timeout=60):
    return httpx.post(s.url + "/v1/chat/completions", json={"messages": MSGS, **body}, timeout=timeout)


def _metrics(s) -> dict[str, float]:
    out: dict[str, float] = {}
    for ln in httpx.get(s.url + "/metrics", timeout=5).text.splitlines():
        if ln and not ln.startswith("#"):
            name, v = ln.rsplit(" ", 1)
            out[name] = float(v)
    return out


# ----------------------------------------------------------------------------- bounded work


def test_a_chat_item_is_priced_with_its_whole_trie(live):
    """The cost counted one trie chunk (what the batch holds at once): 1,500 choices (115 chunks)
    were priced at 1/16 of their time, so the worker started them with the request all but gone."""
    svc = live.service
    seen: list[tuple[list[int], list[int]]] = []
    submit = svc.submit

    def spy(job, items, key, costs, hits, works=None):
        seen.append((list(costs), list(works)))
        return submit(job, items, key, costs, hits, works)

    svc.submit = spy
    try:
        choices = _choices(400)
        r = _chat(live, {"guided_choice": choices})
        assert r.status_code == 200, r.text
    finally:
        del svc.submit
    front = svc.tasks.front(svc.tasks.chat_key(tuple(choices)))
    ls = front.kind.labelset
    assert ls.mode == "sequence" and len(ls.trie) > 1  # several chunks: the case the cost missed
    (cost,), (work,) = seen[-1]
    assert work - cost == sum(len(c) for c in ls.trie) - front.kind.row_extra == row_work(front.kind) > 0


def test_choices_over_the_token_limit_are_413_before_any_work(live):
    before = _metrics(live).get("mlx_slm_batches_total", 0)
    choices = _choices(MAX_LABEL_TOKENS // 4, words=3)  # each over 4 tokens: over the limit in all
    r = _chat(live, {"guided_choice": choices})
    assert r.status_code == 413, r.text
    err = r.json()["error"]
    assert err["param"] == "guided_choice" and f"limit of {MAX_LABEL_TOKENS}" in err["message"]
    assert err["type"] == "invalid_request_error"
    assert _metrics(live).get("mlx_slm_batches_total", 0) == before  # never reached the worker
    # our route's own labels: the same limit, naming 'labels'
    r = httpx.post(live.url + "/v1/classify", json={"text": "x", "labels": choices}, timeout=60)
    assert r.status_code == 413 and r.json()["error"]["field"] == "labels", r.text


def test_the_worker_never_builds_a_requests_task(live):
    """A new task's classifiers (its choices tokenized, its trie built) are built before admission,
    in a request's thread: the worker only runs them."""
    svc = live.service
    threads: list[str] = []
    build = svc.tasks._build

    def spy(engine, key):
        threads.append(threading.current_thread().name)
        return build(engine, key)

    svc.tasks._build = spy
    try:
        assert _chat(live, {"guided_choice": _choices(30)}).status_code == 200
        r = httpx.post(live.url + "/v1/classify", json={"text": "x", "labels": ["up", "down", "left"]}, timeout=60)
        assert r.status_code == 200, r.text
    finally:
        del svc.tasks._build
    assert len(threads) == 4 and "mlx-slm-worker" not in threads, threads  # front and back of each


def test_an_item_priced_over_the_timeout_is_refused_at_admission(tiny_qwen_mlx):
    """Over the whole timeout even alone: a 413 (no retry can help; a 504 would be retried by
    every SDK), naming the fix, before any forward."""
    svc = Service(classifier_loader(str(tiny_qwen_mlx), ["billing", "technical"]), ServeOptions(request_timeout_s=5))
    with LiveServer(svc) as s:
        speed = svc.scheduler.speed
        speed._by_size = {1: (1.0, 1.0)}  # measured: one second a token
        speed.fixed, speed.per_token = 0.0, 1.0
        before = svc.metrics.batches
        r = s.post(json.dumps({"text": "the invoice and the app and my account"}).encode())
        assert r.status_code == 413 and "would take about" in r.text and "send a shorter text" in r.text, r.text
        assert "larger --request-timeout" in r.text
        assert svc.metrics.batches == before and svc.depth == 0


def test_a_long_item_holds_the_worker_only_when_it_delays_no_one(tiny_qwen_mlx):
    """An item cannot be split: one priced over half the request timeout (but under all of it) is
    admitted when nothing else is queued or running, and refused (504, worth a retry) while
    another request is in the worker, so the requests queued behind it keep their time (the
    30-minute soak's 504s came from 15 s chats under a 20 s timeout); jevcompat's 255-option
    choice, alone on the server, was refused by the old share rule."""
    from mlx_slm.classifier.pipeline import item_cost, prefix_hit

    svc = Service(classifier_loader(str(tiny_qwen_mlx), ["billing", "technical"]), ServeOptions(request_timeout_s=40))
    with LiveServer(svc) as s:
        front = svc.front_classifier(svc.default_key)
        item = front.prepare(["the invoice and the app"])[0]
        tokens = item_cost(front.kind, item, prefix_hit(front.kind, item))  # what the scheduler prices
        speed = svc.scheduler.speed

        def price(seconds: float) -> None:  # the estimate of this item (a measured batch refits it: set again)
            speed._by_size = {1: (1.0, 1.0)}
            speed.fixed, speed.per_token = 0.0, seconds / tokens

        price(30.0)  # about 30 s: over half the 40 s timeout, under all of it
        assert 20 < speed.estimate(tokens) < 40
        long = json.dumps({"text": "the invoice and the app"}).encode()
        assert s.post(long).status_code == 200  # alone: admitted (its real forward is quick)
        price(30.0)
        got: dict = {}
        sched, gate = svc.scheduler, threading.Event()
        real = sched.run_batch
        sched.run_batch = lambda key, items: (gate.wait(30), real(key, items))  # the worker waits at the gate
        try:
            t = threading.Thread(target=lambda: got.update(r=s.post(b'{"text": "x"}')))
            t.start()
            end = time.time() + 10
            while not (sched.busy and sched.depth == 0) and time.time() < end:  # taken by the worker
                time.sleep(0.01)
            r = s.post(long)
        finally:
            gate.set()
            del sched.run_batch
        t.join(60)
        assert r.status_code == 504 and "while other requests wait or run" in r.text, r.text
        assert "retry later" in r.text and got["r"].status_code == 200
        price(10.0)  # about 10 s: under half, admitted whatever else runs
        assert s.post(long).status_code == 200


def test_the_steps_before_admission_are_under_the_deadline(tiny_qwen_mlx):
    """Building a task and tokenizing run off the worker, and the request times out there."""
    svc = Service(classifier_loader(str(tiny_qwen_mlx), ["billing", "technical"]), ServeOptions(request_timeout_s=1))
    with LiveServer(svc) as s:
        for_request = svc.tasks.for_request
        release = threading.Event()

        def slow(spec):
            release.wait(30)
            return for_request(spec)

        svc.tasks.for_request = slow
        try:
            r = _chat(s, {"guided_choice": ["yes", "no"]})
        finally:
            release.set()
            del svc.tasks.for_request
        assert r.status_code == 504 and "preparing the request" in r.json()["error"]["message"], r.text
        assert svc.metrics.batches >= 0 and svc.inflight == 0  # never queued
        assert _chat(s, {"guided_choice": ["yes", "no"]}).status_code == 200


def test_work_is_abandoned_at_the_next_batch_once_the_server_stops(tiny_qwen_mlx):
    from mlx_slm.service.scheduler import Job, WorkItem

    svc = Service(classifier_loader(str(tiny_qwen_mlx), ["billing", "technical"], batch_size=1))
    svc._load()
    import asyncio

    loop = asyncio.new_event_loop()
    try:
        key = svc.tasks.default_key
        prepared = svc.tasks.front(key).prepare(["a b", "c d", "e f"])
        job = Job(3, loop)
        items = [WorkItem(job, i, it, key, 4, False, time.perf_counter()) for i, it in enumerate(prepared)]
        kind = svc.tasks.back(key).kind
        calls: list[int] = []

        def counted(batch, group, pre, st):
            calls.append(len(group))
            svc.scheduler.stopping = True  # SIGTERM's drain is over: the worker is told to stop
            return type(kind).score(kind, batch, group, pre, st)

        kind.score = counted
        svc.scheduler.run_batch(key, items)
        assert calls == [1]  # the rest of the micro-batch was never computed
        assert svc.scheduler.running == [] and svc.scheduler.batch_started is None
    finally:
        loop.close()


# ----------------------------------------------------------------------------- a busy worker, told


def test_metrics_and_health_tell_the_truth_about_a_busy_worker(tiny_qwen_mlx):
    svc = Service(classifier_loader(str(tiny_qwen_mlx), ["billing", "technical"]), ServeOptions(request_timeout_s=1))
    with LiveServer(svc) as s:
        got: dict[str, httpx.Response] = {}
        with svc.loaded.clf.engine.lock:  # the worker is held inside its forward
            t = threading.Thread(target=lambda: got.setdefault("r", s.post(b'{"text": "x"}')))
            t.start()
            while svc.scheduler.batch_started is None:
                time.sleep(0.01)
            t.join()
            assert got["r"].status_code == 504  # the request timed out; its batch is still running
            m = _metrics(s)
            assert m["mlx_slm_running_items"] == 1 and m["mlx_slm_inflight_requests"] == 0
            assert m["mlx_slm_worker_busy_seconds"] > 0
            while svc.scheduler.busy_seconds <= 1:
                time.sleep(0.05)
            h = httpx.get(s.url + "/health", timeout=5)
            assert h.status_code == 503 and h.json()["status"] == "stalled", h.text
            assert "over the request timeout of 1 s" in h.json()["error"] and h.headers["retry-after"]
        while svc.scheduler.batch_started is not None:
            time.sleep(0.01)
        assert httpx.get(s.url + "/health", timeout=5).json() == {"status": "ok"}
        m = _metrics(s)
        assert m["mlx_slm_running_items"] == 0 and m["mlx_slm_worker_busy_seconds"] == 0
        assert m['mlx_slm_items_total{outcome="late"}'] >= 1  # computed after its request was gone


# ----------------------------------------------------------------------------- 4xx, not 500


@pytest.mark.parametrize("required", [["category", ["category"]], [{"a": 1}], {"category": True}, "category", [3]])
def test_a_schema_required_of_the_wrong_type_is_400_naming_it(live, required):
    schema = {"type": "object", "properties": {"category": {"enum": ["a", "b"]}}, "required": required}
    r = _chat(live, {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "response_format.json_schema.schema.required" and err["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    "field, value",
    [("encoding_format", v) for v in ([], "", False, 0, "int8", {"a": 1})]
    + [("model", v) for v in (3, [], {"a": 1}, True, "\ud800")]
    + [("user", v) for v in (1, ["u"])],
)
def test_embeddings_fields_of_the_wrong_type_are_400_naming_them(live, field, value):
    body = json.dumps({"input": "x", field: value}).encode()
    r = httpx.post(live.url + "/v1/embeddings", content=body, headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == field and r.json()["error"]["type"] == "invalid_request_error"


def test_embeddings_still_take_any_model_name_and_echo_it(live):
    r = httpx.post(
        live.url + "/v1/embeddings", json={"input": "x", "model": "any", "encoding_format": None}, timeout=30
    )
    assert r.status_code == 200 and r.json()["model"] == "any" and isinstance(r.json()["data"][0]["embedding"], list)


def test_requests_total_has_a_route_label_and_a_true_help(live):
    assert _chat(live, {"guided_choice": ["yes", "no"]}).status_code == 200
    assert httpx.post(live.url + "/v1/embeddings", json={"input": "x"}, timeout=30).status_code == 200
    assert live.post(b'{"text": "x"}').status_code == 200
    text = httpx.get(live.url + "/metrics").text
    help_ = next(ln for ln in text.splitlines() if ln.startswith("# HELP mlx_slm_requests_total"))
    assert "Classify requests" not in help_ and "route" in help_ and "embeddings" in help_
    for route in ("/v1/chat/completions", "/v1/embeddings", "/v1/classify"):
        assert f'mlx_slm_requests_total{{outcome="ok",route="{route}"}}' in text, route
    total = sum(v for k, v in _metrics(live).items() if k.startswith('mlx_slm_requests_total{outcome="ok",'))
    assert total == sum(n for o, n in live.service.metrics.requests_by_outcome().items() if o == "ok") >= 3


def test_a_subclass_of_a_core_error_answers_as_its_parent():
    class Slow(TimedOut):
        pass

    class Odd(Invalid):
        pass

    assert http_error(Slow("late", "text")).status == 504 and http_error(Slow("late")).outcome == "timeout"
    assert http_error(Odd("bad", "labels")).status == 422
    assert http_error(ServiceError("a kind of none of them")).status == 500


# ----------------------------------------------------------------------------- fuzzing


def test_any_embeddings_body_is_an_answer_or_a_4xx(live):
    """Whatever JSON stands in /v1/embeddings' fields, the answer is 200 or a 4xx in OpenAI's shape
    naming a field, never a 500 (the falsy `encoding_format`s and a list `model` were 200s)."""
    pytest.importorskip("hypothesis")
    from hypothesis import given, settings
    from hypothesis import strategies as st

    leaf = st.none() | st.booleans() | st.integers(-2, 3) | st.text(max_size=3) | st.sampled_from(["float", "base64"])
    anything = st.recursive(
        leaf, lambda c: st.lists(c, max_size=2) | st.dictionaries(st.text(max_size=2), c, max_size=2)
    )
    fields = st.sampled_from(["model", "encoding_format", "user", "dimensions", "input"])
    body = st.dictionaries(fields, anything, max_size=4).map(lambda d: {"input": "x", **d})

    @settings(max_examples=min(40, int(os.environ.get("MLX_SLM_FUZZ_EXAMPLES", "100"))), deadline=None)
    @given(body)
    def check(data):
        r = httpx.post(live.url + "/v1/embeddings", json=data, timeout=30)
        assert r.status_code in (200, 400, 413), (data, r.status_code, r.text[:300])
        if r.status_code != 200:
            assert isinstance(r.json()["error"]["message"], str)

    check()
    assert live.metric("error") == 0


def test_the_new_hostile_classes_are_counted_invalid_never_error(live):
    """Each hostile class of round seven is a 4xx counted as `invalid` on its route, never a 500."""
    schema = {"type": "object", "properties": {"c": {"enum": ["a", "b"]}}, "required": [["c"]]}
    cases = [
        ("/v1/chat/completions", {"messages": MSGS, "response_format": {
            "type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}),
        ("/v1/chat/completions", {"messages": MSGS, "guided_json": {**schema, "required": {"c": 1}}}),
        ("/v1/embeddings", {"input": "x", "encoding_format": False}),
        ("/v1/embeddings", {"input": "x", "model": ["m"]}),
        ("/classify", {"model": 3, "input": "x"}),
        ("/v1/rerank", {"model": {"a": 1}, "query": "q", "documents": ["d"]}),
    ]  # fmt: skip
    before = live.service.metrics.requests_by_outcome()
    for path, body in cases:
        r = httpx.post(live.url + path, json=body, timeout=30)
        assert 400 <= r.status_code < 500, (path, r.status_code, r.text)
    after = live.service.metrics.requests_by_outcome()
    assert after.get("invalid", 0) - before.get("invalid", 0) == len(cases)
    assert after.get("error", 0) == before.get("error", 0)
