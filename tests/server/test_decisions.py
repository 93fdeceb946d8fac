"""OpenAI's POST /v1/decisions through OpenAI's own SDK (`client.decisions.create`, with
`_strict_response_validation=True`: every response parsed against `openai.types.Decision`) on a
tiny random model: predicate, choice (typed values: "true" and true distinct) and score answers
equal to the `Decider`'s and to /v1/systemone's for the same questions; a refusal for a question
over the context while the others are answered; usage with every field an int (what
`DecisionsToolRunner` requires) and `cached_tokens` for a state asked again (the same tokens, or
the same `prompt_cache_key`); every bad request a 400 in OpenAI's error shape naming the field."""

from __future__ import annotations

import json

import numpy as np
import pytest

httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

from mlx_slm.server import ServeOptions, Service, classifier_loader  # noqa: E402
from mlx_slm.text.decisions.openai import parse_openai  # noqa: E402
from tests.server.test_app import ThreadServer  # noqa: E402

KEY = "k"
INPUT = "I was charged twice for the same order and want my money back."
QUESTIONS = [
    {"type": "predicate", "name": "refund", "instructions": "The customer asks for money back."},
    {
        "type": "choice",
        "name": "team",
        "instructions": "Which team handles this?",
        "choices": [
            {"value": "billing", "description": "Payments"},
            {"value": "shipping"},
            {"value": "true"},
            {"value": True},
        ],
    },
    {
        "type": "score",
        "instructions": "How urgent?",
        "levels": [{"label": "can wait"}, {"label": "today", "description": "within hours"}, {"label": "now"}],
    },
]


@pytest.fixture(scope="module")
def served(tiny_arch):
    path = tiny_arch.mlx("qwen2")
    srv = ThreadServer(Service(classifier_loader(str(path)), ServeOptions(max_wait_ms=5, api_key=KEY))).start()
    client = openai.OpenAI(
        base_url=srv.url + "/v1", api_key=KEY, timeout=120, max_retries=0, _strict_response_validation=True
    )
    yield srv, client, str(path)
    srv.stop()


def reference(srv, payload):
    tasks = srv.service.tasks
    req = parse_openai(payload, tasks.decision_config())
    (res,) = tasks.decider(True).decider.decide([req])
    return [None if p is None else np.asarray(p, dtype=np.float64) for p in res.probabilities]


def test_every_answer_type_parses_strictly_and_equals_the_decider(served):
    srv, client, _ = served
    d = client.decisions.create(model="gpt-6-luna", input=INPUT, questions=QUESTIONS)
    want = reference(srv, {"model": "gpt-6-luna", "input": INPUT, "questions": QUESTIONS})
    refund, team, urgency = d.answers
    assert (refund.type, refund.name) == ("predicate", "refund")
    assert refund.probability == pytest.approx(want[0][0], abs=1e-5)
    assert (team.type, team.name) == ("choice", "team")
    values = [p.value for p in team.probabilities]
    assert values == ["billing", "shipping", "true", True]  # typed: the string and the boolean stay distinct
    assert [type(v) for v in values[2:]] == [str, bool]
    assert [p.probability for p in team.probabilities] == pytest.approx(want[1], abs=1e-5)
    assert team.choice == values[int(np.argmax(want[1]))]
    assert team.confidence == pytest.approx((max(want[1]) - 1 / 4) / (1 - 1 / 4), abs=1e-5)
    assert (urgency.type, urgency.name) == ("score", None)
    assert [(p.value, p.label) for p in urgency.probabilities] == [(0, "can wait"), (1, "today"), (2, "now")]
    assert urgency.score == pytest.approx(float(np.dot(np.arange(3), want[2])), abs=1e-5)
    u = d.usage
    for v in (u.input_tokens, u.output_tokens, u.total_tokens, u.input_tokens_details.cached_tokens,
              u.input_tokens_details.cache_write_tokens, u.output_tokens_details.reasoning_tokens):  # fmt: skip
        assert type(v) is int
    assert u.input_tokens > 0 and u.output_tokens == 0 and u.total_tokens == u.input_tokens


