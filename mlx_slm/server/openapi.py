"""The OpenAPI document served at /openapi.json: every route of every wire API. A new route
adds its entry here."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..text.prompts import TRUNCATE_MODES

_STR_OR_LIST = {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}, "minItems": 1}]}
_PAIR = {"type": "array", "items": {"type": "string"}, "minItems": 2, "maxItems": 2, "description": "[text, text_pair]"}
_ITEM = {"oneOf": [{"type": "string"}, _PAIR]}
_TEI_INPUTS = {
    "oneOf": [
        {"type": "string"},
        {
            "type": "array",
            "minItems": 1,
            "items": {
                "oneOf": [{"type": "string"}, {**_PAIR, "minItems": 1, "description": "[text] or [text, text_pair]"}]
            },
        },
    ]
}
_COMMON_ERRORS = {
    "401": {"description": "missing or wrong Bearer key"},
    "413": {"description": "body or item count over the limit"},
    "422": {"description": "invalid field, empty text, prompt over the context"},
    "429": {"description": "queue full; see Retry-After"},
    "503": {"description": "loading or shutting down"},
    "504": {"description": "request timeout"},
}


def _json_body(properties: dict[str, Any], required: Sequence[str] = ()) -> dict[str, Any]:
    """An OpenAPI request body: a required JSON object with these properties."""
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        schema["required"] = list(required)
    return {"required": True, "content": {"application/json": {"schema": schema}}}


# What every route the worker answers may say beside its own statuses (`_post`).
_BUSY = {
    "429": {"description": "queue full; see Retry-After"},
    "503": {"description": "loading or shutting down"},
    "504": {"description": "request timeout"},
}
_OPENAI_AUTH = {"401": {"description": "missing or wrong Bearer key"}}
_OPENAI_SIZE = {"413": {"description": "body over the limit"}}


def _post(summary: str, required: Sequence[str], properties: dict[str, Any], responses: dict[str, Any]) -> Any:
    """An OpenAPI POST of OpenAI's or System One's routes: a Bearer key, a required JSON object
    (`required` names its required fields), the route's own responses, then `_BUSY`."""
    schema = {"type": "object", "required": list(required), "properties": properties}
    return {
        "summary": summary,
        "security": [{"bearer": []}],
        "requestBody": {"required": True, "content": {"application/json": {"schema": schema}}},
        "responses": dict(sorted({**responses, **_BUSY}.items())),
    }


_CHAT = _post(
    "OpenAI's chat completion, constrained: the most probable of guided_choice (or "
    "structured_outputs.choice), the enum value of a response_format json_schema, or the next token with "
    "max_tokens 1 (logprobs, top_logprobs <= 20). Errors: {error: {message, type, param, code}}.",
    ["messages"],
    {
        "model": {"type": "string", "description": "the served model (GET /v1/models), or absent"},
        "messages": {"type": "array", "minItems": 1, "items": {"type": "object"}},
        "guided_choice": {"type": "array", "items": {"type": "string"}, "minItems": 2},
        "structured_outputs": {"type": "object", "description": "{choice: [...]} or {json: schema}"},
        "response_format": {"type": "object", "description": "{type: json_schema, json_schema}"},
        "max_tokens": {"type": "integer", "minimum": 1},
        "logprobs": {"type": "boolean"},
        "top_logprobs": {"type": "integer", "minimum": 0, "maximum": 20},
    },
    {
        "200": {"description": "OpenAI's ChatCompletion (one choice; usage counts the prompt's tokens)"},
        "400": {"description": "a field this server cannot answer, or a bad one (error.param names it)"},
        **_OPENAI_AUTH,
        "404": {"description": "not the served model (code model_not_found)"},
        **_OPENAI_SIZE,
    },
)

_DECISIONS = _post(
    "OpenAI's Decisions API: an input (a string or messages) and 1-400 predicate / choice / score "
    "questions, answered in order with a probability per option (a refusal for a question over the context). "
    "Errors: {error: {message, type, param, code}}.",
    ["model", "input", "questions"],
    {
        "model": {"type": "string", "description": "the served name, gpt-6-luna, or an alias"},
        "input": {"description": "a string, or messages (user/system/developer text, input_json)"},
        "questions": {"type": "array", "minItems": 1, "maxItems": 400, "items": {"type": "object"}},
        "prompt_cache_key": {"type": "string", "nullable": True},
    },
    {
        "200": {"description": "OpenAI's Decision: {model, answers: [...], usage}"},
        "400": {"description": "a bad field (error.param names it), or images"},
        **_OPENAI_AUTH,
        "404": {"description": "not a name of the served model (code model_not_found)"},
        **_OPENAI_SIZE,
    },
)

