"""HTTP errors (`server/errors.py`): error styles (issue 48): one `Style` per route, an enum chosen once where the route is declared
(no path guessed again for Starlette's own 404/405); OpenAI's 422-as-400 and its codes are its
style's; an error answered in another style is a new error; statuses by the class hierarchy."""

from __future__ import annotations

import pytest

from mlx_slm.server import ServeOptions, Service, create_app
from mlx_slm.server.errors import HTTPError, Style, http_error
from mlx_slm.service import Invalid, NotReady, QueueFull, ServiceError

pytest.importorskip("starlette")


def _app():
    def never():  # the app is only read here: no model is loaded
        raise AssertionError("not loaded")

    return create_app(Service(never, ServeOptions()), start_worker=False)


def test_every_route_declares_its_style_once():
    from starlette.exceptions import HTTPException

    app = _app()
    ctx = app.exception_handlers[HTTPException].__self__  # the RouteContext the routes were declared on
    assert set(ctx.styles) == {r.path for r in app.routes}
    assert all(isinstance(s, Style) for s in ctx.styles.values())
    assert ctx.styles["/v1/chat/completions"] is ctx.styles["/v1/decisions"] is Style.OPENAI
    assert ctx.styles["/v1/systemone"] is Style.SYSTEMONE and ctx.styles["/info"] is Style.TEI
    assert ctx.styles["/classify"] is Style.VLLM and ctx.styles["/v1/classify"] is Style.OURS
    # Starlette's own errors on vLLM's routes are ours (as they always were); others keep theirs.
    assert Style.VLLM.of_framework is Style.OURS and Style.TEI.of_framework is Style.TEI


def test_openai_style_says_a_422_as_its_400_with_a_code_by_status():
    bad = HTTPError(422, "no such choice", "guided_choice")
    assert Style.OPENAI.status(bad) == 400 and Style.OURS.status(bad) == 422
    assert Style.OPENAI.body(bad) == {
        "error": {"message": "no such choice", "type": "invalid_request_error", "param": "guided_choice", "code": None}
    }
    assert Style.OPENAI.body(HTTPError(404, "x", code="not_found_error"))["error"]["code"] == "model_not_found"
    assert Style.OPENAI.body(HTTPError(401, "x"))["error"]["code"] == "invalid_api_key"
    assert Style.VLLM.body(bad)["error"] == {
        "status": 422,
        "message": "no such choice",
        "field": "guided_choice",
        "type": "invalid_request_error",
        "param": "guided_choice",
        "code": 422,
    }
    assert bad.body("tei") == {"error": "no such choice", "error_type": "Validation"}  # a style by its value


def test_an_error_in_another_style_is_a_new_error():
    err = HTTPError(413, "too big", "texts", headers={"X": "1"})
    again = http_error(err, Style.VLLM)
    assert again is not err and err.style is None and again.style is Style.VLLM
    assert (again.status, again.message, again.field, again.headers, again.outcome) == (
        413,
        "too big",
        "texts",
        {"X": "1"},
        "too_large",
    )
    assert http_error(err) is err


def test_status_by_the_class_hierarchy_in_any_style():
    class Full(QueueFull):
        pass

    class Odd(ServiceError):
        pass

    e = http_error(Full("full", retry_after=2), Style.TEI)
    assert (e.status, e.headers, e.style) == (429, {"Retry-After": "2"}, Style.TEI)
    assert http_error(type("Bad", (Invalid,), {})("x", "labels")).status == 422
    assert http_error(type("Later", (NotReady,), {})("x")).status == 503
    assert http_error(Odd("?")).status == 500
