"""`mlx-slm serve` over real HTTP on 127.0.0.1, with the tiny random Qwen checkpoint."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("starlette")
uvicorn = pytest.importorskip("uvicorn")

from mlx_slm.server import ServeOptions, Service, classifier_loader, create_app, http_error  # noqa: E402

TEXTS = [
    "My card was charged twice for the same invoice.",
    "The mobile app crashes whenever I open the settings page.",
    "I need to change the email address on my profile.",
    "refund status please",
    "I have been waiting for a response for several days now and would really appreciate an update.",
    "Category: billing technical account",
    "x",
    "The invoice shows the wrong amount and the app will not let me update my card details at all.",
    "Please reset my password",
    "Why was I billed again?",
    "settings page is blank",
    "change my profile email",
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_child(*args: str) -> tuple[subprocess.Popen, str]:
    """`mlx-slm serve ARGS` in a child process on a free port (-q, no API key from the environment);
    the process and its URL once /health answers 200 (its stderr's tail if it exits first)."""
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    env.pop("MLX_SLM_API_KEY", None)
    cmd = [sys.executable, "-m", "mlx_slm.cli", "serve", *args, "--port", str(port), "-q"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    end = time.time() + 180
    while time.time() < end:
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            raise RuntimeError(proc.stderr.read().decode()[-2000:])
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError("mlx-slm serve did not start")


class ThreadServer:
    def __init__(self, service: Service):
        self.service = service
        self.port = _free_port()
        cfg = uvicorn.Config(
            create_app(service),
            host="127.0.0.1",
            port=self.port,
            log_level="error",
            lifespan="on",
            timeout_graceful_shutdown=2,
        )
        self.server = uvicorn.Server(cfg)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.url = f"http://127.0.0.1:{self.port}"

    def start(self, wait_ready: bool = True) -> ThreadServer:
        self.thread.start()
        end = time.time() + 60
        while time.time() < end:
            try:
                r = httpx.get(self.url + "/health", timeout=2)
                if r.status_code == 200 or (not wait_ready and r.status_code == 503):
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise RuntimeError("server did not start")

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


def classify_results(srv, texts):
    """/v1/classify's results for `texts` from the served classifier (a 200 is asserted)."""
    r = httpx.post(srv.url + "/v1/classify", json={"texts": texts}, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["results"]


@pytest.fixture(scope="module")
def offline(tiny_qwen_mlx, tmp_path_factory):
    """`mlx-slm classify` output on TEXTS, by id."""
    from click.testing import CliRunner

    from mlx_slm.cli import main

    d = tmp_path_factory.mktemp("offline")
    inp = d / "in.jsonl"
    inp.write_text("".join(json.dumps({"id": f"t{i}", "text": t}) + "\n" for i, t in enumerate(TEXTS)))
    out = d / "out.jsonl"
    r = CliRunner().invoke(main, ["classify", str(inp), "-o", str(out), "--model", str(tiny_qwen_mlx), "-q"])
    assert r.exit_code == 0, r.output
    return {rec["id"]: rec for rec in map(json.loads, out.read_text().splitlines())}


def _post(srv, body, headers=None, timeout=30):
    return httpx.post(srv.url + "/v1/classify", json=body, headers=headers or {}, timeout=timeout)


def _metric(srv, name: str) -> float:
    text = httpx.get(srv.url + "/metrics").text
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name))


# ----------------------------------------------------------------------------- correctness


def test_health_model_metrics_openapi(srv):
    assert httpx.get(srv.url + "/health").json() == {"status": "ok"}
    m = httpx.get(srv.url + "/v1/model").json()
    assert m["task"]["labels"] == ["billing", "technical", "account"]
    assert m["dtype"] == "float32" and len(m["weights_sha256"]) == 64 and m["device"]
    spec = httpx.get(srv.url + "/openapi.json").json()
    assert "/v1/classify" in spec["paths"]
    _post(srv, {"text": TEXTS[0]})
    text = httpx.get(srv.url + "/metrics").text
    for name in (
        'mlx_slm_requests_total{outcome="ok",',
        "mlx_slm_items_total",
        "mlx_slm_queue_items",
        "mlx_slm_batch_items_bucket",
        "mlx_slm_batch_tokens_bucket",
        "mlx_slm_queue_seconds_bucket",
        "mlx_slm_inference_seconds_bucket",
        "mlx_slm_prefix_cache_hits_total",
    ):
        assert name in text, name
    assert _metric(srv, "mlx_slm_prefix_cache_hits_total") >= 1


def test_one_request_equals_classify(srv, offline):
    ids = [f"t{i}" for i in range(len(TEXTS))]
    r = _post(srv, {"texts": TEXTS, "ids": ids})
    assert r.status_code == 200, r.text
    for i in ("x-total-time", "x-queue-time", "x-inference-time"):
        assert int(r.headers[i]) >= 0
    res = r.json()["results"]
    assert r.json()["scoring"] == "labels"
    assert [x["id"] for x in res] == ids
    for x in res:
        want = offline[x["id"]]
        assert x["label"] == want["label"]
        assert x["probs"] == pytest.approx(want["probs"], abs=1.000001e-6), x["id"]
        assert x["queue_ms"] >= 0 and x["inference_ms"] > 0


def test_64_concurrent_single_text_requests(srv, offline):
    """64 clients at once, one text each: every one answered once, with classify's answer."""
    jobs = [(f"t{i % len(TEXTS)}", TEXTS[i % len(TEXTS)]) for i in range(64)]
    before = _metric(srv, "mlx_slm_batches_total")
    ok_items = _metric(srv, 'mlx_slm_items_total{outcome="ok"}')
    ok_requests = _metric(srv, 'mlx_slm_requests_total{outcome="ok",')

    def one(k):
        tid, text = jobs[k]
        r = _post(srv, {"texts": [text], "ids": [f"{tid}-{k}"]})
        return k, r.status_code, r.json()

    with ThreadPoolExecutor(64) as ex:
        got = list(ex.map(one, range(64)))
    assert sorted(k for k, _, _ in got) == list(range(64))
    for k, status, body in got:
        assert status == 200, body
        (res,) = body["results"]
        tid = jobs[k][0]
        assert res["id"] == f"{tid}-{k}"
        assert res["label"] == offline[tid]["label"]
        assert res["probs"] == pytest.approx(offline[tid]["probs"], abs=2e-5)
    batches = _metric(srv, "mlx_slm_batches_total") - before
    assert batches < 64  # items of different requests shared micro-batches
    assert _metric(srv, 'mlx_slm_items_total{outcome="ok"}') - ok_items == 64  # each computed once
    assert _metric(srv, 'mlx_slm_requests_total{outcome="ok",') - ok_requests == 64


def test_per_request_task_and_truncation(srv):
    r = _post(
        srv,
        {
            "text": "free money, click here",
            "labels": ["spam", "ham"],
            "system": "Flag spam.",
            "template": "Mail: {text}\nVerdict:",
        },
    )
    assert r.status_code == 200, r.text
    assert set(r.json()["results"][0]["probs"]) == {"spam", "ham"}
    long = "refund status please " * 400
    r = _post(srv, {"text": long})
    assert r.status_code == 422 and r.json()["error"]["field"] == "text"
    assert "context" in r.json()["error"]["message"]
    r = _post(srv, {"text": long, "truncate": "head"})
    assert r.status_code == 200 and r.json()["results"][0]["truncated"] is True


# ----------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "body,status,field",
    [
        ({}, 422, "text"),
        ({"text": "a", "texts": ["b"]}, 422, "texts"),
        ({"text": 3}, 422, "text"),
        ({"text": "   "}, 422, "text"),
        ({"texts": []}, 422, "texts"),
        ({"texts": ["ok", ""]}, 422, "texts[1]"),
        ({"texts": ["ok", 5]}, 422, "texts[1]"),
        ({"texts": ["a", "b"], "ids": [1]}, 422, "ids"),
        ({"texts": ["a", "b"], "ids": [1, 1]}, 422, "ids[1]"),
        ({"text": "a", "labels": ["only"]}, 422, "labels"),
        ({"text": "a", "labels": ["x", "x"]}, 422, "labels"),
        ({"text": "a", "template": "no placeholder"}, 422, "template"),
        # the check that failed names the field (it was guessed from "label" in the message: "labels")
        ({"text": "a", "labels": ["x", "y"], "template": "{labels} {text}"}, 422, "template"),
        ({"text": "a", "labels": ["x", "y" * 3000], "template": "T: {text}"}, 422, "labels"),
        ({"text": "a", "truncate": "both"}, 422, "truncate"),
        ({"text": "a", "colour": "red"}, 422, "colour"),
        ({"text": "a", "min_confidence": 2}, 422, "min_confidence"),
        ({"texts": ["a"] * 300}, 413, "texts"),
    ],
)
def test_invalid_requests(srv, body, status, field):
    r = _post(srv, body)
    assert r.status_code == status, r.text
    assert r.json()["error"]["field"] == field


