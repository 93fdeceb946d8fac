"""The rerank routes: TEI's POST /rerank, and the Cohere/Jina shape that vLLM answers on /rerank,
/v1/rerank and /v2/rerank (where Cohere's Python SDK, `cohere.Client` and `cohere.ClientV2`,
posts).

    TEI      {"query", "texts": [str], "raw_scores"?, "return_text"?, "truncate"?, "truncation_direction"?}
             -> [{"index", "score", "text"?}, ...] best first
    Cohere   {"model"?, "query", "documents": [str | {"text": str}], "top_n"?, "return_documents"?}
             -> {"id", "model", "results": [{"index", "relevance_score", "document"?: {"text"}}],
                 "meta": {"api_version": {"version"}, "tokens": {"input_tokens", "output_tokens"}},
                 "usage": {"total_tokens"}}

/rerank reads a body with `documents` (and no `texts`) as the Cohere/Jina shape, as vLLM does.
Every (query, document) is one item of the model's reranker task (`TaskSpec(rerank=True)`, the
service's `TaskCache.rerank_key`), so documents of concurrent requests share micro-batches and
each query's tokens run once. A model that is no reranker answers 400 saying how to serve one.
"""

from __future__ import annotations

import uuid
from typing import Any

from ..jobs.rerank import MAX_DOCUMENTS
from ..kinds.rerank import rerank_order
from ..service import Answer, ServeOptions, ServiceError, TaskSpec
from .checks import check_count, check_name, check_text_values
from .common import RouteContext
from .errors import HTTPError, Style, http_error, json_response

TEI_RERANK_FIELDS = ("query", "texts", "raw_scores", "return_text", "truncate", "truncation_direction")
# Cohere's (v1 and v2), Jina's and vLLM's request fields. Those this server cannot honour are
# refused when set (`_UNSUPPORTED`); `priority`, `user` and `request_id` are taken and ignored.
COHERE_FIELDS = (
    "model",
    "query",
    "documents",
    "top_n",
    "return_documents",
    "truncate_prompt_tokens",
    "use_activation",
    "activation",
    "softmax",
    "priority",
    "user",
    "request_id",
    "rank_fields",
    "max_chunks_per_doc",
    "max_tokens_per_doc",
    "relevant_spans",
    "mm_processor_kwargs",
)
_UNSUPPORTED = {
    "max_chunks_per_doc": "documents are not split into chunks: each is scored whole (send it in parts yourself)",
    "max_tokens_per_doc": "a document over the model's context is an error, or cut to fit with "
    "'truncate_prompt_tokens': -1; a token count of one's own is not supported",
    "relevant_spans": "relevant spans are not computed: drop it",
    "mm_processor_kwargs": "the model reads text only: drop it",
}


def _bool(data: dict[str, Any], name: str, default: bool) -> bool:
    v = data.get(name)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise HTTPError(422, f"'{name}' must be true or false", name)
    return v


def _query(data: dict[str, Any]) -> str:
    q = data.get("query")
    if not isinstance(q, str) or not q.strip():
        got = "missing" if "query" not in data else f"{type(q).__name__}" if not isinstance(q, str) else "empty"
        raise HTTPError(422, f"'query' must be a non-empty string (got {got}): give the search query", "query")
    check_text_values(["query"], [q])
    return q