_SYSTEMONE = _post(
    "System One's typed decisions (TypeSafe's Jev API): a state and named noul / choice / score "
    "questions, a probability per option for each, in one pass. Errors: 422 {detail: [{loc, msg, type}]}, "
    "others {detail: {error_type, message}}. Bodies may be zstd or gzip (Content-Encoding).",
    ["model", "state", "questions"],
    {
        "model": {"type": "string", "description": "the served name, jev-latest, or an alias"},
        "state": {"description": "a string, an object or an array"},
        "questions": {
            "type": "object",
            "minProperties": 1,
            "additionalProperties": {
                "type": "object",
                "required": ["type"],
                "properties": {
                    "type": {"type": "string", "enum": ["noul", "choice", "score"]},
                    "instructions": {"description": "a string, an object or an array"},
                    "criteria": {
                        "description": "noul: {true?, false?}; choice: {option: description|null} "
                        "(2-255); score: a list of 2-10 level descriptions"
                    },
                },
            },
        },
    },
    {
        "200": {"description": "{model, answers: {id: answer}, usage: {input_tokens, output_tokens}, x_...}"},
        "401": {"description": "missing or wrong Bearer key (authentication_error)"},
        "404": {"description": "not a name of the served model"},
        "413": {"description": "body over the limit (as sent, or decoded)"},
        "422": {"description": "a field that is not valid, or over the model's context (tokens_exceeded)"},
    },
)


_TEI_PREDICT: dict[str, Any] = {
    "summary": "text-embeddings-inference's /predict: one list of {label, score} per input, best first "
    "(a single string is answered as a list holding its one list).",
    "security": [{"bearer": []}],
    "requestBody": _json_body(
        {
            "inputs": _TEI_INPUTS,
            "raw_scores": {"type": "boolean", "description": "the model's label scores, no softmax"},
            "truncate": {"type": "boolean", "nullable": True},
            "truncation_direction": {"type": "string", "enum": ["Right", "Left"]},
            "parameters": {
                "type": "object",
                "description": "Hugging Face InferenceClient's: function_to_apply (softmax|sigmoid|none), top_k",
            },
        },
        required=["inputs"],
    ),
    "responses": {
        "200": {"description": "[[{label, score}, ...], ...]; errors are {error, error_type}"},
        **_COMMON_ERRORS,
    },
}
_VLLM_CLASSIFY: dict[str, Any] = {
    "summary": "vLLM's classification API: {model, input} -> {id, object: list, created, model, "
    "data: [{index, label, probs (the task's label order), num_classes}], usage}. "
    "POST /v1/classify with an 'input' field answers the same.",
    "security": [{"bearer": []}],
    "requestBody": _json_body(
        {
            "model": {"type": "string", "description": "any name: the server has one model"},
            "input": _STR_OR_LIST,
            "truncate_prompt_tokens": {"type": "integer", "enum": [-1], "nullable": True},
            "user": {"type": "string"},
            "priority": {"type": "integer"},
            "request_id": {"type": "string"},
        },
        required=["input"],
    ),
    "responses": {"200": {"description": "vLLM's ClassificationResponse"}, **_COMMON_ERRORS},
}

