"""Embeddings over HTTP: OpenAI's `POST /v1/embeddings` (and `/embeddings`, where a client
given a base URL without /v1 posts) and text-embeddings-inference's `POST /embed`.

Both hand their texts (or token ids) to `Service.embed`, which runs them on the worker through
the queue like every classification (admission, micro-batches, deadlines, drain); the vectors
come back pooled as the model folder says (`embeddings`), and each route shapes them:

* OpenAI: `{"input": str | [str] | [int] | [[int]], "model"?, "encoding_format"?: "float" |
  "base64", "dimensions"?, "user"?}` -> `{"object": "list", "data": [{"object": "embedding",
  "index", "embedding"}], "model", "usage": {"prompt_tokens", "total_tokens"}}`; base64 is the
  little-endian float32 bytes, as OpenAI's SDK decodes them (and asks for by default). The
  folder's default prompt applies (OpenAI's body has no prompt); token ids run as given. Vectors
  are normalized as the folder says, and always after `dimensions` cuts them. Errors: OpenAI's
  shape (`{"error": {"message", "type", "param", "code"}}`), 400 for a bad request.
* TEI: `{"inputs": str | [str], "normalize"?: true, "truncate"?: false, "truncation_direction"?:
  "Right", "prompt_name"?, "dimensions"?}` -> `[[float, ...], ...]`, one list per input; errors
  TEI's `{"error", "error_type"}`, 422 ("Validation") for a bad request, as TEI answers.
"""

from __future__ import annotations

import base64
from typing import Any

import numpy as np

from ..classifier.embedder import EmbeddingError, finish
from ..ground.textfiles import has_lone_surrogate
from ..service import Invalid, ServeOptions
from .checks import check_count, check_name
from .common import RouteContext
from .errors import HTTPError, Style, json_response

OPENAI_FIELDS = ("input", "model", "encoding_format", "dimensions", "user")
TEI_EMBED_FIELDS = ("inputs", "normalize", "truncate", "truncation_direction", "prompt_name", "dimensions")
ENCODINGS = ("float", "base64")


def bad(status: int, message: str, fld: str | None) -> HTTPError:
    """A bad request's error, counted as invalid in /metrics."""
    return HTTPError(status, message, fld, outcome="too_large" if status == 413 else "invalid")


def _ids(value: Any) -> bool:
    """Whether `value` is a list of token ids (integers, not booleans)."""
    return (
        isinstance(value, list) and bool(value) and all(isinstance(x, int) and not isinstance(x, bool) for x in value)
    )


def check_inputs(value: Any, fld: str, opts: ServeOptions, status: int) -> tuple[list[Any], list[str], bool]:
    """OpenAI's `input` (and TEI's `inputs`): a string, a list of strings, a list of token ids
    (one text), or a list of such lists -> (items, each item's field name, token ids)."""
    if isinstance(value, str) or _ids(value):
        items, names = [value], [fld]
    elif isinstance(value, list):
        if not value:
            raise bad(status, f"'{fld}' is empty: give a text, a list of texts or of token ids", fld)
        items, names = value, [f"{fld}[{i}]" for i in range(len(value))]
    else:
        raise bad(status, f"'{fld}' must be a string or a list of strings (or of token ids)", fld)
    check_count(len(items), fld, opts)  # 413 naming the limit that applied (the option that sets it)
    token_ids = not isinstance(items[0], str)
    for name, x in zip(names, items):
        if token_ids and not isinstance(x, list):
            raise bad(status, f"{name}: every item must be a list of token ids, like the first", name)
        if token_ids and not _ids(x):
            raise bad(status, f"{name} must be a non-empty list of integer token ids", name)
        if not token_ids and not isinstance(x, str):
            raise bad(status, f"{name} must be a string, like the first item, got {type(x).__name__}", name)
        if not token_ids and not x.strip():
            raise bad(status, f"{name} is empty: give the item some text", name)
        if not token_ids and has_lone_surrogate(x):
            raise bad(status, f"{name} holds an unpaired surrogate escape (not valid Unicode text): fix it", name)
    return items, names, token_ids


def _fields(data: Any, fields: tuple[str, ...], texts: str, status: int) -> None:
    if not isinstance(data, dict):
        raise bad(status, f"the body must be a JSON object with {texts!r}", "body")
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise bad(status, f"unknown field {unknown[0]!r}: use {', '.join(fields)}", unknown[0])
    if texts not in data:
        raise bad(status, f"{texts!r} is missing: give a string or a list of strings", texts)


