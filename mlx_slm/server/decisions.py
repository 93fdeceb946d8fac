"""OpenAI's Decisions API: POST /v1/decisions (and /decisions), as the `openai` SDK's
`client.decisions.create` sends it and its types (`openai.types.Decision`) read the answer.

    {"model", "input": str | [messages], "questions": [{"type": "predicate"|"choice"|"score", "name"?,
     "instructions", "choices"? | "levels"?}], "prompt_cache_key"?, ...}
    -> {"model", "answers": [answer, ...], "usage": {"input_tokens", "input_tokens_details":
        {"cache_write_tokens", "cached_tokens"}, "output_tokens", "output_tokens_details":
        {"reasoning_tokens"}, "total_tokens"}}

Read by `text.decisions.openai.parse_openai`, answered through the service's `decide` path as
/v1/systemone is (the same questions machinery, so the same probabilities), each answer in
`text.decisions.answers.answer`'s OpenAI shape (with `x_method` and `x_raw_...` where a method
made it), in question order. A question that cannot be answered
(its prompt, after the state, is over the model's context) gets `{"type": "refusal", "name"}` and
the others their answers, as OpenAI's types allow; a state alone over the context refuses every
question. `prompt_cache_key` names the state in the server's bounded cache of recent states'
keys and values; `usage.input_tokens_details.cached_tokens` says how many tokens came from it.
Every usage field is an int (the SDK's `DecisionsToolRunner` checks that).

Errors are OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`: a bad request 400
(`param` the field's path, e.g. `questions[2].choices`; images: a 400 that says this server reads
text only), a wrong key 401 `invalid_api_key`, a model this server does not serve 404
`model_not_found`, 413 over the body limit.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from ..text.decisions.answers import answer
from ..text.decisions.errors import DecisionError, DecisionErrors
from ..text.decisions.openai import parse_openai
from .common import RouteContext
from .errors import HTTPError, Style, json_response

DECISION_PATHS = ("/v1/decisions", "/decisions")


def param_of(loc: tuple[Any, ...]) -> str:
    """A body location as OpenAI names a parameter: ("body", "questions", 2, "choices") ->
    "questions[2].choices"."""
    out = ""
    for x in loc:
        if x == "body" and not out:
            continue
        out += f"[{x}]" if isinstance(x, int) else (f".{x}" if out else str(x))
    return out or "body"


def by_index(loc: tuple[Any, ...], questions: Any) -> tuple[Any, ...]:
    """A location that names a question by its key (the Decider's: "refund", or "#0" unnamed) as
    OpenAI's list names it, by its index: ("body", "questions", "refund") -> ("body", "questions", 0)."""
    keys = [q.key for q in questions]
    if len(loc) >= 3 and loc[:2] == ("body", "questions") and loc[2] in keys:
        return (*loc[:2], keys.index(loc[2]), *loc[3:])
    return loc


class DecisionRoutes:
    """OpenAI's decision routes over the service."""

    def __init__(self, ctx: RouteContext):
        self.ctx = ctx

    def routes(self) -> list[Any]:
        return [self.ctx.post(p, self.decisions, Style.OPENAI) for p in DECISION_PATHS]

    async def decisions(self, request: Any, t0: float) -> Any:
        """One decision request; every error in OpenAI's shape (`Style.OPENAI`: a 422 of the
        shared checks as 400, its code by status)."""
        data = await self.ctx.admit(request)
        config = await self.ctx.decision_settings(data, "gpt-6-luna")
        try:
            req = parse_openai(data, config)
        except DecisionError as e:
            first = e.errors[0] if isinstance(e, DecisionErrors) else e
            raise HTTPError(400, first.msg, param_of(first.loc), outcome="invalid") from None
        try:
            result = await self.ctx.decide(request, t0, req)
        except DecisionError as e:
            if e.type != "tokens_exceeded":
                raise HTTPError(400, e.msg, param_of(by_index(e.loc, req.questions)), outcome="invalid") from None
            # The state alone is over the model's context: no question can be answered.
            result = SimpleNamespace(
                probabilities=(None,) * len(req.questions), input_tokens=0, cached_tokens=0, raw=(), applied=()
            )
        return json_response(self.answer(req, result))

    def answer(self, req: Any, result: Any) -> dict[str, Any]:
        """OpenAI's Decision: answers in question order, a refusal where a question had no answer."""
        raw = result.raw or (None,) * len(req.questions)
        applied = result.applied or (None,) * len(req.questions)
        answers = [
            answer(q, p, "openai", r, a) for q, p, r, a in zip(req.questions, result.probabilities, raw, applied)
        ]
        n, cached = int(result.input_tokens), int(result.cached_tokens)
        return {
            "model": self.ctx.served_name(),
            "answers": answers,
            "usage": {
                "input_tokens": n,
                "input_tokens_details": {"cache_write_tokens": 0, "cached_tokens": cached},
                "output_tokens": 0,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": n,
            },
        }
