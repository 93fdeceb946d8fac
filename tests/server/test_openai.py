"""OpenAI's chat completions (`server/openai.py`), constrained, through OpenAI's own Python SDK against the service
on 127.0.0.1: guided_choice (extra_body), structured_outputs choice, response_format
json_schema, max_tokens 1 with logprobs; each answer and probability equal to `classify`'s for
the same prompt and labels, the next token's log-probabilities equal to Transformers'; every
bad request a 400 (`openai.BadRequestError`) in OpenAI's error shape naming the field."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest

httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

from mlx_slm.classifier.classifier import Classifier  # noqa: E402
from mlx_slm.engine.engine import Engine  # noqa: E402
from mlx_slm.kinds import chat_spec  # noqa: E402
from mlx_slm.server import ServeOptions, Service, classifier_loader  # noqa: E402
from mlx_slm.text.chat import read_request, token_bytes  # noqa: E402
from tests.server.test_app import ThreadServer  # noqa: E402

SYSTEM = "You sort support tickets."
TEXT = "My card was charged twice for the same invoice."
WORDS = ["billing", "technical", "account"]  # several tokens each: scored whole through the trie
DIGITS = ["1", "2", "3"]  # one token each: first-token scoring
MSGS = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TEXT}]


@pytest.fixture(scope="module")
def served(tiny_arch):
    path = tiny_arch.mlx("qwen2")
    srv = ThreadServer(Service(classifier_loader(str(path)), ServeOptions(max_wait_ms=5, api_key="k"))).start()
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="k", timeout=60, max_retries=0)
    yield srv, client, str(path), Engine.load(str(path))
    srv.stop()


def _classify(engine, labels, system, text, examples=()):
    """`classify`'s prediction for the same prompt: the system message, the text as the whole user turn."""
    clf = Classifier(engine, labels, system, "{text}", examples=examples)
    return clf.classify([text])[0], clf


def _metric(srv, name):
    text = httpx.get(srv.url + "/metrics").text
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " "))


# ----------------------------------------------------------------------------- the three forms


@pytest.mark.parametrize("choices", [WORDS, DIGITS], ids=["trie", "first-token"])
def test_guided_choice_is_classify(served, choices):
    """The answer, its probabilities and its tokens are `classify`'s for the same prompt and labels."""
    _, client, model, engine = served
    want, clf = _classify(engine, choices, SYSTEM, TEXT)
    assert clf.mode == ("sequence" if choices is WORDS else "first-token")
    r = client.chat.completions.create(
        model=model, messages=MSGS, extra_body={"guided_choice": choices}, logprobs=True, temperature=0
    )
    (c,) = r.choices
    assert c.message.content == want.label and c.finish_reason == "stop" and c.message.role == "assistant"
    k = choices.index(want.label)
    assert r.usage.prompt_tokens == want.n_tokens
    assert r.usage.completion_tokens == len(clf.labelset.token_ids[k])
    assert r.usage.total_tokens == want.n_tokens + r.usage.completion_tokens
    (first,) = c.logprobs.content
    assert first.token == want.label and first.bytes == list(want.label.encode())
    assert math.exp(first.logprob) == pytest.approx(want.probs[want.label], rel=1e-9)
    # every choice, best first, each with the log of classify's probability
    assert [t.token for t in first.top_logprobs] == sorted(choices, key=lambda x: -want.probs[x])
    for t in first.top_logprobs:
        assert t.logprob == pytest.approx(math.log(want.probs[t.token]), rel=1e-9, abs=1e-12)
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-") and r.model == model


def test_structured_outputs_choice_and_our_route_agree(served):
    srv, client, model, engine = served
    want, _ = _classify(engine, WORDS, SYSTEM, TEXT)
    r = client.chat.completions.create(
        model=model, messages=MSGS, extra_body={"structured_outputs": {"choice": WORDS}}, logprobs=True, top_logprobs=2
    )
    assert r.choices[0].message.content == want.label
    assert [t.token for t in r.choices[0].logprobs.content[0].top_logprobs] == sorted(
        WORDS, key=lambda x: -want.probs[x]
    )[:2]
    # our /v1/classify with the same labels, system message and a {text} template: the same probabilities
    ours = httpx.post(
        srv.url + "/v1/classify",
        json={"text": TEXT, "labels": WORDS, "system": SYSTEM, "template": "{text}"},
        headers={"Authorization": "Bearer k"},
    ).json()["results"][0]
    assert ours["label"] == want.label
    assert all(ours["probs"][lab] == pytest.approx(want.probs[lab], abs=1e-6) for lab in WORDS)
    # the short path (/chat/completions) answers the same
    alt = httpx.post(
        srv.url + "/chat/completions",
        json={"messages": MSGS, "guided_choice": WORDS},
        headers={"Authorization": "Bearer k"},
    ).json()
    assert alt["choices"][0]["message"]["content"] == want.label