def _documents(data: dict[str, Any], fld: str, opts: ServeOptions, objects: bool) -> list[str]:
    """The documents (`fld`: "texts" or "documents"), each a non-empty string, or (`objects`:
    Cohere v1's and Jina's) an object with a string "text"; at most the limit that applies (413)."""
    docs = data.get(fld)
    if not isinstance(docs, list) or not docs:
        what = "missing" if fld not in data else "empty" if docs == [] else type(docs).__name__
        raise HTTPError(422, f"'{fld}' must be a non-empty list of documents (got {what}): give at least one", fld)
    # at most the items-per-request limit (`ServeOptions.items_limit`), and `jobs.rerank.MAX_DOCUMENTS`
    check_count(
        len(docs), fld, opts, "documents", (MAX_DOCUMENTS, "the most one query may rank"), "rerank them in parts"
    )
    out = []
    for i, d in enumerate(docs):
        name = f"{fld}[{i}]"
        if objects and isinstance(d, dict):
            d = d.get("text")
        if not isinstance(d, str):
            shape = 'a string or an object {"text": "..."}' if objects else "a string"
            raise HTTPError(422, f"{name} must be {shape}", name)
        out.append(d)
    check_text_values([f"{fld}[{i}]" for i in range(len(out))], out)
    return out


def check_tei_rerank(data: Any, opts: ServeOptions) -> tuple[str, list[str], TaskSpec, bool, bool]:
    """TEI's /rerank body -> (query, texts, task, raw scores, return the texts)."""
    if not isinstance(data, dict):
        raise HTTPError(422, "the body must be a JSON object with 'query' and 'texts'", "body")
    unknown = sorted(set(data) - set(TEI_RERANK_FIELDS))
    if unknown:
        raise HTTPError(422, f"unknown field {unknown[0]!r}: use {', '.join(TEI_RERANK_FIELDS)}", unknown[0])
    query, texts = _query(data), _documents(data, "texts", opts, objects=False)
    truncate: str | bool | None = None
    direction = data.get("truncation_direction") or "Right"
    if not isinstance(direction, str) or direction.lower() not in ("right", "left"):
        raise HTTPError(422, '\'truncation_direction\' must be "Right" or "Left"', "truncation_direction")
    if data.get("truncate") is not None:
        if not isinstance(data["truncate"], bool):
            raise HTTPError(422, "'truncate' must be true or false", "truncate")
        # TEI cuts the end off ("Right", keeping the head) unless told "Left" (keeping the tail).
        truncate = ("head" if direction.lower() == "right" else "tail") if data["truncate"] else False
    task = TaskSpec(truncate=truncate, rerank=True)
    return query, texts, task, _bool(data, "raw_scores", False), _bool(data, "return_text", False)


def check_cohere(data: Any, opts: ServeOptions) -> tuple[str, list[str], TaskSpec, int | None, bool, bool]:
    """The Cohere/Jina/vLLM rerank body -> (query, documents, task, top n (None: all), return the
    documents, raw scores). `top_n`: 0 or absent is every document (vLLM's default), more than
    there are is every document; `return_documents` is true unless false; `use_activation`
    false (vLLM's) gives the raw scores."""
    if not isinstance(data, dict):
        raise HTTPError(422, "the body must be a JSON object with 'query' and 'documents'", "body")
    unknown = sorted(set(data) - set(COHERE_FIELDS))
    if unknown:
        raise HTTPError(422, f"unknown field {unknown[0]!r}: use {', '.join(COHERE_FIELDS[:6])}", unknown[0])
    check_name(data, "model", what=" (any name: the server has one model)")
    for name, why in _UNSUPPORTED.items():
        if data.get(name) is not None:
            raise HTTPError(422, f"'{name}' is not supported: {why}", name)
    rank_fields = data.get("rank_fields")
    if rank_fields is not None and rank_fields != ["text"]:
        raise HTTPError(
            422, "'rank_fields' must be [\"text\"] or absent: documents are ranked by their text", "rank_fields"
        )
    query, docs = _query(data), _documents(data, "documents", opts, objects=True)
    top_n = data.get("top_n")
    if top_n is not None and (isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 0):
        raise HTTPError(
            422, f"'top_n' must be a whole number of 1 or more (0 or absent: every document), got {top_n!r}", "top_n"
        )
    tpt = data.get("truncate_prompt_tokens")
    if tpt is not None:
        if isinstance(tpt, bool) or not isinstance(tpt, int) or tpt != -1:
            raise HTTPError(
                422,
                "'truncate_prompt_tokens' must be -1 (cut a document that does not fit the model's context, keeping "
                "its end, as vLLM does) or null; a token count is not supported",
                "truncate_prompt_tokens",
            )
    task = TaskSpec(truncate=None if tpt is None else "tail", rerank=True)
    raw = not all(_bool(data, k, True) for k in ("use_activation", "activation", "softmax"))
    return query, docs, task, top_n or None, _bool(data, "return_documents", True), raw


