"""OpenAI's chat completions, constrained: POST /v1/chat/completions (and /chat/completions).

OpenAI's request body, read by `chat.read_request`; the answer is one of (never free text):

    guided_choice / structured_outputs.choice   the most probable choice (content: the choice)
    response_format json_schema (one enum)      the most probable enum value (content: the JSON
                                                the schema implies, e.g. {"category": "billing"})
    neither, with max_tokens 1                  the greedy next token, and with logprobs its
                                                top_logprobs over the whole vocabulary

Each request is one item of the service's queue (a chat task per choice set, `TaskSpec.chat`;
the kinds of `kinds/chat.py`), so chat requests share micro-batches, and a repeated system
message or history is served from the prefix cache. `logprobs` with a choice is the
whole-choice form: `content[0]` holds the chosen choice as its `token` with its
log-probability among the choices, `top_logprobs` the choices best first, each with its own
(the log of `classify`'s `probs` for the same prompt and labels). Errors are OpenAI's shape,
`{"error": {"message", "type", "param", "code"}}`, a bad request 400 (OpenAI's SDK raises
`BadRequestError`), an unknown model 404 `model_not_found` (as vLLM: a request without a model
is the served one's).
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from ..service import Answer, ServiceError, TaskSpec
from ..text.chat import ChatError, ChatRequest, read_request
from ..text.labels import log_softmax
from .common import RouteContext
from .errors import HTTPError, Style, json_response

CHAT_PATHS = ("/v1/chat/completions", "/chat/completions")


class OpenAIRoutes:
    """OpenAI's chat-completion routes over the service."""

    def __init__(self, ctx: RouteContext):
        self.ctx = ctx

    def routes(self) -> list[Any]:
        return [self.ctx.post(path, self.chat, Style.OPENAI) for path in CHAT_PATHS]

    async def chat(self, request: Any, t0: float) -> Any:
        """One chat completion; every error in OpenAI's shape (`Style.OPENAI`: a 422 of the
        shared checks as OpenAI's 400, its code by status)."""
        data = await self.ctx.admit(request)
        try:
            req = read_request(data)
        except ChatError as e:
            raise HTTPError(400, str(e), e.field, outcome="invalid") from None
        self._check_model(req.model)
        task = TaskSpec(chat=req.choices or ())
        try:
            ans = await self.ctx.compute(request, t0, [req.conversation], task, ["messages"], "messages", "")
        except ServiceError as e:
            if e.field == "labels":  # the choices, as this request named them
                raise type(e)(e.message, req.source, e.retry_after) from None
            raise
        return json_response(self.completion(req, ans))

    def _check_model(self, model: str | None) -> None:
        """vLLM's rule: no model is the served one; another is one of the names every route that
        checks `model` answers to (`RouteContext.check_model`), else a 404 naming the served one."""
        if model is not None:
            self.ctx.check_model(model)

    def completion(self, req: ChatRequest, ans: Answer) -> dict[str, Any]:
        """OpenAI's ChatCompletion for the request's one answer."""
        p = ans.predictions[0]
        if req.choices is not None:
            content, logprobs, used, finish = _choice_answer(req, ans)
        else:
            content, logprobs, used, finish = _token_answer(req, ans)
        ld = self.ctx.service.loaded
        sha = ld.weights_sha256 if ld is not None else None
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.ctx.served_name(),
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": content, "refusal": None},
                    "logprobs": logprobs,
                    "finish_reason": finish,
                }
            ],
            "usage": {"prompt_tokens": p.n_tokens, "completion_tokens": used, "total_tokens": p.n_tokens + used},
            "system_fingerprint": f"mlx-slm-{sha[:12]}" if sha else None,
        }


def _entry(token: str, logprob: float, raw: bytes | None = None) -> dict[str, Any]:
    return {"token": token, "logprob": logprob, "bytes": list(raw if raw is not None else token.encode("utf-8"))}


def _choice_answer(req: ChatRequest, ans: Answer) -> tuple[str, dict[str, Any] | None, int, str]:
    """(content, logprobs, completion tokens, finish reason) of a choice: the most probable, its
    tokens the choice's own (as the label set tokenizes it after the prompt)."""
    p, clf = ans.predictions[0], ans.classifier
    labels = list(clf.labels)
    lps = log_softmax([p.scores[lab] for lab in labels])  # the log of classify's probs
    k = labels.index(p.label)
    content = req.json.content(p.label) if req.json is not None else p.label
    logprobs = None
    if req.logprobs:
        order = sorted(range(len(labels)), key=lambda i: (-lps[i], i))
        n = len(order) if req.top_logprobs is None else req.top_logprobs
        top = [_entry(labels[i], float(lps[i])) for i in order[:n]]
        logprobs = {"content": [{**_entry(p.label, float(lps[k])), "top_logprobs": top}], "refusal": None}
    return content, logprobs, len(clf.labelset.token_ids[k]), "stop"


def _token_answer(req: ChatRequest, ans: Answer) -> tuple[str, dict[str, Any] | None, int, str]:
    """(content, logprobs, completion tokens, finish reason) of the next token: greedy; "stop"
    when it is the end-of-sequence token (its content empty), else "length" (max_tokens 1)."""
    p = ans.predictions[0]
    assert p.tokens is not None
    tid, text, lp, raw = p.tokens[0]
    logprobs = None
    if req.logprobs:
        top = [_entry(t, lp_, b) for _, t, lp_, b in p.tokens[: req.top_logprobs or 0]]
        logprobs = {"content": [{**_entry(text, lp, raw), "top_logprobs": top}], "refusal": None}
    finish = "stop" if tid in ans.classifier.kind.eos_ids else "length"
    return p.label or "", logprobs, 1, finish