def _schema(values, **more):
    return {
        "type": "object",
        "properties": {**more, "category": {"type": "string", "enum": values}},
        "required": [*more, "category"],
        "additionalProperties": False,
    }


@pytest.mark.parametrize(
    "schema, shape",
    [
        (_schema(WORDS), lambda v: {"category": v}),
        ({"type": "string", "enum": WORDS}, lambda v: v),
        (_schema(WORDS, kind={"type": "string", "const": "ticket"}), lambda v: {"kind": "ticket", "category": v}),
        (  # an Enum class as Pydantic writes it: a $ref into $defs
            {
                "$defs": {"Category": {"enum": WORDS, "title": "Category", "type": "string"}},
                "properties": {"category": {"$ref": "#/$defs/Category"}},
                "required": ["category"],
                "title": "Ticket",
                "type": "object",
            },
            lambda v: {"category": v},
        ),
    ],
    ids=["object", "top-level", "with-const", "pydantic-ref"],
)
def test_response_format_json_schema(served, schema, shape):
    """The JSON the schema implies, holding the value guided_choice chooses among the enum's values."""
    _, client, model, engine = served
    want, _ = _classify(engine, WORDS, SYSTEM, TEXT)
    r = client.chat.completions.create(
        model=model,
        messages=MSGS,
        response_format={"type": "json_schema", "json_schema": {"name": "ticket", "schema": schema, "strict": True}},
        logprobs=True,
    )
    content = r.choices[0].message.content
    assert json.loads(content) == shape(want.label)
    assert content == json.dumps(shape(want.label))  # as json.dumps writes it: {"category": "billing"}
    assert r.choices[0].logprobs.content[0].token == want.label  # the value, scored as guided_choice scores it


def test_sdk_parse_into_a_pydantic_model(served):
    """OpenAI's SDK, unmodified: `parse` with a Pydantic model (a Literal, or an Enum as a $ref)
    sends its strict JSON schema and reads the answer back into the model."""
    import enum
    from typing import Literal

    from pydantic import BaseModel

    _, client, model, engine = served
    want, _ = _classify(engine, WORDS, SYSTEM, TEXT)

    class Ticket(BaseModel):
        category: Literal["billing", "technical", "account"]

    Category = enum.Enum("Category", {w: w for w in WORDS}, type=str)

    class Routed(BaseModel):
        category: Category

    for schema in (Ticket, Routed):
        r = client.chat.completions.parse(model=model, messages=MSGS, response_format=schema)
        assert r.choices[0].message.parsed == schema(category=want.label)
    # vLLM's guided_json and structured_outputs.json (a schema as JSON text too) answer the same
    for extra in ({"guided_json": _schema(WORDS)}, {"structured_outputs": {"json": json.dumps(_schema(WORDS))}}):
        r = client.chat.completions.create(model=model, messages=MSGS, extra_body=extra)
        assert json.loads(r.choices[0].message.content) == {"category": want.label}


def test_the_docs_block_runs_as_written(served, capsys):
    """docs/serving.md's OpenAI block, run as written against the service (the tiny model's
    path for the built-in name, this server's address and key)."""
    import re
    from pathlib import Path

    srv, _, model, _ = served
    page = (Path(__file__).parents[2] / "docs" / "serving.md").read_text(encoding="utf-8")
    (block,) = [b for b in re.findall(r"```python\n(.*?)```", page, flags=re.S) if "openai.OpenAI(" in b]
    code = block.replace('"qwen2.5-coder-0.5b"', repr(model)).replace("http://localhost:8080/v1", srv.url + "/v1")
    scope: dict = {"__name__": "__docs__"}
    code = code.replace('api_key="unused"', 'api_key="k"')
    exec(compile(code, "docs/serving.md", "exec", dont_inherit=True), scope)  # as a page is read: no __future__ of ours
    assert scope["r"].choices[0].finish_reason in ("length", "stop") and len(scope["messages"]) == 2