def test_task_lru_keeps_the_served_task():
    """One LRU class holds both task caches; the pinned key (the served task) is never evicted."""
    from mlx_slm.service import LRU

    made: list[str] = []

    def make(k):
        return lambda: made.append(k) or k.upper()

    lru: LRU[str, str] = LRU(2, pinned="d")
    assert [lru.get(k, make(k)) for k in ("d", "a", "b")] == ["D", "A", "B"]
    assert "d" in lru and "a" not in lru  # the oldest went, but not the pinned one
    assert lru.get("d", make("d")) == "D" and lru.get("c", make("c")) == "C"
    assert made == ["d", "a", "b", "c"] and "b" not in lru and len(lru) == 2


def test_core_errors_map_to_statuses():
    """The core raises its own errors (no HTTP); the router's one table gives status and headers."""
    from mlx_slm import service as core
    from mlx_slm.server import http_error

    e = http_error(core.QueueFull("full", retry_after=3))
    assert (e.status, e.outcome, e.headers) == (429, "overloaded", {"Retry-After": "3"})
    e = http_error(core.Invalid("bad label", "labels"))
    assert (e.status, e.field, e.body()["error"]["field"]) == (422, "labels", "labels")
    assert http_error(core.TimedOut("late", "texts")).status == 504
    assert http_error(core.ClientGone("gone")).outcome == "client_gone"
    assert http_error(core.Failed("boom")).body("tei") == {"error": "boom", "error_type": "Backend"}
    for kind in (core.NotReady, core.Draining, core.Aborted):
        assert http_error(kind("x")).status == 503


