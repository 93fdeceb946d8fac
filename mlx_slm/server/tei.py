"""text-embeddings-inference's API: POST /predict (and POST /, where Hugging Face's
InferenceClient posts) and GET /info, with TEI's error bodies `{"error", "error_type"}`."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..ground.version import __version__
from ..service import ServeOptions, TaskSpec
from ..text.predictions import Prediction
from .checks import check_fields, check_texts
from .common import RouteContext
from .errors import HTTPError, Style, json_response

TEI_FIELDS = ("inputs", "raw_scores", "truncate", "truncation_direction", "parameters")


TEI_PATHS = ("/", "/predict", "/info", "/rerank", "/embed")  # where even Starlette's own errors (404, 405) are TEI's
FUNCTIONS = ("softmax", "sigmoid", "none")  # the text-classification pipeline's function_to_apply


def check_tei(data: Any, opts: ServeOptions) -> tuple[list[Any], bool, TaskSpec, str | None, int | None]:
    """TEI's /predict body: {"inputs": str | [str | [str] | [str, str]], "raw_scores"?, "truncate"?,
    "truncation_direction"?} (a pair `[text, text_pair]` in a batch, as TEI reads one; a list of
    strings is a batch of texts here), and the InferenceClient's {"inputs", "parameters":
    {"function_to_apply"?, "top_k"?}}.
    Returns (texts, one string given, task, the function to apply (None: the head's own, "none":
    the raw scores; see `tei_scores`), top k)."""
    check_fields(data, TEI_FIELDS, "inputs")
    texts, single = check_texts(data["inputs"], "inputs", opts, pairs=True)
    truncate: str | bool | None = None
    raw_scores = data.get("raw_scores", False)
    if raw_scores is None:
        raw_scores = False
    if not isinstance(raw_scores, bool):
        raise HTTPError(422, "'raw_scores' must be true or false", "raw_scores")
    direction = data.get("truncation_direction") or "Right"
    if not isinstance(direction, str) or direction.lower() not in ("right", "left"):
        raise HTTPError(422, '\'truncation_direction\' must be "Right" or "Left"', "truncation_direction")
    if "truncate" in data and data["truncate"] is not None:
        tr = data["truncate"]
        if not isinstance(tr, bool):
            raise HTTPError(422, "'truncate' must be true or false", "truncate")
        # TEI cuts the end off ("Right", keeping the head) unless told "Left" (keeping the tail).
        truncate = ("head" if direction.lower() == "right" else "tail") if tr else False
    task = TaskSpec(truncate=truncate)
    top_k, fn = None, None
    params = data.get("parameters")
    if params is not None:
        if not isinstance(params, dict):
            raise HTTPError(422, "'parameters' must be an object", "parameters")
        extra = sorted(k for k, v in params.items() if k not in ("function_to_apply", "top_k") and v is not None)
        if extra:
            raise HTTPError(
                422, f"unknown parameter {extra[0]!r}: use function_to_apply, top_k", f"parameters.{extra[0]}"
            )
        fn = params.get("function_to_apply")
        if fn is not None and fn not in FUNCTIONS:
            raise HTTPError(
                422,
                f"function_to_apply {fn!r} is not one of 'softmax', 'sigmoid' (over the raw label scores) or 'none' "
                "(the raw scores); leave it out for the head's own probabilities",
                "parameters.function_to_apply",
            )
        if raw_scores and fn not in (None, "none"):
            raise HTTPError(
                422,
                f"'raw_scores': true asks for the raw scores, function_to_apply {fn!r} for their {fn}: send one",
                "parameters.function_to_apply",
            )
        k = params.get("top_k")
        if k is not None:
            if isinstance(k, bool) or not isinstance(k, int) or k < 1:
                raise HTTPError(422, "'top_k' must be an integer of 1 or more", "parameters.top_k")
            top_k = k
    return texts, single, task, "none" if raw_scores else fn, top_k


def tei_scores(p: Prediction, fn: str | None) -> dict[str, float]:
    """An item's label scores as the text-classification pipeline's `function_to_apply` gives
    them, on every head form: None, the head's own probabilities (the pipeline's default: a
    softmax over one label per text, a sigmoid per label of a multi-label head, a one-output
    head's score; calibrated where the task calibrates); "none", the raw scores (the logits);
    "softmax" over the raw scores (a single-label head's own probabilities); "sigmoid" of each."""
    if fn is None or (fn == "softmax" and p.labels is None and p.value is None):
        return p.probs
    if fn == "none":
        return p.scores
    s = np.array(list(p.scores.values()), dtype=np.float64)
    if fn == "softmax":
        e = np.exp(s - s.max())
        out = e / e.sum()
    else:
        out = 0.5 * (1.0 + np.tanh(0.5 * s))  # the sigmoid, without overflow
    return {lab: float(x) for lab, x in zip(p.scores, out)}


class TEIRoutes:
    """TEI's routes over the service."""

    def __init__(self, ctx: RouteContext):
        self.ctx = ctx

    def routes(self) -> list[Any]:
        ctx = self.ctx
        return [
            ctx.post("/predict", self.predict, Style.TEI),
            ctx.post("/", self.predict, Style.TEI),
            ctx.get("/info", self.info, Style.TEI),
        ]

    async def predict(self, request: Any, t0: float) -> Any:
        """text-embeddings-inference's /predict (and Hugging Face's InferenceClient, which posts
        `{"inputs", "parameters"}` to its base URL): one list of {label, score}, best first, per
        input; a single string is answered as a list holding its one list."""
        data = await self.ctx.admit(request)
        self.ctx.one_question("TEI's /predict", "inputs")
        texts, single, task, fn, top_k = check_tei(data, self.ctx.opts)
        names = ["inputs"] if single else [f"inputs[{i}]" for i in range(len(texts))]
        ans = await self.ctx.compute(request, t0, texts, task, names, "inputs", '"truncate": true')
        out = []
        for p in ans.predictions:
            vals = tei_scores(p, fn)
            ranked = sorted(({"label": lab, "score": float(v)} for lab, v in vals.items()), key=lambda d: -d["score"])
            out.append(ranked[:top_k] if top_k else ranked)
        return json_response(out)

    async def info(self, request: Any) -> Any:
        """text-embeddings-inference's /info, for a sequence classifier."""

        ld, opts = self.ctx.service.loaded, self.ctx.opts
        clf = ld.clf  # type: ignore[union-attr]
        labels = list(clf.labels)
        kind = "reranker" if len(labels) == 1 else "classifier"  # TEI's rule: one output is a reranker
        model_type: dict[str, Any] = {
            kind: {
                "id2label": {str(i): lab for i, lab in enumerate(labels)},
                "label2id": {lab: i for i, lab in enumerate(labels)},
            }
        }
        if not self.ctx.service.tasks.classifies:  # an embedding model: TEI's embedding type, its pooling
            mode = self.ctx.service.tasks.pooling().mode
            model_type = {"embedding": {"pooling": "last_token" if mode == "lasttoken" else mode}}
        return json_response(
            {
                "model_id": self.ctx.served_name(),
                "model_sha": ld.weights_sha256,  # type: ignore[union-attr]
                "model_dtype": clf.engine.compute_dtype,
                "model_type": model_type,
                "max_concurrent_requests": opts.max_queue_items,
                "max_input_length": clf.max_length,
                "max_batch_tokens": opts.max_batch_tokens or clf.batching.max_batch_tokens,
                "max_batch_requests": opts.max_batch_items,
                "max_client_batch_size": opts.items_limit[0],
                "auto_truncate": clf.truncate is not None,
                "tokenization_workers": 1,
                "version": __version__,
                "sha": None,
                "docker_label": None,
            }
        )