def test_next_token_with_and_without_logprobs(served):
    _, client, model, engine = served
    r = client.chat.completions.create(model=model, messages=MSGS, max_tokens=1)
    c = r.choices[0]
    assert c.logprobs is None and c.finish_reason == "length" and r.usage.completion_tokens == 1
    clf = Classifier(engine, system=None, template="{text}", kind=chat_spec(()))
    (item,) = clf.prepare([read_request({"messages": MSGS, "max_tokens": 1}).conversation])
    assert r.usage.prompt_tokens == len(item.ids)
    r = client.chat.completions.create(model=model, messages=MSGS, max_completion_tokens=1, logprobs=True)
    assert r.choices[0].logprobs.content[0].top_logprobs == []
    r = client.chat.completions.create(model=model, messages=MSGS, max_tokens=1, logprobs=True, top_logprobs=20)
    first = r.choices[0].logprobs.content[0]
    tops = first.top_logprobs
    assert len(tops) == 20 and first.token == tops[0].token and first.logprob == tops[0].logprob
    assert [t.logprob for t in tops] == sorted((t.logprob for t in tops), reverse=True)
    assert 0 < sum(math.exp(t.logprob) for t in tops) <= 1 + 1e-9
    assert c.message.content == first.token  # greedy, the same answer each time


def test_next_token_equals_transformers(served, tiny_arch):
    """The top 20 of the whole vocabulary: the prompt's ids are Transformers' own chat-template
    encoding, the log-probabilities its float32 logits' log-softmax, within 1e-5."""
    from transformers import AutoTokenizer

    from mlx_slm.parity.reference import Reference

    _, client, model, _ = served
    hf = tiny_arch.hf("qwen2")
    ref, tok = Reference(hf, threads=1), AutoTokenizer.from_pretrained(str(hf))
    convs = [
        MSGS,
        [{"role": "user", "content": "The app crashes"}],
        [*MSGS, {"role": "assistant", "content": "billing"}, {"role": "user", "content": "And a refund?"}],
    ]
    for msgs in convs:
        r = client.chat.completions.create(model=model, messages=msgs, max_tokens=1, logprobs=True, top_logprobs=20)
        ids = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)["input_ids"]
        assert r.usage.prompt_tokens == len(ids)
        logits = ref.last_logits(ids).astype(np.float64)
        lp = logits - logits.max() - np.log(np.exp(logits - logits.max()).sum())
        order = np.argsort(-lp, kind="stable")[:20]
        got = r.choices[0].logprobs.content[0]
        assert got.token == tok.decode([int(order[0])])
        assert got.bytes == list(token_bytes(tok, int(order[0])))
        for t, i in zip(got.top_logprobs, order):
            assert t.logprob == pytest.approx(lp[i], abs=1e-5)
        assert [t.token for t in got.top_logprobs] == [tok.decode([int(i)]) for i in order]


def test_multi_turn_history_as_few_shot_classify(served):
    """A history of user/assistant turns renders as classify's few-shot examples do: the same answer."""
    _, client, model, engine = served
    history = [{"role": "user", "content": "The app crashes"}, {"role": "assistant", "content": "technical"}]
    msgs = [MSGS[0], *history, MSGS[1]]
    want, _ = _classify(engine, WORDS, SYSTEM, TEXT, examples=[("The app crashes", "technical")])
    r = client.chat.completions.create(model=model, messages=msgs, extra_body={"guided_choice": WORDS}, logprobs=True)
    assert r.choices[0].message.content == want.label
    for t in r.choices[0].logprobs.content[0].top_logprobs:
        assert math.exp(t.logprob) == pytest.approx(want.probs[t.token], rel=1e-9)
    # content parts and "developer" (OpenAI's newer system role) read as the plain form
    parts = [
        {"role": "developer", "content": [{"type": "text", "text": SYSTEM}]},
        *history,
        {"role": "user", "content": [{"type": "text", "text": TEXT}], "name": "ann"},
    ]
    r2 = client.chat.completions.create(model=model, messages=parts, extra_body={"guided_choice": WORDS}, logprobs=True)
    assert r2.choices[0].logprobs.content[0].logprob == r.choices[0].logprobs.content[0].logprob