def test_rate_estimate_has_a_fixed_and_a_per_token_cost():
    """The issue's case: a micro-batch costs 1.2 s whatever its size plus 2.7 ms a token. After
    the warm-up and five one-word requests, a 300-token item is priced at about 2 s (a
    per-token rate alone said 13 s), and the line is exact on points that lie on it."""
    from mlx_slm.service import RateTracker

    def cost(n):
        return 1.2 + 0.0027 * n

    rt = RateTracker()
    assert not rt.known and rt.estimate(300) == 0.0 and rt.tokens_within(15.0) is None
    for n in (30, 120, 30, 31, 30, 29, 30):  # warm-up (short, longer), then five one-word requests
        rt.observe(n, cost(n))
    assert rt.fixed == pytest.approx(1.2) and rt.per_token == pytest.approx(0.0027)
    assert rt.estimate(300) == pytest.approx(cost(300)) and cost(300) < 2.1
    assert rt.tokens_within(15.0) == int((15.0 - 1.2) / 0.0027)
    flat = RateTracker()  # size shows no cost (noise): a fixed cost only, no token budget
    for n, s in ((30, 0.5), (120, 0.4)):
        flat.observe(n, s)
    assert (flat.fixed, flat.per_token, flat.tokens_within(15.0)) == (pytest.approx(0.45), 0.0, None)
    one = RateTracker()  # one size measured: seconds per token through the origin
    one.observe(100, 1.0)
    assert (one.fixed, one.per_token) == (0.0, pytest.approx(0.01))


def _refused(svc, cost: int, n_items: int = 1, waited: float = 0.0, left: float | None = None):
    """Run the worker's admission check on one item of `cost` tokens of a fresh request: the
    error it was answered with (None: it would be computed)."""
    import asyncio

    from mlx_slm.service.scheduler import Job, WorkItem

    loop = asyncio.new_event_loop()
    try:
        now = time.perf_counter()
        left = svc.opts.request_timeout_s if left is None else left
        job = Job(n_items, loop, deadline=now + left)
        job.names = [f"texts[{i}]" for i in range(n_items)]
        item = WorkItem(job, 0, "t", ("k",), cost, False, now - waited)
        kept = svc.scheduler.runnable([item])
        loop.run_until_complete(asyncio.sleep(0))  # the refusal is posted to the request's loop
        assert (kept == [item]) == (job.error is None)
        return job.error
    finally:
        loop.close()