_RERANK_ERRORS = {
    **_COMMON_ERRORS,
    "400": {"description": "the model is not a reranker: start mlx-slm serve with --reranker"},
    "413": {
        "description": "body over the limit, or more documents than the items limit (--max-items-per-request, or --max-queue-items where lower)"
    },
}
_TEI_RERANK: dict[str, Any] = {
    "summary": "text-embeddings-inference's /rerank: [{index, score, text?}, ...] best first. A body with "
    "'documents' instead of 'texts' is answered in the Cohere/Jina shape, as vLLM's /rerank.",
    "security": [{"bearer": []}],
    "requestBody": _json_body(
        {
            "query": {"type": "string"},
            "texts": {"type": "array", "items": {"type": "string"}, "minItems": 1},
            "raw_scores": {"type": "boolean", "description": "the raw logit (log-odds), no sigmoid"},
            "return_text": {"type": "boolean"},
            "truncate": {"type": "boolean", "nullable": True},
            "truncation_direction": {"type": "string", "enum": ["Right", "Left"]},
        },
        required=["query", "texts"],
    ),
    "responses": {"200": {"description": "[{index, score, text?}, ...], best first"}, **_RERANK_ERRORS},
}
_COHERE_SUMMARY = (
    "{model?, query, documents: [string | {text}], top_n?, return_documents?} -> {id, model, results: "
    "[{index, relevance_score, document?: {text}}] best first, meta: {api_version, tokens}, usage: {total_tokens}}"
)
_COHERE_RERANK: dict[str, Any] = {
    "security": [{"bearer": []}],
    "requestBody": _json_body(
        {
            "model": {"type": "string", "description": "any name: the server has one model"},
            "query": {"type": "string"},
            "documents": {
                "type": "array",
                "minItems": 1,
                "items": {
                    "oneOf": [{"type": "string"}, {"type": "object", "properties": {"text": {"type": "string"}}}]
                },
            },
            "top_n": {"type": "integer", "minimum": 0, "description": "0 or absent: every document"},
            "return_documents": {"type": "boolean", "description": "default true"},
            "truncate_prompt_tokens": {"type": "integer", "enum": [-1], "nullable": True},
            "use_activation": {"type": "boolean", "description": "false: the raw logit (vLLM's)"},
            "priority": {"type": "integer", "description": "accepted and ignored"},
        },
        required=["query", "documents"],
    ),
    "responses": {"200": {"description": "the Cohere/Jina/vLLM RerankResponse"}, **_RERANK_ERRORS},
}

_TOKEN_IDS = {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1}
_EMBED_INPUT = {
    "oneOf": [
        {"type": "string"},
        {"type": "array", "items": {"type": "string"}, "minItems": 1},
        _TOKEN_IDS,
        {"type": "array", "items": _TOKEN_IDS, "minItems": 1},
    ]
}
_DIMENSIONS = {"type": "integer", "minimum": 1, "description": "keep the first N values, then normalize (Matryoshka)"}
EMBED_PATHS: dict[str, Any] = {
    "/v1/embeddings": {
        "post": {
            "summary": "OpenAI's embeddings API: {input, model?, encoding_format? (float|base64: little-endian "
            "float32), dimensions?, user?} -> {object: list, data: [{object: embedding, index, embedding}], model, "
            "usage: {prompt_tokens, total_tokens}}; the model folder's pooling and default prompt; errors in "
            "OpenAI's shape, 400 for a bad request (a model that does not embed included).",
            "security": [{"bearer": []}],
            "requestBody": _json_body(
                {
                    "input": _EMBED_INPUT,
                    "model": {"type": "string", "description": "any name: the server has one model"},
                    "encoding_format": {"type": "string", "enum": ["float", "base64"]},
                    "dimensions": _DIMENSIONS,
                    "user": {"type": "string"},
                },
                required=["input"],
            ),
            "responses": {"200": {"description": "OpenAI's CreateEmbeddingResponse"}, **_COMMON_ERRORS},
        }
    },
    "/embed": {
        "post": {
            "summary": "text-embeddings-inference's /embed: {inputs, normalize? (default true), truncate?, "
            "truncation_direction? (Right), prompt_name?, dimensions?} -> [[float, ...], ...], one per input.",
            "security": [{"bearer": []}],
            "requestBody": _json_body(
                {
                    "inputs": _EMBED_INPUT,
                    "normalize": {"type": "boolean"},
                    "truncate": {"type": "boolean", "nullable": True},
                    "truncation_direction": {"type": "string", "enum": ["Right"]},
                    "prompt_name": {"type": "string", "nullable": True},
                    "dimensions": _DIMENSIONS,
                },
                required=["inputs"],
            ),
            "responses": {
                "200": {"description": "[[float, ...], ...]; errors are {error, error_type}"},
                **_COMMON_ERRORS,
            },
        }
    },
}
EMBED_PATHS["/embeddings"] = {"post": {**EMBED_PATHS["/v1/embeddings"]["post"], "summary": "As POST /v1/embeddings."}}

