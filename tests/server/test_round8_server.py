"""Hostile round eight (issue 53), the server's part: every --served-model-name answers every route
that checks `model` (one list: `RouteContext.model_names`), a blank or padded name is refused as
`--api-key` is; every POST route says a too-long number is too long (not Python's advice), and
every 413 over the body limit names --max-body-bytes (as sent, declared or decoded)."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

from mlx_slm.ground.errors import UsageError  # noqa: E402
from mlx_slm.server import ServeOptions, Service, classifier_loader, create_app, parse_body  # noqa: E402
from mlx_slm.server.errors import HTTPError  # noqa: E402
from tests.hostile import LiveServer  # noqa: E402

MSGS = [{"role": "user", "content": "I was charged twice"}]
NAMES = ("tickets-v1", "tickets-v2")


def post_routes() -> list[str]:
    app = create_app(Service(classifier_loader("unused"), ServeOptions()))
    return [r.path for r in app.routes if "POST" in (getattr(r, "methods", None) or ())]


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


@pytest.mark.parametrize("name, says", [("", "blank"), ("   ", "blank"), (" a ", "'a'"), ("a\x00", "control")])
def test_a_blank_or_padded_name_is_refused_as_api_key_is(name, says):
    with pytest.raises(UsageError) as e:
        ServeOptions(served_model_names=("ok", name))
    assert "--served-model-name" in str(e.value) and says in str(e.value)


@pytest.mark.parametrize("name", ["", " a "])
def test_serve_refuses_the_name_before_loading(tiny_qwen_mlx, name):
    # a child process: a name taken would serve until killed
    cmd = [sys.executable, "-m", "mlx_slm.cli", "serve", "--model", str(tiny_qwen_mlx), "--port", "0"]
    r = subprocess.run([*cmd, "--served-model-name", name], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--served-model-name" in r.stderr and "Traceback" not in r.stderr, r.stderr


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


# ----------------------------------------------------------------------------- no class names


def test_a_load_refused_for_the_users_reason_shows_no_class_name():
    from mlx_slm.kinds.base import TaskError

    def load():
        raise TaskError("the task's prior was fitted on weights sha256 abab..., but the model loaded has cdcd...")

    service = Service(load, ServeOptions())
    service._main()  # the worker's start: the load fails, the worker returns
    assert service.load_error.startswith("the task's prior") and "TaskError" not in service.load_error


def test_serve_with_a_task_of_other_weights_says_so_without_a_class_name(tmp_path, tiny_qwen_mlx):
    from mlx_slm.classifier.task import Task
    from mlx_slm.text.calibration import Calibrator

    t = tmp_path / "t.json"
    prior = Calibrator("fit", ("billing", "tech"), (-0.5, -0.9), n=10)
    Task(model=str(tiny_qwen_mlx), labels=["billing", "tech"], system="Route.", template="{text}",
         calibration=prior, weights_sha256="ab" * 32).save(t)  # fmt: skip
    cmd = [sys.executable, "-m", "mlx_slm.cli", "serve", "--task", str(t), "--port", "0"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert r.returncode == 2 and "does not carry over" in r.stderr, r.stderr
    assert "TaskError" not in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert f"the model loaded ({tiny_qwen_mlx}) has" in r.stderr, r.stderr


# ----------------------------------------------------------------------------- System One's 422


def test_a_question_named_body_keeps_its_place_in_the_422():
    from mlx_slm.server.systemone import validation_error
    from mlx_slm.text.decisions.errors import DecisionError

    e = validation_error(DecisionError(("body", "questions", "body", "type"), "type must be noul", "value_error"))
    assert e.status == 422 and e.field == "questions.body.type"  # was "questions.type": the id dropped
    assert e.details == [(("questions", "body", "type"), "type must be noul", "value_error")]
    assert validation_error(DecisionError(("body",), "a JSON object", "type_error")).field == "body"


def test_the_systemone_route_names_a_question_called_body(live):
    body = {"model": NAMES[0], "state": "hi", "questions": {"body": {"type": "bogus", "instructions": "?"}}}
    r = httpx.post(live.url + "/v1/systemone", json=body, timeout=60)
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"][:3] == ["body", "questions", "body"], r.text