def test_no_504_for_an_item_that_fits_and_a_refusal_says_what_helps():
    """On an idle server a 300-token item estimated at 2 s runs under a 5 s timeout (a per-token
    rate alone refused it as 13 s). A refused item's advice follows what the client sent: a
    text too long for the whole timeout is to be shortened, or the timeout raised (truncation,
    which only cuts to the model's context, would not help: a 413, never retried); one that
    waited in the queue may be retried (a 504)."""
    from mlx_slm.service import Service

    svc = Service(lambda: None, ServeOptions(request_timeout_s=5.0))
    for n in (30, 120, 30, 30, 30, 30, 30):
        svc._note_speed(1.2 + 0.0027 * n, n)
    assert _refused(svc, 300) is None
    err = _refused(svc, 3000, n_items=2)  # about 9 s: more than the whole timeout
    assert err is not None and err.field == "texts[0]" and "truncate" not in err.message
    assert "--request-timeout of 5 s even with nothing else to run: send a shorter text" in err.message
    assert http_error(err).status == 413
    err = _refused(svc, 300, n_items=2, waited=4.0, left=1.0)  # 2 s, but 1 s left after the queue
    assert err is not None and "truncate" not in err.message and http_error(err).status == 504
    assert "in the queue behind other work: retry, or send fewer texts per request" in err.message