def test_a_shared_system_message_runs_once(served):
    """The rendered prompt's head (system message and history) is the engine's cached prefix:
    the second request with the same system message runs only its own turn."""
    srv, client, model, _ = served
    system = "You are a careful assistant that sorts tickets for the billing team, the app team and accounts."
    saved = _metric(srv, "mlx_slm_prefix_cache_saved_tokens_total")
    hits = _metric(srv, "mlx_slm_prefix_cache_hits_total")
    for text in ("first ticket", "second ticket about a refund"):
        client.chat.completions.create(
            model=model,
            messages=[{"role": "system", "content": system}, {"role": "user", "content": text}],
            extra_body={"guided_choice": WORDS},
        )
    assert _metric(srv, "mlx_slm_prefix_cache_hits_total") == hits + 2
    head = len(Engine.load(model).tokenizer(f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n")["input_ids"])
    assert _metric(srv, "mlx_slm_prefix_cache_saved_tokens_total") - saved >= head - 2


@pytest.mark.parametrize("choices", [WORDS, DIGITS, ()], ids=["trie", "first-token", "next-token"])
def test_one_batch_of_several_heads_answers_as_each_alone(served, choices):
    """Conversations with different system messages share one batch, each row after its own
    cached head (a `StackedPrefix`), and answer exactly as each alone."""
    _, _, _, engine = served
    systems = [SYSTEM, "Be brief.", "You route messages to the billing, app and account teams.", SYSTEM]
    texts = [TEXT, "The app crashes", "Change my email", "refund please"]
    convs = [
        read_request(
            {"messages": [{"role": "system", "content": s}, {"role": "user", "content": t}], "max_tokens": 1}
        ).conversation
        for s, t in zip(systems, texts)
    ]
    clf = Classifier(engine, system=None, template="{text}", kind=chat_spec(tuple(choices)))
    # one batch whatever its padding (the plan's padding bound would cut these short rows apart)
    clf.batching = dataclasses.replace(clf.batching, max_padding=None)
    run = clf.run_items(clf.prepare(convs))
    together = list(run)
    assert run.stats.batches == 1 and len({it.prefix for it in clf.prepare(convs)}) == 3
    for conv, got in zip(convs, together):
        (alone,) = clf.run_items(clf.prepare([conv]))
        assert got.label == alone.label
        if choices:
            assert all(got.probs[c] == pytest.approx(alone.probs[c], abs=1e-6) for c in choices)
        else:
            assert [t[0] for t in got.tokens] == [t[0] for t in alone.tokens]
            assert all(a[2] == pytest.approx(b[2], abs=1e-5) for a, b in zip(got.tokens, alone.tokens))


# ----------------------------------------------------------------------------- bad input


BAD = [
    (dict(extra_body={"guided_choice": []}), "guided_choice", "at least two"),
    (dict(extra_body={"guided_choice": ["a", "b", "a"]}), "guided_choice[2]", "repeats"),
    (dict(extra_body={"guided_choice": ["a", 3]}), "guided_choice[1]", "strings"),
    (dict(extra_body={"structured_outputs": {"regex": "a|b"}}), "structured_outputs.regex", "free generation"),
    (dict(max_tokens=1, logprobs=True, top_logprobs=21), "top_logprobs", "0 to 20"),
    (dict(max_tokens=1, logprobs=True, top_logprobs=-1), "top_logprobs", "0 to 20"),
    (dict(max_tokens=1, top_logprobs=3), "logprobs", "needs 'logprobs'"),
    (dict(max_tokens=0), "max_tokens", "1 or more"),
    (dict(max_tokens=2), "max_tokens", "guided_choice"),
    (dict(), "max_tokens", 'max_tokens": 1'),
    (dict(max_tokens=1, n=2), "n", "must be 1"),
    (dict(extra_body={"guided_choice": WORDS}, stream=True), "stream", "stream"),
    (
        dict(max_tokens=1, tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}]),
        "tools",
        "tools",
    ),
    (dict(response_format={"type": "json_object"}), "response_format.type", "json_schema"),
    (
        dict(
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "t", "schema": _schema(WORDS, other={"type": "string"})},
            }
        ),
        "response_format.json_schema.schema.properties.other",
        "2 free values",
    ),
    (
        dict(
            response_format={
                "type": "json_schema",
                "json_schema": {
                    "name": "t",
                    "schema": {
                        "type": "object",
                        "properties": {"category": {"type": "string"}},
                        "required": ["category"],
                    },
                },
            }
        ),
        "response_format.json_schema.schema.properties.category",
        "no enum",
    ),
    (
        dict(response_format={"type": "json_schema", "json_schema": {"name": "t", "schema": _schema([1, 2])}}),
        "response_format.json_schema.schema.properties.category.enum",
        "must be strings",
    ),
    (
        dict(
            max_tokens=1,
            extra_body={"guided_choice": WORDS},
            response_format={"type": "json_schema", "json_schema": {"name": "t", "schema": _schema(WORDS)}},
        ),
        "response_format",
        "give one of",
    ),
]


