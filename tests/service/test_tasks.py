"""The service's per-request tasks: a request with its own prompt on a server whose task has a
learned head, and the label trie counted in a micro-batch's token budget and time estimate."""

from __future__ import annotations

import numpy as np
import pytest

from tests.hostile import LABELS, SYSTEM, TEMPLATE


def test_head_server_request_with_its_own_prompt(engine, tiny_qwen_mlx):
    """On a server whose task has a learned head, a request with the head's labels and its own
    system or template was a 422 "scoring mode 'head' is not one of auto, first-token,
    sequence"; it now scores those labels (the head holds for its own prompt only)."""
    from mlx_slm.server import ServeOptions, Service, classifier_loader
    from mlx_slm.text.heads import Head

    d = int(engine.model.args.hidden_size)
    rng = np.random.default_rng(0)
    head = Head(tuple(LABELS), (1,), np.zeros(d), np.ones(d), rng.normal(size=(3, d)), np.zeros(3))
    service = Service(
        classifier_loader(str(tiny_qwen_mlx), LABELS, SYSTEM, TEMPLATE, head=head), ServeOptions(max_wait_ms=5)
    )
    service._load()
    assert service.front_classifier(service.default_key).mode == "head"
    for key in (
        service.task_key(None, "Another system message.", None, None),
        service.task_key(None, None, "Message: {text}\nQueue:", None),
    ):
        front = service.front_classifier(key)
        assert front.head is None and front.mode in ("first-token", "sequence")
        assert front.classify(["my card was charged twice"])[0].ok


def test_server_batches_count_the_label_trie(tiny_qwen_mlx):
    """The service's micro-batch budget and time estimate counted a request's prompt tokens
    only, not the label trie each row runs beside them (the classifier's own plan counts it):
    with many multi-token labels the estimate was the trie's share too low."""
    httpx = pytest.importorskip("httpx")
    pytest.importorskip("uvicorn")
    from mlx_slm.server import ServeOptions, Service, classifier_loader
    from tests.server.test_app import ThreadServer

    service = Service(classifier_loader(str(tiny_qwen_mlx)), ServeOptions(max_wait_ms=5))
    seen: list[list[int]] = []
    submit = service.submit

    def spy(job, texts, key, costs, hits, *works):
        seen.append(list(costs))
        return submit(job, texts, key, costs, hits, *works)

    service.submit = spy  # type: ignore[method-assign]
    s = ThreadServer(service).start()
    try:
        labels = ["card arrival late", "card arrival", "lost or stolen card", "refund request status", "top up"]
        body = {"texts": ["my card has not come"], "labels": labels}
        r = httpx.post(s.url + "/v1/classify", json=body, timeout=60)
        assert r.status_code == 200, r.text
        front = service.front_classifier(service.task_key(labels, None, None, None))
        assert front.mode == "sequence" and front.kind.row_extra > 0
        item = front.prepare(body["texts"])[0]
        assert seen[-1] == [len(item.ids) - len(front.prefix_tokens) + front.kind.row_extra]
    finally:
        s.stop()


def test_a_request_tokenizes_each_text_once(tiny_qwen_mlx, monkeypatch):
    """The front tokenized every text to check it and count its cost, then the worker's
    classifier tokenized it again (issue 34): the worker now runs the front's items."""
    httpx = pytest.importorskip("httpx")
    pytest.importorskip("uvicorn")
    from mlx_slm.server import ServeOptions, Service, classifier_loader
    from tests.server.test_app import ThreadServer

    service = Service(classifier_loader(str(tiny_qwen_mlx)), ServeOptions(max_wait_ms=5))
    s = ThreadServer(service).start()
    try:
        texts = [f"zq{k} my card was charged twice for invoice number {k}" for k in range(5)]
        seen: list[str] = []
        tok_class = type(service.tasks.front_engine.tokenizer)
        call = tok_class.__call__

        def counting(self, text, *a, **k):
            batch = [text] if isinstance(text, str) else list(text)
            seen.extend(t for t in texts for x in batch if isinstance(x, str) and t in x)
            return call(self, text, *a, **k)

        monkeypatch.setattr(tok_class, "__call__", counting)
        for labels in (None, ["billing", "technical support", "account"]):  # the served task, and a request's own
            seen.clear()
            body = {"texts": texts, **({"labels": labels} if labels else {})}
            r = httpx.post(s.url + "/v1/classify", json=body, timeout=60)
            assert r.status_code == 200, r.text
            assert sorted(seen) == sorted(texts), f"tokenized {len(seen)} times for {len(texts)} texts"
    finally:
        s.stop()
