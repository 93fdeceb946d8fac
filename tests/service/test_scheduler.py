"""Admission of long items (issue 53): one long item is admitted when it delays no one (nothing
queued or running); one that cannot finish within --request-timeout even alone is refused with a
status clients do not retry (413, naming the reason and the fix), never the 504 both SDKs retry;
and the time estimate weighs attention causally. Fixed numbers, the scheduler's own functions:
no timing."""

from __future__ import annotations

import asyncio

import pytest

from mlx_slm.server.errors import Style, http_error
from mlx_slm.service import Metrics, RateTracker, ServeOptions, TaskCache, TimedOut, TooLarge, TooSlow
from mlx_slm.service.decide import QueuedDecision
from mlx_slm.service.keys import DECIDE_KEY, TaskKey
from mlx_slm.service.metrics import ATTENTION_TIME
from mlx_slm.service.scheduler import ITEM_TIME_FRACTION, Job, Scheduler, WorkItem, admission, too_slow

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


# ----------------------------------------------------------------------------- the estimate


def test_attention_is_weighed_causally_and_a_cached_start_whole():
    """A row of n fresh tokens attends n / 2 keys per token on average; n new tokens after c
    cached ones attend c + n / 2; a batch of rows of length L, L / 2 each."""
    t = RateTracker(attention=1e-4)
    c = ATTENTION_TIME * 1e-4
    assert t.weighted(4000) == pytest.approx(4000 * (1 + c * 2000))
    assert t.weighted(1000, 5000) == pytest.approx(1000 * (1 + c * 4500))  # 4,000 cached, 1,000 new
    assert t.weighted(8 * 300, 300) == pytest.approx(2400 * (1 + c * 150))  # 8 rows of 300
    t.observe(100, 1.0)
    w = t.tokens_within(30.0)
    assert t.estimate(w) <= 30.0 + 1e-9 < t.estimate(w + 2)  # the budget: the longest row that fits


def test_the_warm_up_measures_a_long_item_too(tiny_qwen_mlx):
    """The slope of the estimate is a long item's cost per token: the warm-up measures a short, a
    longer and a long item (short items alone priced jevcompat's 5,642-token choice at twice its time)."""
    from mlx_slm.service import classifier_loader
    from mlx_slm.service.core import warm_up

    tasks = TaskCache(4)
    tasks.load(classifier_loader(str(tiny_qwen_mlx), ["billing", "technical"])())
    seen: list[int] = []
    warm_up(tasks, lambda seconds, tokens: seen.append(tokens))
    assert len(seen) == 3 and seen[0] < seen[1] < seen[2] and seen[2] >= 3 * seen[1], seen


def test_a_decision_request_is_priced_without_the_start_its_state_cache_holds():
    """jevcompat's ladder asks 128 options, then 255 of which the first 127 are the same: the
    worker's state cache holds that start, so the 255-option request runs (and is priced at)
    the rest only; with the cache off, its whole cost."""
    from mlx_slm.service.decide import DecisionTask

    class States:
        def __init__(self, entries, held):
            self.entries, self.held, self.asked = entries, held, []

        def get(self, tokens, cache_key=None, floor=0):
            self.asked.append((len(tokens), cache_key, floor))
            return object(), self.held

    class Decider:
        def __init__(self, states):
            self.states, self.planner = states, type("Planner", (), {"head": [1, 2, 3]})()

    class Request:
        cache_key = "conversation-1"

    prepared = type("Prepared", (), {"ids": list(range(5610))})()
    item = QueuedDecision(Request(), prepared, cost=5642, longest=5610)
    on = States(64, 2751)
    assert DecisionTask(Decider(on)).work(item) == 5642 - 2751 and on.asked == [(5610, "conversation-1", 3)]
    assert DecisionTask(Decider(States(0, 2751))).work(item) == 5642  # the cache is off
    s = scheduler()
    j = job(1, ("state",))
    s.submit(j, [item], DECIDE_KEY, [5642], [False], [5642 - 2751])
    assert s.queue[0].tokens_run == 2891 and s.queue[0].cost == 5642  # priced on what runs; budgeted whole