def test_the_same_answers_as_system_one(served):
    """A predicate is a noul, a choice's values its options, a score's labels its levels: the same
    probabilities on both routes for the same state and questions."""
    srv, client, _ = served
    d = client.decisions.create(model="gpt-6-luna", input=INPUT, questions=QUESTIONS[:1] + QUESTIONS[2:])
    so = httpx.post(
        srv.url + "/v1/systemone",
        json={
            "model": "jev-latest",
            "state": INPUT,
            "questions": {
                "refund": {"type": "noul", "instructions": QUESTIONS[0]["instructions"]},
                "urgency": {
                    "type": "score",
                    "instructions": "How urgent?",
                    "criteria": ["can wait", "today: within hours", "now"],
                },
            },
        },
        headers={"Authorization": f"Bearer {KEY}"},
        timeout=120,
    ).json()["answers"]
    assert d.answers[0].probability == pytest.approx(so["refund"]["noul"], abs=1e-5)


def test_messages_input_json_and_names(served):
    srv, client, model = served
    d = client.decisions.create(
        model=model,
        input=[
            {"role": "system", "content": "Tickets from the web form."},
            {
                "role": "user",
                "content": [{"type": "input_text", "text": INPUT}, {"type": "input_json", "data": {"order": 4471}}],
            },
        ],
        questions=[{"type": "predicate", "instructions": [{"type": "input_text", "text": "A refund?"}]}],
    )
    assert d.answers[0].type == "predicate" and d.answers[0].name is None and 0 <= d.answers[0].probability <= 1


def test_a_question_over_the_context_is_refused_and_the_others_answered(served):
    srv, client, _ = served
    long = {"type": "predicate", "name": "long", "instructions": "refund " * 3000}
    d = client.decisions.create(model="gpt-6-luna", input=INPUT, questions=[QUESTIONS[0], long])
    assert d.answers[0].type == "predicate" and (d.answers[1].type, d.answers[1].name) == ("refusal", "long")
    d = client.decisions.create(model="gpt-6-luna", input="refund " * 3000, questions=QUESTIONS)
    assert [a.type for a in d.answers] == ["refusal"] * 3 and [a.name for a in d.answers] == ["refund", "team", None]


def test_a_state_asked_again_reuses_its_keys_and_values(served):
    """The same request again: its state's keys and values from the state cache. Other questions
    about the same input under the same `prompt_cache_key`: the tokens the two share."""
    _, client, _ = served
    state = "A state asked twice. " + INPUT * 4
    first = client.decisions.create(model="gpt-6-luna", input=state, questions=QUESTIONS)
    again = client.decisions.create(model="gpt-6-luna", input=state, questions=QUESTIONS)
    assert first.usage.input_tokens_details.cached_tokens == 0
    # the state's tokens from the cache, and (the same questions: the same prompts) their answers too
    assert 0 < again.usage.input_tokens_details.cached_tokens <= again.usage.input_tokens
    assert again.usage.input_tokens == first.usage.input_tokens
    for a, b in zip(first.answers[1].probabilities, again.answers[1].probabilities):
        assert a.value == b.value and a.probability == pytest.approx(b.probability, abs=1e-5)
    other = "Another state, keyed. " + INPUT * 4
    client.decisions.create(model="gpt-6-luna", input=other, questions=QUESTIONS, prompt_cache_key="c1")
    keyed = client.decisions.create(model="gpt-6-luna", input=other, questions=QUESTIONS[:1], prompt_cache_key="c1")
    alone = client.decisions.create(model="gpt-6-luna", input=other, questions=QUESTIONS[:1])
    assert keyed.usage.input_tokens_details.cached_tokens > 0
    assert keyed.answers[0].probability == pytest.approx(alone.answers[0].probability, abs=1e-5)