def test_body_errors(srv):
    r = httpx.post(srv.url + "/v1/classify", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 422 and r.json()["error"]["field"] == "body"
    big = json.dumps({"text": "a" * (2 << 20)})
    r = httpx.post(srv.url + "/v1/classify", content=big)
    assert r.status_code == 413 and r.json()["error"]["field"] == "body"


def test_queue_full_429_and_timeout_504(srv):
    o = srv.service.opts
    old = (o.max_queue_items, o.request_timeout_s)
    try:
        o.max_queue_items = 4
        r = _post(srv, {"texts": TEXTS[:5]})  # never fits the queue: a 413 naming the limit, not "retry"
        assert r.status_code == 413 and "--max-queue-items" in r.json()["error"]["message"], r.text
        assert _post(srv, {"texts": TEXTS[:4]}).status_code == 200
        sched, gate = srv.service.scheduler, threading.Event()
        real = sched.run_batch
        sched.run_batch = lambda key, items: (gate.wait(20), real(key, items))  # the worker waits at the gate
        try:
            with ThreadPoolExecutor(2) as pool:
                first = pool.submit(_post, srv, {"texts": TEXTS[:3]})  # taken by the worker, held at the gate
                end = time.time() + 10
                while (sched.inflight < 1 or srv.service.depth) and time.time() < end:
                    time.sleep(0.01)
                second = pool.submit(_post, srv, {"texts": TEXTS[3:6]})  # waits in the queue
                while srv.service.depth < 3 and time.time() < end:
                    time.sleep(0.01)
                r = _post(srv, {"texts": TEXTS[6:8]})  # 3 + 2 over 4: full now, retry later
                gate.set()
                assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1
                assert first.result().status_code == second.result().status_code == 200
        finally:
            gate.set()
            del sched.run_batch
        o.max_queue_items, o.request_timeout_s = old[0], 1e-4
        lock = srv.service.loaded.clf.engine.lock
        with lock:  # the worker cannot compute: the request must time out
            r = _post(srv, {"texts": TEXTS[:3]})
        assert r.status_code == 504 and r.json()["error"]["field"] == "texts"
    finally:
        o.max_queue_items, o.request_timeout_s = old
    time.sleep(0.2)
    assert srv.service.depth == 0 and _post(srv, {"text": TEXTS[0]}).status_code == 200


def test_auth_on_and_off(srv):
    assert _post(srv, {"text": "hello"}).status_code == 200  # off
    o = srv.service.opts
    o.api_key = "s3cret"
    try:
        r = _post(srv, {"text": "hello"})
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        assert _post(srv, {"text": "hello"}, {"Authorization": "Bearer wrong"}).status_code == 401
        assert httpx.get(srv.url + "/v1/model").status_code == 401
        assert _post(srv, {"text": "hello"}, {"Authorization": "Bearer s3cret"}).status_code == 200
        assert httpx.get(srv.url + "/health").status_code == 200  # left open
        assert httpx.get(srv.url + "/metrics").status_code == 200
    finally:
        o.api_key = None


def test_client_gone_items_are_dropped_before_compute(srv):
    svc = srv.service
    ok0, dropped0 = (
        _metric(srv, 'mlx_slm_items_total{outcome="ok"}'),
        _metric(srv, 'mlx_slm_items_total{outcome="dropped"}'),
    )

    def raw_request(body: dict) -> socket.socket:
        data = json.dumps(body).encode()
        s = socket.create_connection(("127.0.0.1", srv.port))
        s.sendall(
            b"POST /v1/classify HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(data)}\r\n\r\n".encode()
            + data
        )
        return s

    def wait(cond):
        end = time.time() + 10
        while not cond():
            assert time.time() < end
            time.sleep(0.01)

    with svc.loaded.clf.engine.lock:  # hold the worker inside its batch
        a = raw_request({"texts": TEXTS[:2]})
        wait(lambda: svc.inflight == 1 and svc.depth == 0)  # gathered, blocked on the lock
        b = raw_request({"texts": TEXTS[2:7]})
        wait(lambda: svc.depth == 5)
        b.close()  # the client goes away while its items wait
        wait(lambda: svc.depth == 0)
    a.settimeout(10)
    reply = b""
    while b"\r\n\r\n" not in reply or not reply.rstrip().endswith(b"}"):
        chunk = a.recv(65536)
        if not chunk:
            break
        reply += chunk
    a.close()
    assert reply.startswith(b"HTTP/1.1 200")
    wait(lambda: svc.inflight == 0)
    assert _metric(srv, 'mlx_slm_items_total{outcome="dropped"}') - dropped0 == 5
    assert _metric(srv, 'mlx_slm_items_total{outcome="ok"}') - ok0 == 2  # b's items never computed


def test_health_503_until_loaded(tiny_qwen_mlx):
    gate = threading.Event()
    inner = classifier_loader(str(tiny_qwen_mlx))

    def slow():
        gate.wait(30)
        return inner()

    s = ThreadServer(Service(slow)).start(wait_ready=False)
    try:
        assert httpx.get(s.url + "/health").status_code == 503
        r = _post(s, {"text": "hello"})
        assert r.status_code == 503 and r.headers["retry-after"]
        gate.set()
        end = time.time() + 30
        while httpx.get(s.url + "/health").status_code != 200:
            assert time.time() < end
            time.sleep(0.05)
        assert _post(s, {"text": "hello"}).status_code == 200
    finally:
        gate.set()
        s.stop()


# ----------------------------------------------------------------------------- SIGTERM


@pytest.mark.slow
def test_sigterm_drains_in_flight_requests(tiny_qwen_mlx, tmp_path):
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("MLX_SLM_API_KEY", None)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mlx_slm.cli",
            "serve",
            "--model",
            str(tiny_qwen_mlx),
            "--port",
            str(port),
            "--max-batch-items",
            "1",
            "--drain-timeout",
            "60",
            "-q",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=str(Path(__file__).resolve().parents[2]),
        env=env,
    )
    try:
        end = time.time() + 60
        while True:
            assert proc.poll() is None, proc.stderr.read().decode()
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.time() < end
            time.sleep(0.1)
        texts = TEXTS * 2

        def one(k):
            r = httpx.post(
                url + "/v1/classify", json={"texts": texts, "ids": [f"{k}-{i}" for i in range(len(texts))]}, timeout=120
            )
            return r.status_code, r.json()

        with ThreadPoolExecutor(6) as ex:
            futs = [ex.submit(one, k) for k in range(6)]
            end = time.time() + 30
            while "mlx_slm_inflight_requests 6" not in httpx.get(url + "/metrics").text:
                assert time.time() < end
                time.sleep(0.01)
            proc.send_signal(signal.SIGTERM)
            time.sleep(0.2)
            try:
                late = httpx.post(url + "/v1/classify", json={"text": "late"}, timeout=10)
                assert late.status_code == 503
                assert httpx.get(url + "/health").status_code == 503
            except httpx.ConnectError:
                pass  # already drained and gone: no new request was accepted either way
            results = [f.result() for f in futs]
        for k, (status, body) in enumerate(results):
            assert status == 200, body
            assert [x["id"] for x in body["results"]] == [f"{k}-{i}" for i in range(len(texts))]
        assert proc.wait(30) == 0, proc.stderr.read().decode()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_calibration_and_abstain_match_classify(srv, tiny_qwen_mlx, tmp_path):
    """A server calibrating with `batch` per request gives `classify --calibrate batch`'s rows."""
    from click.testing import CliRunner

    from mlx_slm.cli import main

    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(json.dumps({"id": f"t{i}", "text": t}) + "\n" for i, t in enumerate(TEXTS)))
    out = tmp_path / "out.jsonl"
    r = CliRunner().invoke(
        main,
        [
            "classify",
            str(inp),
            "-o",
            str(out),
            "--model",
            str(tiny_qwen_mlx),
            "-q",
            "--calibrate",
            "batch",
            "--min-confidence",
            "0.4",
        ],
    )
    assert r.exit_code == 0, r.output
    want = {rec["id"]: rec for rec in map(json.loads, out.read_text().splitlines())}
    ld = srv.service.loaded
    old = (ld.calibration, ld.min_confidence)
    ld.calibration, ld.min_confidence = "batch", 0.4
    try:
        res = _post(srv, {"texts": TEXTS, "ids": [f"t{i}" for i in range(len(TEXTS))]}).json()["results"]
    finally:
        ld.calibration, ld.min_confidence = old
    assert any(x.get("abstained") for x in res) or all(max(x["probs"].values()) >= 0.4 for x in res)
    for x in res:
        w = want[x["id"]]
        assert x["label"] == w["label"] and x.get("abstained") == w.get("abstained") and x["calibration"] == "batch"
        assert x["probs"] == pytest.approx(w["probs"], abs=1.000001e-6)
        assert x["raw_probs"] == pytest.approx(w["raw_probs"], abs=1.000001e-6)