class RerankRoutes:
    """The rerank routes over the service."""

    def __init__(self, ctx: RouteContext):
        self.ctx = ctx

    def routes(self) -> list[Any]:
        ctx = self.ctx
        return [
            ctx.post("/rerank", self.rerank, Style.TEI),
            ctx.post("/v1/rerank", self.cohere_v1, Style.VLLM),
            ctx.post("/v2/rerank", self.cohere_v2, Style.VLLM),
        ]

    async def _score(self, request: Any, t0: float, query: str, docs: list[str], task: TaskSpec, fld: str) -> Answer:
        names = [f"{fld}[{i}]" for i in range(len(docs))]
        hint = '"truncate": true' if fld == "texts" else '"truncate_prompt_tokens": -1'
        return await self.ctx.compute(request, t0, [(query, d) for d in docs], task, names, fld, hint)

    async def rerank(self, request: Any, t0: float) -> Any:
        """TEI's /rerank; a body with `documents` (and no `texts`) is answered in the Cohere/Jina
        shape, with OpenAI/vLLM-style errors, as vLLM's /rerank."""
        data = await self.ctx.admit(request)
        if isinstance(data, dict) and "documents" in data and "texts" not in data:
            try:
                return await self.cohere(request, t0, data, "1")
            except (HTTPError, ServiceError) as e:
                raise http_error(e, Style.VLLM) from None
        query, texts, task, raw, return_text = check_tei_rerank(data, self.ctx.opts)
        ans = await self._score(request, t0, query, texts, task, "texts")
        scores = _scores(ans, raw)
        out = []
        for i in rerank_order(scores):
            out.append({"index": i, "score": scores[i], **({"text": texts[i]} if return_text else {})})
        return json_response(out)

    async def cohere_v1(self, request: Any, t0: float) -> Any:
        return await self.cohere(request, t0, await self.ctx.admit(request), "1")

    async def cohere_v2(self, request: Any, t0: float) -> Any:
        return await self.cohere(request, t0, await self.ctx.admit(request), "2")

    async def cohere(self, request: Any, t0: float, data: Any, version: str) -> Any:
        """Cohere's rerank (v1 and v2), Jina's and vLLM's: the documents best first, the first
        `top_n`, each with its index, relevance score and (unless `return_documents` is false) text."""
        query, docs, task, top_n, return_documents, raw = check_cohere(data, self.ctx.opts)
        ans = await self._score(request, t0, query, docs, task, "documents")
        scores = _scores(ans, raw)
        results = []
        for i in rerank_order(scores, top_n):
            row: dict[str, Any] = {"index": i, "relevance_score": scores[i]}
            if return_documents:
                row["document"] = {"text": docs[i]}
            results.append(row)
        n = sum(p.n_tokens for p in ans.predictions)  # each pair's prompt tokens, as vLLM counts its usage
        return json_response(
            {
                "id": f"rerank-{uuid.uuid4().hex}",
                "model": self.ctx.served_name(),
                "results": results,
                "meta": {"api_version": {"version": version}, "tokens": {"input_tokens": n, "output_tokens": 0}},
                "usage": {"total_tokens": n},
            }
        )


def _scores(ans: Answer, raw: bool) -> list[float]:
    """Each document's relevance: the probability (the reranker's sigmoid or P(yes)), or its
    raw logit (`raw`: TEI's raw_scores, vLLM's use_activation false)."""
    if raw:
        return [float(next(iter(p.scores.values()))) for p in ans.predictions]
    return [float(p.value) for p in ans.predictions]
