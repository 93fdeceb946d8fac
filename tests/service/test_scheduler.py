"""The scheduler (`service/scheduler.py`): the bounded queue, admission, micro-batching and deadlines.

Admission of long items (issue 53): one long item is admitted when it delays no one (nothing
queued or running); one that cannot finish within --request-timeout even alone is refused with a
status clients do not retry (413, naming the reason and the fix), never the 504 both SDKs retry;
and the worker (see its section). Fixed numbers, the scheduler's own functions:
no timing."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from mlx_slm.server.errors import Style, http_error
from mlx_slm.service import Metrics, ServeOptions, TaskCache, TimedOut, TooLarge, TooSlow
from mlx_slm.service.decide import QueuedDecision
from mlx_slm.service.keys import DECIDE_KEY, TaskKey
from mlx_slm.service.metrics import attention_share
from mlx_slm.service.scheduler import ITEM_TIME_FRACTION, Job, Scheduler, WorkItem, admission, too_slow
from tests.hostile import LiveServer

TIMEOUT = 60.0
KEY = TaskKey()


def scheduler(per_token: float = 0.01) -> Scheduler:
    """A scheduler whose estimate is `per_token` seconds a token, no fixed cost, no attention:
    an item of n tokens is priced at n * per_token seconds."""
    s = Scheduler(ServeOptions(request_timeout_s=TIMEOUT, max_batch_tokens=8192), Metrics(), TaskCache(4))
    s.speed.observe(100, 100 * per_token)
    assert s.speed.estimate(1000) == pytest.approx(1000 * per_token)
    return s


def job(n: int = 1, names: tuple[str, ...] = ("text",)) -> Job:
    j = Job(n, asyncio.new_event_loop())
    j.names = list(names)
    return j


def submit(s: Scheduler, tokens: int, key: TaskKey = KEY, item: object = "t", names: tuple[str, ...] = ("text",)):
    j = job(1, names)
    s.submit(j, [item], key, [tokens], [False])
    return j


# ----------------------------------------------------------------------------- the rule


def test_a_long_item_is_admitted_when_nothing_else_waits_or_runs():
    """jevcompat's case: 43 s of a 60 s timeout, nothing queued: admitted (the half-timeout share
    protected no one)."""
    s = scheduler()
    submit(s, 4300)  # 43 s: over half the timeout, under all of it
    assert s.depth == 1 and s.speed.estimate(4300) > ITEM_TIME_FRACTION * TIMEOUT


@pytest.mark.parametrize("busy", ["queued", "gathered", "running"])
def test_a_long_item_is_refused_504_while_others_wait_or_run(busy):
    """With other work waiting or running, an item over half the timeout would hold the others
    up: a 504 (retried by clients, and a retry can succeed once the server is idle)."""
    s = scheduler()
    other = submit(s, 10)
    if busy == "gathered":  # taken off the queue by the worker, not yet running
        assert s.gather() is not None and s.depth == 0 and s.busy
    elif busy == "running":
        s.queue.clear()
        s.running = [WorkItem(other, 0, "t", KEY, 10, False, 0.0)]
    with pytest.raises(TimedOut) as e:
        submit(s, 4300)
    assert not isinstance(e.value, TooLarge)
    assert http_error(e.value).status == 504 and e.value.field == "text"
    msg = e.value.message
    assert "about 43 s" in msg and "while other requests wait or run" in msg and "retry later" in msg, msg
    assert s.depth == (1 if busy == "queued" else 0)  # the refused request took no place
    assert submit(s, 2000) is not None  # a shorter one (20 s, under half) is admitted beside them


def test_an_item_over_the_whole_timeout_is_413_even_alone_naming_the_fix():
    s = scheduler()
    with pytest.raises(TooSlow) as e:
        submit(s, 6100)  # 61 s: over the 60 s timeout with nothing else to run
    err = e.value
    assert isinstance(err, TooLarge) and not isinstance(err, TimedOut)
    assert http_error(err).status == 413 and http_error(err).outcome == "too_large"
    assert "Retry-After" not in http_error(err).headers  # nothing to wait for
    assert "more than the server's --request-timeout of 60 s even with nothing else to run" in err.message
    assert "send a shorter text" in err.message and "larger --request-timeout" in err.message
    assert s.depth == 0


def test_the_413_in_every_wire_style():
    """Every API's error body: no style turns it into a status its SDK retries."""
    h = http_error(TooSlow("texts[0] would take about 70 s", "texts[0]"))
    assert h.body(Style.SYSTEMONE) == {"detail": {"error_type": "request_too_large", "message": h.message}}
    for style in Style:
        assert style.status(h) == 413


def test_a_decision_request_is_told_to_ask_less_and_a_chat_to_send_fewer_choices():
    """The advice names what the request holds: a decision request's questions and state (a short
    state with many heavy questions is not "shorten the state"), a text's choices."""

    class Request:
        questions = [object()] * 400

    s = scheduler()
    item = QueuedDecision(Request(), None, cost=6100, longest=100)
    with pytest.raises(TooSlow) as e:
        submit(s, 6100, DECIDE_KEY, item, ("state",))
    assert "its state and 400 question(s), 6100 tokens" in e.value.message
    assert "ask fewer questions or options per request, or send a shorter state" in e.value.message
    j = job()
    chat = WorkItem(j, 0, "t", KEY, 100, False, 0.0, work=6100)  # a short text, a heavy trie of choices
    err = admission(chat, 61.0, TIMEOUT, idle=True)
    assert isinstance(err, TooSlow) and "send fewer choices, or a shorter text" in err.message


