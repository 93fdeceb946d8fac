"""OpenAI's chat-completion request read without HTTP and without a model (`text/chat.py`): a JSON
schema's one free value, and any JSON body or schema a request or a `ChatError` naming a field."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("starlette")


pytest.importorskip("uvicorn")


from mlx_slm.text.chat import ChatError, enum_answer, read_request  # noqa: E402

WORDS = ["billing", "technical", "account"]  # several tokens each: scored whole through the trie


def _schema(values, **more):
    return {
        "type": "object",
        "properties": {**more, "category": {"type": "string", "enum": values}},
        "required": [*more, "category"],
        "additionalProperties": False,
    }


# ----------------------------------------------------------------------------- the request, read alone


def test_enum_answer_reads_the_one_free_value():
    js = enum_answer(_schema(WORDS, kind={"const": 3}), "s")
    assert (
        js.choices == tuple(WORDS)
        and js.key == "category"
        and js.content("billing") == '{"kind": 3, "category": "billing"}'
    )
    assert enum_answer({"enum": ["é", "b"]}, "s").content("é") == '"é"'
    opt = _schema(WORDS)
    opt["required"] = []
    with pytest.raises(ChatError, match="not required") as e:
        enum_answer(opt, "s")
    assert e.value.field == "s.required"
    for schema, field in [
        ({"const": "a"}, "s"),
        ({"type": "object", "properties": {"a": {"const": "x"}}, "required": ["a"]}, "s"),
        ({"$ref": "#/elsewhere/X"}, "s"),
        ({"type": "array", "items": {"enum": WORDS}}, "s"),
    ]:
        with pytest.raises(ChatError) as e:
            enum_answer(schema, "s")
        assert e.value.field == field


def test_any_json_body_is_a_request_or_a_chat_error():
    """Whatever JSON a client sends, reading it gives a request or a `ChatError` naming a field,
    never another exception (a 500); shapes near the real ones included."""
    import os

    pytest.importorskip("hypothesis")
    from hypothesis import given, settings
    from hypothesis import strategies as st

    leaf = st.none() | st.booleans() | st.integers(-3, 30) | st.floats(allow_nan=True) | st.text(max_size=6)
    anything = st.recursive(
        leaf, lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4)
    )
    keys = st.sampled_from(
        ["messages", "guided_choice", "structured_outputs", "response_format", "max_tokens", "logprobs",
         "top_logprobs", "n", "stream", "model", "tools", "guided_json", "tool_choice", "modalities"]
    )  # fmt: skip
    message = st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "system", "assistant", "tool", 3]), "content": anything}
    )
    body = st.dictionaries(keys, anything | st.lists(message, max_size=3) | st.lists(st.text(max_size=4)), max_size=6)

    @settings(max_examples=int(os.environ.get("MLX_SLM_FUZZ_EXAMPLES", "100")), deadline=None)
    @given(body | anything)
    def check(data):
        try:
            req = read_request(data)
        except ChatError as e:
            assert isinstance(e.field, str) and str(e)
            return
        if req.json is not None:
            for c in req.choices:
                req.json.content(c).encode("utf-8")

    check()


def test_any_json_schema_is_an_answer_or_a_chat_error():
    """Hostile round seven: `required` holding a list or an object raised TypeError (a 500).
    A valid schema with any one of its parts (`type`, `enum`, `const`, `properties`, `required`,
    `$ref`, `$defs`, or one entry of them) replaced by any JSON value gives an answer or a
    `ChatError` naming a field, never another exception."""
    import copy
    import os

    pytest.importorskip("hypothesis")
    from hypothesis import given, settings
    from hypothesis import strategies as st

    leaf = st.none() | st.booleans() | st.integers(-2, 3) | st.floats() | st.text(max_size=4)
    leaf = leaf | st.sampled_from(["a", "category", "object", "string", "#/$defs/C"])
    anything = st.recursive(
        leaf, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=3), c, max_size=3)
    )
    obj = {
        "type": "object",
        "properties": {"category": {"type": "string", "enum": ["a", "b"]}, "kind": {"const": "x"}},
        "required": ["category", "kind"],
    }
    ref = {"$ref": "#/$defs/C", "$defs": {"C": {"type": "string", "enum": ["a", "b"]}}}
    paths = [
        (obj, p)
        for p in [("type",), ("properties",), ("required",), ("required", 0), ("required", 1), ("properties", "category"),
                  ("properties", "category", "enum"), ("properties", "category", "enum", 1),
                  ("properties", "category", "type"), ("properties", "kind"), ("properties", "kind", "const"),
                  ("properties", "category", "$ref"), ("extra",)]
    ] + [(ref, p) for p in [("$ref",), ("$defs",), ("$defs", "C"), ("$defs", "C", "enum"), ("$defs", "C", "type")]]  # fmt: skip

    @settings(max_examples=int(os.environ.get("MLX_SLM_FUZZ_EXAMPLES", "100")), deadline=None)
    @given(st.sampled_from(paths), anything, st.sampled_from(["response_format", "guided_json", "structured_outputs"]))
    def check(where_what, value, field):
        base, path = where_what
        sch = copy.deepcopy(base)
        node = sch
        for k in path[:-1]:
            node = node[k]
        node[path[-1]] = value
        body = {"messages": [{"role": "user", "content": "x"}]}
        if field == "response_format":
            body[field] = {"type": "json_schema", "json_schema": {"name": "x", "schema": sch}}
        elif field == "guided_json":
            body[field] = sch
        else:
            body[field] = {"json": sch}
        try:
            req = read_request(body)
        except ChatError as e:
            assert isinstance(e.field, str) and str(e)
            return
        assert req.choices and len(req.choices) >= 2
        for c in req.choices:
            json.loads(req.json.content(c))

    check()