@pytest.mark.parametrize("kw, param, says", BAD, ids=[b[1] + "-" + str(i) for i, b in enumerate(BAD)])
def test_bad_requests_are_400_naming_the_field(served, kw, param, says):
    _, client, model, _ = served
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model, messages=MSGS, **kw)
    assert e.value.status_code == 400
    assert e.value.body["param"] == param and says in e.value.body["message"], e.value.body
    assert set(e.value.body) == {"message", "type", "param", "code"} and e.value.body["type"] == "invalid_request_error"


BAD_MESSAGES = [
    ([], "messages", "non-empty list"),
    ("hello", "messages", "non-empty list"),
    ([{"content": "hi"}], "messages[0].role", "must be one of"),
    ([{"role": "robot", "content": "hi"}], "messages[0].role", "must be one of"),
    (
        [{"role": "tool", "content": "42", "tool_call_id": "x"}, {"role": "user", "content": "hi"}],
        "messages[0].role",
        "tool",
    ),
    ([{"role": "user", "content": 42}], "messages[0].content", "string or a list of text parts"),
    ([{"role": "user", "content": None}], "messages[0].content", "string or a list of text parts"),
    (
        [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/a.png"}}]}],
        "messages[0].content[0]",
        "an image",
    ),
    (
        [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}],
        "messages[1].role",
        "last message",
    ),
    ([{"role": "user", "content": "hi", "colour": "red"}], "messages[0].colour", "unknown field"),
]


@pytest.mark.parametrize(
    "messages, param, says", BAD_MESSAGES, ids=[b[1] + "-" + str(i) for i, b in enumerate(BAD_MESSAGES)]
)
def test_bad_messages_are_400_naming_the_message(served, messages, param, says):
    srv, _, _, _ = served
    r = httpx.post(
        srv.url + "/v1/chat/completions",
        json={"model": None, "messages": messages, "guided_choice": WORDS},
        headers={"Authorization": "Bearer k"},
    )
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and says in err["message"], err


def test_body_model_auth_and_context_errors(served):
    srv, client, model, _ = served
    auth = {"Authorization": "Bearer k"}
    r = httpx.post(srv.url + "/v1/chat/completions", content=b"{not json", headers=auth)
    assert r.status_code == 400 and r.json()["error"]["param"] == "body" and set(r.json()["error"]) == {
        "message", "type", "param", "code"}  # fmt: skip
    r = httpx.post(srv.url + "/v1/chat/completions", json=[1, 2], headers=auth)
    assert r.status_code == 400 and "JSON object" in r.json()["error"]["message"]
    with pytest.raises(openai.NotFoundError) as e:  # vLLM's rule: another model's name is a 404
        client.chat.completions.create(model="gpt-4o-mini", messages=MSGS, max_tokens=1)
    assert e.value.body["code"] == "model_not_found" and model in e.value.body["message"]
    with pytest.raises(openai.AuthenticationError) as e:
        openai.OpenAI(base_url=srv.url + "/v1", api_key="wrong", max_retries=0).chat.completions.create(
            model=model, messages=MSGS, max_tokens=1
        )
    assert e.value.body["code"] == "invalid_api_key"
    long = [{"role": "user", "content": "refund " * 2000}]  # over the tiny model's 1,024 tokens
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model, messages=long, max_tokens=1)
    assert e.value.body["param"] == "messages" and "over the model's context of 1024" in e.value.body["message"]
    # the model list names the model to ask for; the OpenAPI document lists the routes
    assert [m.id for m in client.models.list()] == [model]
    paths = httpx.get(srv.url + "/openapi.json").json()["paths"]
    assert "/v1/chat/completions" in paths and "/chat/completions" in paths
    r = httpx.get(srv.url + "/v1/chat/completions", headers=auth)
    assert r.status_code == 405 and set(r.json()["error"]) == {"message", "type", "param", "code"}


def test_a_sequence_classifier_says_what_it_answers(tiny_arch):
    path = tiny_arch.seqcls_mlx("qwen2", 3)
    srv = ThreadServer(Service(classifier_loader(str(path)), ServeOptions(max_wait_ms=5))).start()
    try:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0)
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model=str(path), messages=MSGS, extra_body={"guided_choice": WORDS})
        assert "/v1/classify" in e.value.body["message"]
    finally:
        srv.stop()


def test_token_bytes_keep_part_of_a_character(served):
    _, _, _, engine = served
    tok = engine.tokenizer
    ids = tok("é€", add_special_tokens=False)["input_ids"]
    assert b"".join(token_bytes(tok, i) for i in ids) == "é€".encode()