def test_admission_alone_with_fixed_estimates():
    it = WorkItem(job(), 0, "t", KEY, 10, False, 0.0)
    assert admission(it, 29.0, TIMEOUT, idle=False) is None  # under half: always
    assert admission(it, 59.0, TIMEOUT, idle=True) is None  # under all, alone
    assert isinstance(admission(it, 31.0, TIMEOUT, idle=False), TimedOut)
    assert isinstance(admission(it, 61.0, TIMEOUT, idle=True), TooSlow)
    assert isinstance(admission(it, 61.0, TIMEOUT, idle=False), TooSlow)  # no retry helps, busy or not


def test_at_the_worker_an_item_that_waited_is_504_and_one_over_the_timeout_413():
    """Rule 3 (an item priced over what its request has left): a retry may help if it waited;
    none can if the estimate is over the whole timeout (it grew since the item was admitted)."""
    it = WorkItem(job(2, ("texts[0]", "texts[1]")), 0, "t", KEY, 10, False, 0.0)
    waited = too_slow(it, 20.0, 5.0, TIMEOUT)
    assert type(waited) is TimedOut and "in the queue behind other work: retry, or send fewer texts" in waited.message
    assert isinstance(too_slow(it, 70.0, 5.0, TIMEOUT), TooSlow)


# The service's worker, hostile round five (issue 33, items 2 and 6): a worker that dies makes /health fail
# and every waiting request answer at once; a long item is priced with its attention, so the over-long first
# request is refused before its forward; a forward nobody waits for is abandoned between its batches.


httpx = pytest.importorskip("httpx")


pytest.importorskip("starlette")


pytest.importorskip("uvicorn")


def _service(model, **kw):
    from mlx_slm.server import ServeOptions, Service, classifier_loader

    opts = kw.pop("opts", None) or ServeOptions(max_wait_ms=2)
    return Service(classifier_loader(str(model), ["billing", "technical"], **kw), opts)


# ----------------------------------------------------------------------------- a worker that dies


def test_a_dead_worker_fails_health_and_answers_every_waiting_request(tiny_qwen_mlx):
    svc = _service(tiny_qwen_mlx)
    fatal: list[str] = []
    with LiveServer(svc) as s:
        svc.on_fatal = fatal.append

        def boom(items):
            raise RuntimeError("a bug in the worker loop")

        svc.scheduler.runnable = boom  # the next micro-batch kills the loop
        r = s.post(b'{"text": "My card was charged twice"}', timeout=30)
        assert r.status_code == 500 and "the model worker stopped" in r.text, r.text
        health = httpx.get(s.url + "/health", timeout=5)
        assert health.status_code == 503 and "a bug in the worker loop" in health.json()["error"]
        assert fatal and "the model worker stopped" in fatal[0]
        again = s.post(b'{"text": "The app crashes"}', timeout=30)  # not accepted into a dead queue
        assert again.status_code == 503, again.text


def test_an_over_long_first_request_is_refused_before_its_forward(tiny_qwen_mlx):
    """Priced as a line (10 ms a token) a ~900-token item fits a 20 s timeout; with the tiny model's
    attention it takes about 2.7 times that, over the whole timeout even alone: refused at once with
    a 413 (no retry can help), naming the estimate and the fix, and no forward runs."""
    from mlx_slm.server import ServeOptions

    svc = _service(tiny_qwen_mlx, opts=ServeOptions(max_wait_ms=2, request_timeout_s=20.0))
    with LiveServer(svc) as s:
        speed = svc.scheduler.speed
        assert speed.attention > 0 and speed.attention == attention_share(svc.tasks.loaded.clf.engine.model.args)
        speed._by_size = {1: (1.0, 0.01)}  # measured: 10 ms a token, no fixed cost
        speed.fixed, speed.per_token = 0.0, 0.01
        before = svc.metrics.batches
        text = " ".join(["the invoice and the app and my account"] * 70)
        cost = len(svc.tasks.loaded.clf.engine.tokenizer(text)["input_ids"])
        assert speed.fixed + speed.per_token * cost < 20.0 < speed.estimate(cost)
        r = s.post(json.dumps({"text": text}).encode(), timeout=60)
        assert r.status_code == 413 and "would take about" in r.text and "send a shorter text" in r.text, r.text
        assert "larger --request-timeout" in r.text
        assert svc.metrics.batches == before  # refused before any forward pass


def test_a_forward_nobody_waits_for_is_abandoned_between_its_batches(tiny_qwen_mlx):
    from mlx_slm.service.scheduler import Job, WorkItem

    svc = _service(tiny_qwen_mlx, batch_size=1)  # every item its own batch
    svc._load()  # loaded and warmed, no worker thread: the batch is run here
    key = svc.tasks.default_key
    kind = svc.tasks.back(key).kind
    texts = ["My card was charged twice", "The app crashes", "I cannot log in", "Refund please"]
    prepared = svc.tasks.front(key).prepare(texts)
    loop = asyncio.new_event_loop()
    try:
        for cancel_after in (None, 1):
            job = Job(len(texts), loop)
            items = [WorkItem(job, i, it, key, 8, False, time.perf_counter()) for i, it in enumerate(prepared)]
            calls = []

            def counted(batch, group, pre, st, job=job, calls=calls, cancel_after=cancel_after):
                calls.append(len(group))
                out = type(kind).score(kind, batch, group, pre, st)
                if cancel_after is not None and len(calls) >= cancel_after:
                    job.cancelled = True  # the client left after the first batch
                return out

            kind.score = counted  # every batch the pipeline scores passes here
            dropped = svc.metrics.items.get("dropped", 0)
            svc.scheduler.run_batch(key, items)
            del kind.score
            if cancel_after is None:
                assert len(calls) == len(texts)  # everyone waits: every batch runs
            else:
                assert len(calls) == 1  # the rest was never computed
                assert svc.metrics.items.get("dropped", 0) - dropped == len(texts) - 1
    finally:
        loop.close()
