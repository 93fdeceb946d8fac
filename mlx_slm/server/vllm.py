"""vLLM's classification API: POST /classify (and /v1/classify with vLLM's `input` field,
which `ours.py` hands here) and GET /v1/models; errors are ours with OpenAI's `type`,
`param` and `code`."""

from __future__ import annotations

import time
import uuid
from typing import Any

from ..service import ServeOptions, TaskSpec
from .checks import check_fields, check_name, check_texts
from .common import RouteContext
from .errors import HTTPError, Style, json_response

VLLM_FIELDS = ("model", "input", "truncate_prompt_tokens", "user", "priority", "request_id")


def check_vllm(data: Any, opts: ServeOptions) -> tuple[list[str], bool, TaskSpec]:
    """vLLM's classification body: {"model", "input": str | [str], "truncate_prompt_tokens"?}
    (`user`, `priority`, `request_id` are accepted and ignored)."""
    check_fields(data, VLLM_FIELDS, "input")
    check_name(data, "model", what=" (any name: the server has one model)")
    texts, single = check_texts(data["input"], "input", opts)
    tpt = data.get("truncate_prompt_tokens")
    if tpt is not None:
        if isinstance(tpt, bool) or not isinstance(tpt, int) or tpt != -1:
            raise HTTPError(
                422,
                "'truncate_prompt_tokens' must be -1 (truncate to the model's context, keeping the end as vLLM "
                "does) or null; a token count is not supported",
                "truncate_prompt_tokens",
            )
    return texts, single, TaskSpec(truncate=None if tpt is None else "tail")


class VLLMRoutes:
    """vLLM's routes over the service."""

    def __init__(self, ctx: RouteContext):
        self.ctx = ctx

    def routes(self) -> list[Any]:
        return [
            self.ctx.post("/classify", self.classify, Style.VLLM),
            self.ctx.get("/v1/models", self.models, Style.VLLM),
        ]

    async def classify(self, request: Any, t0: float) -> Any:
        return await self.answer(request, t0, await self.ctx.admit(request))

    async def answer(self, request: Any, t0: float, data: Any) -> Any:
        """vLLM's classification API: `{"model", "input": str | [str]}` -> `{"id", "object": "list",
        "created", "model", "data": [{"index", "label", "probs", "num_classes"}], "usage"}`; `probs`
        in the task's label order. `model` is accepted as any name (one model per server) and the
        answer names the served one."""
        self.ctx.one_question("vLLM's /classify", "input")
        texts, single, task = check_vllm(data, self.ctx.opts)
        names = ["input"] if single else [f"input[{i}]" for i in range(len(texts))]
        ans = await self.ctx.compute(request, t0, texts, task, names, "input", '"truncate_prompt_tokens": -1')
        labels = list(ans.classifier.labels)
        rows = []
        for i, p in enumerate(ans.predictions):
            row: dict[str, Any] = {
                "index": i,
                # a multi-label head's answer is a list (`labels`): vLLM's label is the most probable one
                "label": p.label if p.labels is None else max(labels, key=lambda lab: p.probs[lab]),
                "probs": [float(p.probs[lab]) for lab in labels],
                "num_classes": len(labels),
            }
            if p.abstained:
                row["abstained"] = True
            rows.append(row)
        n = sum(p.n_tokens for p in ans.predictions)
        return json_response(
            {
                "id": f"classify-{uuid.uuid4().hex}",
                "object": "list",
                "created": int(time.time()),
                "model": self.ctx.served_name(),
                "data": rows,
                "usage": {"prompt_tokens": n, "total_tokens": n, "completion_tokens": 0, "prompt_tokens_details": None},
            }
        )

    async def models(self, request: Any) -> Any:
        """The OpenAI/vLLM model list (`object`, `data`: the one model this server serves) and System
        One's (`models`: each name the decision routes answer to, with a description and a date)
        in one body, so that either client reads its own fields."""
        clf = self.ctx.service.loaded.clf  # type: ignore[union-attr]
        name = self.ctx.served_name()
        return json_response(
            {
                "object": "list",
                "data": [
                    {
                        "id": name,
                        "object": "model",
                        "created": self.ctx.started,
                        "owned_by": "mlx-slm",
                        "root": str(clf.path) if clf.path else name,
                        "parent": None,
                        "max_model_len": clf.max_length,
                        "labels": list(clf.labels),
                    }
                ],
                "models": [
                    {"name": n, "description": _describe(n, name), "release_date": self.ctx.release_date()}
                    for n in self.ctx.model_names()
                ],
            }
        )


def _describe(n: str, served: str) -> str:
    if n == served:
        return "the model this server serves (mlx-slm)"
    return f"{served}, served under the name {n!r}"
