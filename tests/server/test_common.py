"""The steps every route shares (`server/common.py`): every --served-model-name answers every route that
checks `model` (one list: `RouteContext.model_names`), an unknown name is the same 404 everywhere
(hostile round eight, issue 53)."""

from __future__ import annotations

import pytest

httpx = pytest.importorskip("httpx")


pytest.importorskip("starlette")


pytest.importorskip("uvicorn")


from mlx_slm.server import ServeOptions, Service, classifier_loader  # noqa: E402
from tests.hostile import LiveServer  # noqa: E402

MSGS = [{"role": "user", "content": "I was charged twice"}]


NAMES = ("tickets-v1", "tickets-v2")


@pytest.fixture(scope="module")
def live(tiny_qwen_mlx):
    opts = ServeOptions(max_wait_ms=5, served_model_names=NAMES, max_body_bytes=8192)
    with LiveServer(Service(classifier_loader(str(tiny_qwen_mlx)), opts)) as srv:
        yield srv


# ----------------------------------------------------------------------------- names


@pytest.mark.parametrize("name", [*NAMES, "jev-latest", None])
def test_every_name_answers_chat_completions_as_the_decision_routes(live, name):
    body = {"messages": MSGS, "guided_choice": ["yes", "no"], **({"model": name} if name else {})}
    r = httpx.post(live.url + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["model"] == NAMES[0]  # the first is the name answers report


def test_an_unknown_name_is_the_same_404_on_chat_and_decisions(live):
    body = {"model": "gpt-4o", "messages": MSGS, "guided_choice": ["yes", "no"]}
    r = httpx.post(live.url + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found", r.text
    assert "'gpt-4o'" in r.json()["error"]["message"] and repr(NAMES[0]) in r.json()["error"]["message"]


def test_the_model_lists_name_every_alias(live):
    names = [m["name"] for m in httpx.get(live.url + "/v1/models").json()["models"]]
    assert set(NAMES) <= set(names)