BAD = {
    "no-questions": ({"questions": []}, "questions"),
    "401-questions": ({"questions": [QUESTIONS[0]] * 401}, "questions"),
    "one-choice": (
        {"questions": [{"type": "choice", "instructions": "?", "choices": [{"value": "a"}]}]},
        "questions[0]",
    ),
    "256-choices": (
        {"questions": [{"type": "choice", "instructions": "?", "choices": [{"value": f"o{i}"} for i in range(256)]}]},
        "questions[0]",
    ),
    "duplicate-values": (
        {"questions": [{"type": "choice", "instructions": "?", "choices": [{"value": "a"}, {"value": "a"}]}]},
        "questions[0]",
    ),
    "duplicate-names": ({"questions": [QUESTIONS[0], {**QUESTIONS[0], "instructions": "Again?"}]}, "questions[1].name"),
    "name-like-an-index": (
        {"questions": [{"type": "predicate", "instructions": "?"}, {**QUESTIONS[0], "name": "#0"}]},
        "questions[1].name",
    ),
    "one-level": ({"questions": [{"type": "score", "instructions": "?", "levels": [{"label": "a"}]}]}, "questions[0]"),
    "11-levels": (
        {"questions": [{"type": "score", "instructions": "?", "levels": [{"label": str(i)} for i in range(11)]}]},
        "questions[0]",
    ),
    "unknown-type": ({"questions": [{"type": "noul", "instructions": "?"}]}, "questions[0]"),
    "instructions-number": ({"questions": [{"type": "predicate", "instructions": 3}]}, "questions[0]"),
    "image": (
        {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "data:image/png;base64,AAAA"}]}]},
        "input",
    ),
    "lone-surrogate": ({"input": "bad \ud800"}, "input"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_requests_are_400_naming_the_field(served, case):
    srv, client, _ = served
    change, param = BAD[case]
    body = {"model": "gpt-6-luna", "input": INPUT, "questions": QUESTIONS, **change}
    if case == "lone-surrogate":  # the SDK cannot encode it; a client that escapes it sends this
        r = httpx.post(
            srv.url + "/v1/decisions",
            content=json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"},
            timeout=60,
        )
        assert r.status_code == 400
        err = r.json()["error"]
    else:
        with pytest.raises(openai.BadRequestError) as e:
            client.decisions.create(**body)
        err = e.value.body
    assert set(err) == {"message", "type", "param", "code"} and err["type"] == "invalid_request_error"
    assert err["param"].startswith(param), err
    if case == "image":
        assert "image" in err["message"]


def test_unknown_model_wrong_key_and_aliases(served):
    srv, client, model = served
    with pytest.raises(openai.NotFoundError) as e:
        client.decisions.create(model="gpt-4o", input=INPUT, questions=QUESTIONS[:1])
    assert e.value.body["code"] == "model_not_found" and "gpt-4o" in e.value.body["message"]
    for name in ("gpt-6-luna", "jev-latest", model):
        assert client.decisions.create(model=name, input=INPUT, questions=QUESTIONS[:1]).answers[0].type == "predicate"
    bad = openai.OpenAI(base_url=srv.url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as e:
        bad.decisions.create(model=model, input=INPUT, questions=QUESTIONS[:1])
    assert e.value.body["code"] == "invalid_api_key"
    r = httpx.post(srv.url + "/v1/decisions", content=b"{", headers={"Authorization": f"Bearer {KEY}"}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "body"


def test_the_sdks_decisions_tool_runner_reads_our_answers(served):
    """`DecisionsToolRunner` checks more than the types (every usage field an int, the answer
    named, finite probabilities) and raises otherwise: it runs to its end on ours."""
    from openai.lib.decisions_tool_runner import DecisionsToolRunner

    _, client, _ = served
    done: list[str] = []

    def candidates(observation):
        finish = {"id": "done", "description": "The ticket is handled.", "done": True}
        if done:
            return [finish]
        return [
            {"id": "refund", "description": "Refund the customer.", "execute": lambda: done.append("refund")},
            finish,
        ]

    runner = DecisionsToolRunner(observe=lambda: "ticket: " + INPUT, candidates=candidates)
    result = runner.run(client, {"model": "gpt-6-luna", "input": INPUT}, max_steps=3)
    assert result["status"] == "unverified" and len(result["decisions"]) == 1
    assert result["decisions"][0].answers[0].name == "next_action"


@pytest.mark.parametrize(
    "extra, param",
    [
        ({"prompt_cache_kye": "k"}, "prompt_cache_kye"),
        ({"prompt_cache_options": {"mode": "forever"}}, "prompt_cache_options.mode"),
        ({"questions": [{**QUESTIONS[0], "descripton": "typo"}]}, "questions[0].descripton"),
    ],
)
def test_an_unknown_or_misspelt_parameter_is_400_not_ignored(served, extra, param):
    """OpenAI refuses parameters it does not know (our chat route does too): a misspelt one would
    otherwise be ignored without a word (issue 53)."""
    srv, _, _ = served
    body = {"model": "gpt-6-luna", "input": INPUT, "questions": QUESTIONS, **extra}
    r = httpx.post(srv.url + "/v1/decisions", json=body, headers={"Authorization": f"Bearer {KEY}"}, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


@pytest.mark.parametrize("style", ["names", "prompt"])
def test_a_servers_own_method_answers_both_routes_and_says_so(tiny_arch, style):
    """serve --decision-style names|prompt --decision-calibrate contextual: every answer of both routes
    carries its method and its raw probabilities; GET /v1/model lists the default."""
    import dataclasses

    from mlx_slm.classifier.decision_plan import DecisionPlan
    from mlx_slm.text.decisions.methods import Method, Methods
    from mlx_slm.weights.registry import ModelRef

    path = str(tiny_arch.mlx("qwen2"))
    plan = DecisionPlan(ModelRef(path), methods=Methods(default=Method(style=style, prior="contextual")))
    plain = classifier_loader(path)
    srv = ThreadServer(Service(lambda: dataclasses.replace(plain(), decision_plan=plan), ServeOptions(max_wait_ms=5)))
    srv.start()
    try:
        oa = httpx.post(
            srv.url + "/v1/decisions", json={"model": "gpt-6-luna", "input": INPUT, "questions": QUESTIONS}, timeout=120
        ).json()
        s1 = httpx.post(
            srv.url + "/v1/systemone",
            json={"model": "jev-latest", "state": INPUT, "questions": {"team": {"type": "choice", "instructions": "?",
                  "criteria": {"billing": None, "shipping": None}}}},
            timeout=120,
        ).json()  # fmt: skip
        info = httpx.get(srv.url + "/v1/model", timeout=30).json()["decisions"]["calibration"]
    finally:
        srv.stop()
    team = oa["answers"][1]
    assert team["x_method"] == {"style": style, "permute": 1, "calibration": "contextual"}
    assert [x["value"] for x in team["x_raw_probabilities"]] == ["billing", "shipping", "true", True]
    assert sum(x["probability"] for x in team["probabilities"]) == pytest.approx(1.0)
    assert s1["answers"]["team"]["x_method"]["calibration"] == "contextual"
    assert set(s1["answers"]["team"]["x_raw_probabilities"]) == {"billing", "shipping"}
    assert info["default"] == {"style": style, "permute": 1, "calibration": "contextual"}


def test_a_prompt_style_question_over_the_context_is_a_4xx_or_a_refusal_never_a_500(tiny_arch):
    """serve --decision-style prompt: a question whose prompt alone (or an option's name) is over the
    context, or a state with it: System One's 422 tokens_exceeded naming the question, OpenAI's refusal
    of that question alone (the other answered); a state alone over it a 422 before any timing."""
    import dataclasses

    from mlx_slm.classifier.decision_plan import DecisionPlan
    from mlx_slm.text.decisions.methods import Method, Methods
    from mlx_slm.weights.registry import ModelRef

    path = str(tiny_arch.mlx("qwen2"))
    plan = DecisionPlan(ModelRef(path), methods=Methods(default=Method(style="prompt")))
    plain = classifier_loader(path)
    srv = ThreadServer(Service(lambda: dataclasses.replace(plain(), decision_plan=plan), ServeOptions(max_wait_ms=5)))
    srv.start()
    ok = {"type": "noul", "instructions": "Billing?"}
    long = {"type": "noul", "instructions": "refund " * 1100}
    named = {"type": "choice", "instructions": "Which?", "criteria": {"x " * 1100: None, "billing": None}}
    try:
        for q in (long, named):
            s1 = httpx.post(srv.url + "/v1/systemone", timeout=120,
                            json={"model": "jev-latest", "state": INPUT, "questions": {"p": q, "ok": ok}})  # fmt: skip
            assert s1.status_code == 422, s1.text
            assert s1.json()["detail"][0]["type"] == "tokens_exceeded" and "p" in s1.json()["detail"][0]["loc"]
            oa_q = [{"name": "p", **({"type": "predicate", "instructions": q["instructions"]} if q is long else
                     {"type": "choice", "instructions": "Which?", "choices": [{"value": v} for v in q["criteria"]]})},
                    {"name": "ok", "type": "predicate", "instructions": "Billing?"}]  # fmt: skip
            oa = httpx.post(srv.url + "/v1/decisions", timeout=120,
                            json={"model": "gpt-6-luna", "input": INPUT, "questions": oa_q})  # fmt: skip
            assert oa.status_code == 200, oa.text
            got = oa.json()["answers"]
            assert got[0]["type"] == "refusal" and got[1]["type"] == "predicate", got
        big = httpx.post(srv.url + "/v1/systemone", timeout=120,
                         json={"model": "jev-latest", "state": "charged " * 2200, "questions": {"ok": ok}})  # fmt: skip
        assert big.status_code == 422 and big.json()["detail"][0]["type"] == "tokens_exceeded", big.text
    finally:
        srv.stop()


def test_non_finite_answers_are_a_4xx_naming_the_question_never_nan_json(tmp_path):
    """A model whose lm_head holds NaN: both decision routes refuse the request naming the question
    (System One's 422, OpenAI's 400), never a 500 nor a NaN in the JSON."""
    import mlx.core as mx

    from mlx_slm.weights.convert import convert
    from tests.conftest import make_tiny

    out = convert(make_tiny(tmp_path / "hf", "qwen2", words=("Yes", "No")), tmp_path / "m", dtype="float32",
                  progress=None)  # fmt: skip
    w = mx.load(str(out / "model.safetensors"))
    w["lm_head.weight"] = mx.full(w["lm_head.weight"].shape, float("nan"))
    mx.save_safetensors(str(out / "model.safetensors"), w, metadata={"format": "mlx"})
    (out / "conversion.json").unlink()
    srv = ThreadServer(Service(classifier_loader(str(out)), ServeOptions(max_wait_ms=5))).start()
    try:
        body = {
            "model": "jev-latest",
            "state": "refund",
            "questions": {"team": {"type": "choice", "criteria": {"a": None, "b": None}}},
        }
        r = httpx.post(srv.url + "/v1/systemone", json=body, timeout=60)
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "questions", "team"], r.text
        assert "non-finite probability" in r.json()["detail"][0]["msg"]
        body = {"model": str(out), "input": "refund", "questions": [{"type": "predicate", "instructions": "Spam?"}]}
        r = httpx.post(srv.url + "/v1/decisions", json=body, timeout=60)
        assert r.status_code == 400 and "non-finite probability" in r.json()["error"]["message"], r.text
        assert r.json()["error"]["param"] == "questions[0]"  # the question as OpenAI's list names it
    finally:
        srv.stop()