OPENAPI: dict[str, Any] = {
    "openapi": "3.0.3",
    "info": {"title": "mlx-slm", "version": "1"},
    "paths": {
        "/v1/classify": {
            "post": {
                "summary": "Classify one text or a list of texts into one of the task's labels "
                "(a body with vLLM's 'input' field gets vLLM's answer, as POST /classify).",
                "security": [{"bearer": []}],
                "requestBody": _json_body(
                    {
                        "text": _ITEM,
                        "texts": {"type": "array", "items": _ITEM, "description": "texts, or [text, text_pair] pairs"},
                        "ids": {
                            "type": "array",
                            "items": {"oneOf": [{"type": "string"}, {"type": "integer"}]},
                        },
                        "labels": {"type": "array", "items": {"type": "string"}, "minItems": 2},
                        "system": {"type": "string", "nullable": True},
                        "template": {"type": "string", "description": "must contain {text}"},
                        "truncate": {"type": "string", "enum": list(TRUNCATE_MODES), "nullable": True},
                        "min_confidence": {
                            "type": "number",
                            "minimum": 0,
                            "maximum": 1,
                            "nullable": True,
                            "description": "abstain (label null, abstained true) below this probability",
                        },
                    }
                ),
                "responses": {
                    "200": {
                        "description": "results[i]: id, label, probs, raw_probs and calibration (when calibrated), "
                        "abstained, truncated, queue_ms, inference_ms (a multi-label head: labels and probs; a "
                        "one-output head: label, score and logit); scoring: the kind that ran: 'head' (the task's "
                        "learned head), 'seqcls' (the model's own score head), 'rerank', 'questions', or 'labels' "
                        "(label scoring: a task without a head, or the request's own labels or prompt); headers x-total-time, x-queue-time, x-inference-time (ms)"
                    },
                    "401": {"description": "missing or wrong Bearer key"},
                    "413": {"description": "body or item count over the limit (error.field names it)"},
                    "422": {"description": "invalid field, empty text, prompt over the context (error.field)"},
                    "429": {"description": "queue full; see Retry-After"},
                    "503": {"description": "loading or shutting down"},
                    "504": {"description": "request timeout"},
                },
            }
        },
        "/classify": {"post": _VLLM_CLASSIFY},
        "/predict": {"post": _TEI_PREDICT},
        "/": {"post": {**_TEI_PREDICT, "summary": "As POST /predict (Hugging Face's InferenceClient posts here)."}},
        "/info": {
            "get": {
                "summary": "text-embeddings-inference's /info: model_id, model_sha, model_dtype, "
                "model_type.classifier.id2label, max_input_length, max_batch_tokens, max_client_batch_size, version.",
                "security": [{"bearer": []}],
            }
        },
        "/rerank": {"post": _TEI_RERANK},
        "/v1/rerank": {"post": {**_COHERE_RERANK, "summary": "Cohere's v1 rerank (and Jina's): " + _COHERE_SUMMARY}},
        "/v2/rerank": {"post": {**_COHERE_RERANK, "summary": "Cohere's v2 rerank: " + _COHERE_SUMMARY}},
        "/v1/chat/completions": {"post": _CHAT},
        "/chat/completions": {"post": _CHAT},
        "/v1/systemone": {"post": _SYSTEMONE},
        "/v1/decisions": {"post": _DECISIONS},
        "/decisions": {"post": _DECISIONS},
        "/v1/models": {
            "get": {
                "summary": "OpenAI/vLLM model list (object, data: the one served model: id, max_model_len, labels) and "
                "System One's in the same body (models: [{name, description, release_date}], every name it answers to).",
                "security": [{"bearer": []}],
            }
        },
        "/v1/model": {"get": {"summary": "Model, weights sha256, dtype, device, default task, limits."}},
        "/health": {"get": {"summary": "200 when loaded and warmed; 503 before, and while draining."}},
        "/metrics": {"get": {"summary": "Prometheus text format."}},
        **EMBED_PATHS,
    },
    "components": {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
}