def test_serve_command_load_failure_exits_2(tmp_path):
    from click.testing import CliRunner

    from mlx_slm.cli import main

    r = CliRunner().invoke(
        main, ["serve", "--model", str(tmp_path / "no-such-model"), "--port", str(_free_port()), "-q"]
    )
    assert r.exit_code == 2, r.output
    assert "could not be loaded" in r.output


def test_drain_refuses_new_requests_and_aborts_the_queue_at_its_timeout(srv):
    """What SIGTERM does, step by step: 503 to new requests and on /health; at the drain
    timeout the items never started are answered 503; the batch being computed finishes."""
    svc = srv.service
    with ThreadPoolExecutor(2) as ex:
        with svc.loaded.clf.engine.lock:
            a = ex.submit(_post, srv, {"texts": TEXTS[:2]})
            end = time.time() + 10
            while not (svc.inflight == 1 and svc.depth == 0):
                assert time.time() < end
                time.sleep(0.01)
            b = ex.submit(_post, srv, {"texts": TEXTS[2:5]})
            while svc.depth != 3:
                assert time.time() < end
                time.sleep(0.01)
            svc.begin_drain()
            try:
                late = _post(srv, {"text": "late"})
                assert late.status_code == 503 and late.headers["retry-after"]
                assert httpx.get(srv.url + "/health").status_code == 503
                assert not svc.wait_idle(0.1)
                svc.abort_pending()
                rb = b.result(10)
                assert rb.status_code == 503 and "drain timeout" in rb.json()["error"]["message"]
            except BaseException:
                svc.draining = False
                raise
        try:
            assert a.result(10).status_code == 200
            assert svc.wait_idle(5)
        finally:
            svc.draining = False
    assert _post(srv, {"text": TEXTS[0]}).status_code == 200


def test_saved_task_prior_matches_classify_task(srv, tiny_qwen_mlx, tmp_path):
    """A fitted prior (`--calibrate fit --save-task`) applied by the server gives `classify --task`'s
    rows exactly; a per-request task (other labels) gets raw scores, since the prior means nothing there."""
    from click.testing import CliRunner

    from mlx_slm.classifier.task import Task
    from mlx_slm.cli import main

    labs = ["billing", "technical", "account"]
    lab = tmp_path / "lab.jsonl"
    lab.write_text("".join(json.dumps({"text": t, "label": labs[i % 3]}) + "\n" for i, t in enumerate(TEXTS * 2)))
    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in enumerate(TEXTS)))
    task = tmp_path / "task.json"
    args = ["classify", str(inp), "--model", str(tiny_qwen_mlx), "-q"]
    r = CliRunner().invoke(
        main,
        [
            *args,
            "-o",
            str(tmp_path / "a.jsonl"),
            "--calibrate",
            "fit",
            "--calibration-data",
            str(lab),
            "--save-task",
            str(task),
        ],
    )
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(main, ["classify", str(inp), "--task", str(task), "-q", "-o", str(tmp_path / "b.jsonl")])
    assert r.exit_code == 0, r.output
    want = {rec["id"]: rec for rec in map(json.loads, (tmp_path / "b.jsonl").read_text().splitlines())}
    ld = srv.service.loaded
    old = ld.calibration
    ld.calibration = Task.load(task).calibration
    try:
        res = _post(srv, {"texts": TEXTS, "ids": list(range(len(TEXTS)))}).json()["results"]
        other = _post(srv, {"text": "hello", "labels": ["spam", "ham"]}).json()["results"][0]
    finally:
        ld.calibration = old
    for x in res:
        got = {k: v for k, v in x.items() if k not in ("queue_ms", "inference_ms")}
        assert got == want[x["id"]]
    assert "raw_probs" not in other and "calibration" not in other