def _flag(data: dict[str, Any], key: str, default: bool, status: int) -> bool:
    v = data.get(key)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise bad(status, f"'{key}' must be true or false", key)
    return v


class EmbedRoutes:
    """OpenAI's and TEI's embedding routes over the service."""

    def __init__(self, ctx: RouteContext):
        self.ctx = ctx

    def routes(self) -> list[Any]:
        ctx = self.ctx
        return [
            ctx.post("/v1/embeddings", self.openai, Style.VLLM),
            ctx.post("/embeddings", self.openai, Style.VLLM),
            ctx.post("/embed", self.tei, Style.TEI),
        ]

    async def _embed(
        self, request: Any, t0: float, data: dict[str, Any], fld: str, status: int, prompt_name: Any, truncate: bool
    ) -> tuple[np.ndarray, int, Any]:
        """The request's vectors (N, D) float32 (pooled, not yet cut or normalized), its tokens and
        the embedder; every failure an `HTTPError` of `status` naming its field."""
        from starlette.concurrency import run_in_threadpool  # lazy: starlette is the serve extra's

        items, names, token_ids = check_inputs(data[fld], fld, self.ctx.opts, status)
        try:
            front = await run_in_threadpool(self.ctx.service.embedder, truncate)
            prompt = "" if token_ids else front.pooling.prompt_text(prompt_name, None, "prompt_name")
            dims = front.check_dimensions(data.get("dimensions"), "dimensions")
            hint = '"truncate": true' + ("" if status == 422 else " to TEI's /embed (OpenAI's API does not truncate)")
            call = self.ctx.call(request, t0, names, fld, hint)
            got = await self.ctx.service.embed(items, call, prompt=prompt, truncate=truncate, token_ids=token_ids)
        except EmbeddingError as e:
            why = str(e)
            raise bad(status, why, "dimensions" if why.startswith("dimensions") else "prompt_name") from None
        except Invalid as e:
            raise bad(status, e.message, e.field) from None
        vectors = np.stack([e.vector for e in got]) if got else np.zeros((0, front.dimension), np.float32)
        return finish(vectors, False, dims), sum(e.n_tokens for e in got), front

    async def openai(self, request: Any, t0: float) -> Any:
        """OpenAI's embeddings API (see the module docstring)."""
        try:
            data = await self.ctx.admit(request)
            _fields(data, OPENAI_FIELDS, "input", 400)
            # As chat reads them (`checks.check_name`): a `model` that is not a string is refused,
            # not echoed; `encoding_format` is "float", "base64" or absent, never a falsy stand-in.
            model = check_name(data, "model", 400, what=" (any name: the server has one model)")
            fmt = check_name(data, "encoding_format", 400, ENCODINGS) or "float"
            check_name(data, "user", 400)
            vectors, tokens, front = await self._embed(request, t0, data, "input", 400, None, False)
        except HTTPError as e:
            if e.status == 422:  # the shared checks' status: OpenAI answers a bad request with 400
                e.status = 400
            raise
        vectors = finish(vectors, front.pooling.normalize or data.get("dimensions") is not None)
        rows = [
            {
                "object": "embedding",
                "index": i,
                "embedding": base64.b64encode(v.astype("<f4").tobytes()).decode("ascii")
                if fmt == "base64"
                else v.tolist(),
            }
            for i, v in enumerate(vectors)
        ]
        return json_response(
            {
                "object": "list",
                "data": rows,
                "model": model or self.ctx.served_name(),
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            }
        )

    async def tei(self, request: Any, t0: float) -> Any:
        """text-embeddings-inference's /embed (see the module docstring)."""
        data = await self.ctx.admit(request)
        _fields(data, TEI_EMBED_FIELDS, "inputs", 422)
        normalize = _flag(data, "normalize", True, 422)
        truncate = _flag(data, "truncate", False, 422)
        direction = data.get("truncation_direction") or "Right"
        if not isinstance(direction, str) or direction.lower() != "right":
            raise bad(
                422,
                f"truncation_direction {direction!r} is not supported for embeddings: only 'Right' (the text's end is "
                "cut off, as sentence-transformers cuts it); shorten the text's head yourself",
                "truncation_direction",
            )
        name = data.get("prompt_name")
        if name is not None and not isinstance(name, str):
            raise bad(422, "'prompt_name' must be a string (a prompt name the model defines)", "prompt_name")
        vectors, _, _ = await self._embed(request, t0, data, "inputs", 422, name, truncate)
        return json_response([v.tolist() for v in finish(vectors, normalize)])
