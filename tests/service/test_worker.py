"""The service's worker, hostile round five (issue 33, items 2 and 6): a worker that dies makes
/health fail and every waiting request answer at once, and `mlx-slm serve` exit 70, never a 200 in
front of nothing; a long item is priced with its attention (quadratic in length), so the over-long
first request is refused before its forward; a forward nobody waits for is abandoned between its
batches; a blank --api-key is refused at start and a UTF-8 key is compared as bytes."""

from __future__ import annotations

import asyncio
import json
import math
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mlx_slm.service.metrics import ATTENTION_TIME, RateTracker, attention_share
from tests.hostile import LiveServer, invoke, refused_cleanly

httpx = pytest.importorskip("httpx")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

ROOT = Path(__file__).resolve().parents[2]


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


def test_serve_exits_70_when_its_worker_dies(tiny_qwen_mlx):
    code = (
        "import sys\n"
        "import mlx_slm.service.scheduler as s\n"
        "def boom(self): raise RuntimeError('the worker loop broke')\n"
        "s.Scheduler.loop = boom\n"
        "from mlx_slm.cli import main\n"
        f"sys.argv = ['mlx-slm', 'serve', '--model', {str(tiny_qwen_mlx)!r}, '--port', '0', '--labels', 'a,b']\n"
        "main()\n"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 70, (r.returncode, r.stderr[-2000:])
    assert "the model worker stopped (RuntimeError: the worker loop broke)" in r.stderr


# ----------------------------------------------------------------------------- long items, deadlines


def test_the_time_estimate_prices_attention_by_the_models_shape():
    class Args:
        hidden_size, intermediate_size, num_attention_heads, num_key_value_heads, head_dim = 896, 4864, 14, 2, 64

    a = attention_share(Args())
    assert math.isclose(a, 2 * 14 * 64 / (896 * 896 * 2 + 2 * 896 * 128 + 3 * 896 * 4864))  # Qwen2.5-0.5B: ~1.2e-4
    assert attention_share(object()) == 0.0  # a shape it cannot read: linear, as before
    t = RateTracker(attention=a)
    t.observe(10, 0.1)
    t.observe(80, 0.4)
    linear = t.fixed + t.per_token * 8161
    # causal: each token attends half the row's keys on average, at attention's own cost per multiply-add
    assert t.estimate(8161) == pytest.approx(t.fixed + t.per_token * 8161 * (1 + ATTENTION_TIME * a * 8161 / 2))
    assert t.estimate(8161) > 1.6 * linear  # an 8k-token item costs well over its tokens at the linear rate
    assert t.estimate(10) == pytest.approx(0.1, rel=0.01)  # the short end is what was measured
    w = t.tokens_within(30.0)
    assert t.estimate(w) <= 30.0 + 1e-9 < t.estimate(w + 2)  # the budget: the longest row that fits


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


# ----------------------------------------------------------------------------- the key


@pytest.mark.parametrize("key", ["", "   ", " pad", "tab\tkey", "\udcff"])
def test_a_blank_or_unsendable_api_key_is_refused_at_start(key, tmp_path):
    r = invoke(["serve", "--model", tmp_path / "no-model", "--api-key", key])
    refused_cleanly(r, "--api-key")
    assert "no-model" not in r.output  # before the model is looked for


def test_a_blank_key_in_the_environment_is_refused_and_an_empty_one_is_none(monkeypatch, tmp_path):
    from mlx_slm.server import ServeOptions, api_key_from_env

    monkeypatch.setenv("MLX_SLM_API_KEY", "  ")
    with pytest.raises(Exception, match="--api-key is blank"):
        ServeOptions(api_key=api_key_from_env(None))
    monkeypatch.setenv("MLX_SLM_API_KEY", "")
    assert api_key_from_env(None) is None


def test_a_utf8_key_is_compared_as_the_bytes_a_client_sends(tiny_qwen_mlx):
    from mlx_slm.server import ServeOptions

    svc = _service(tiny_qwen_mlx, opts=ServeOptions(max_wait_ms=2, api_key="clé-ü"))
    with LiveServer(svc) as s:
        body = b'{"text": "My card was charged twice"}'
        ok = s.post(body, headers={"authorization": "Bearer clé-ü".encode()})
        assert ok.status_code == 200, ok.text
        for wrong in ("Bearer clé-u".encode(), "Bearer clé-ü".encode("latin-1"), b"Bearer"):
            assert s.post(body, headers={"authorization": wrong}).status_code == 401