def test_per_request_min_confidence_abstains(srv):
    tops = sorted({max(x["probs"].values()) for x in _post(srv, {"texts": TEXTS}).json()["results"]})
    assert len(tops) > 1
    cut = (tops[len(tops) // 2 - 1] + tops[len(tops) // 2]) / 2  # some items above it, some below
    res = _post(srv, {"texts": TEXTS, "min_confidence": cut}).json()["results"]
    for x in res:
        assert bool(x.get("abstained")) == (max(x["probs"].values()) < cut)
        assert (x["label"] is None) == bool(x.get("abstained"))
    assert any(x.get("abstained") for x in res) and not all(x.get("abstained") for x in res)


def test_a_task_of_questions_is_served_on_our_route_only(tiny_qwen_mlx, tmp_path):
    """A served task of several questions: /v1/classify answers every question (as classify
    --task writes them); TEI's /predict and vLLM's /classify refuse with a 422 naming our route;
    a request with its own labels is a label task as before."""
    from click.testing import CliRunner

    from mlx_slm.cli import main
    from mlx_slm.text.questions import Question

    qs = [Question("team", "Which team?", "choice", ("billing", "technical")),
          Question("mood", "How calm?", "scale", ("1", "2", "3"))]  # fmt: skip
    qf, task, inp, out = tmp_path / "q.jsonl", tmp_path / "t.json", tmp_path / "in.jsonl", tmp_path / "o.jsonl"
    qf.write_text("\n".join(json.dumps(q.to_dict()) for q in qs) + "\n")
    inp.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in enumerate(TEXTS[:4])))
    r = CliRunner().invoke(main, ["classify", str(inp), "--model", str(tiny_qwen_mlx), "--questions", str(qf),
                                  "--save-task", str(task), "-o", str(out), "-q"])  # fmt: skip
    assert r.exit_code == 0, r.output
    want = [json.loads(x) for x in out.read_text().splitlines()]
    from mlx_slm.classifier.classifier import Classifier
    from mlx_slm.service.api import Loaded

    def load() -> Loaded:
        return Loaded(Classifier.from_task(str(task)), "none", None, model=str(tiny_qwen_mlx))

    srv = ThreadServer(Service(load, ServeOptions())).start()
    try:
        r = _post(srv, {"texts": TEXTS[:4], "ids": [0, 1, 2, 3]})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["scoring"] == "questions"
        for got, exp in zip(body["results"], want):  # other batches: equal up to the last bits
            for name, a in exp["answers"].items():
                assert got["answers"][name]["label"] == a["label"]
                assert got["answers"][name]["probs"] == pytest.approx(a["probs"], abs=1e-5)
        info = httpx.get(srv.url + "/v1/model").json()
        assert [q["name"] for q in info["task"]["questions"]] == ["team", "mood"]
        tei = httpx.post(srv.url + "/predict", json={"inputs": TEXTS[0]})
        assert tei.status_code == 422 and "/v1/classify" in tei.text
        vllm = httpx.post(srv.url + "/classify", json={"model": "x", "input": TEXTS[0]})
        assert vllm.status_code == 422 and "/v1/classify" in vllm.text
        r = _post(srv, {"text": TEXTS[0], "labels": ["billing", "technical"]})
        assert r.status_code == 200 and r.json()["results"][0]["label"] in ("billing", "technical")
        r = _post(srv, {"text": TEXTS[0], "truncate": "head"})
        assert r.status_code == 422 and "truncat" in r.text
    finally:
        srv.stop()
