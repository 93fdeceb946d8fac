"""Reranking: how relevant is each document to its query, as one score per (query, document).

An item is a (query, document) pair. Three scorers (`RERANKERS`):

* `seqcls`: a one-label sequence-classification checkpoint (a cross-encoder, a
  `Qwen3-Reranker-*-seq-cls` conversion): the pair as its tokenizer encodes a pair, the
  sigmoid of its one logit (`Engine.sequence_logits`);
* `qwen3`: a causal LM asked as Qwen3-Reranker asks (the model card's exact prompt,
  `prompts.qwen3_reranker_ids`): P(yes), the softmax over the `no` and `yes` logits at the
  last position, the instruction settable;
* `question`: a yes/no prompt of one's own whose template holds `{query}` and `{text}` (the
  document): P(yes) as for `qwen3`.

Every document of a query runs after that query's tokens: the tokens up to the document are
the item's own head (`Item.prefix`), computed once per query in the engine's prefix cache, and
a batch holds the documents of several queries, each row after its own query's KV
(`pipeline.batches`, `prefix_cache.StackedPrefix`). So a query's tokens run once, not once
per document, and each score is exactly the one of its (query, document) prompt run alone.
With the prefix cache off (`use_prefix_cache=False`) items get no head: each prompt runs whole.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import numpy as np

from ..engine.engine import Engine
from ..ground.errors import ModelError
from ..text.batching import Batch
from ..text.calibration import CalibrationSpec
from ..text.labels import LabelError
from ..text.predictions import Item, Prediction, Stats
from ..text.prompts import (
    PROBES,
    QWEN3_RERANKER_ANSWERS,
    PromptFormat,
    common_prefix,
    encode_texts,
    qwen3_reranker_ids,
    render,
    tokenize,
)
from ..text.records import RecordShape
from .base import KindArgs, KindSettings, KindSpec, OnePrompt, RunSettings, TaskError, check_texts, count, split_pair
from .head import HeadSettings
from .questions import QuestionsSettings

RERANKERS = ("seqcls", "qwen3", "question")
_QUESTION_SLOTS = re.compile(r"\{query\}|\{text\}")
DEFAULT_QUESTION_TEMPLATE = "Query: {query}\nDocument: {text}\nDoes the document answer the query? Answer yes or no."
# What each scorer's prompt takes of the settings a person may give (the others are refused by name).
TAKES = {"seqcls": (), "qwen3": ("instruction",), "question": ("system", "template")}
_WHY = {
    "seqcls": "a one-label sequence classifier scores the pair as its tokenizer encodes it (no prompt, no instruction)",
    "qwen3": "the qwen3 reranker asks as the Qwen3-Reranker model card does (its own prompt; --instruction sets its "
    "instruction)",
    "question": "the question reranker asks its own yes/no --template (and --system); --instruction is the qwen3 "
    "reranker's",
}
NO_RERANKER = (
    "is not a reranker (a one-label sequence classifier, or a causal LM whose name says Reranker): "
    "pass --reranker qwen3 to ask it as Qwen3-Reranker asks, or --reranker question with a --template "
    "holding {query} and {text}"
)


EMBEDDING_MODEL = (
    "is an embedding model (no LM head to answer yes or no, no score head): no reranker runs on it; rank the "
    "documents by the cosine of their embeddings (mlx-slm embed, or serve's /v1/embeddings), or rerank with a "
    "reranker (a cross-encoder, or a causal LM asked with --reranker qwen3 or question)"
)


@dataclass(frozen=True)
class RerankSettings(KindSettings):
    """A reranker asked for (`reranker=`: auto, seqcls, qwen3 or question; a task's field
    'rerank'): the qwen3 prompt's `instruction`, the question scorer's `system` and `template`
    (the prompt a caller typed: the kind takes it or refuses it by name, `TAKES`)."""

    scorer: str
    instruction: str | None = None
    system: str | None = None
    template: str | None = None

    NAMES = ("reranker", "instruction")

    @classmethod
    def take(cls, named: Mapping[str, Any]) -> RerankSettings | None:
        if named.get("reranker") is None:
            return None
        return cls(named["reranker"], named.get("instruction"), named.get("system"), named.get("template"))

    def named(self, home: str | None = None) -> dict[str, Any]:
        out = {
            "reranker": self.scorer,
            "instruction": self.instruction,
            "system": self.system,
            "template": self.template,
        }
        return {k: v for k, v in out.items() if v is not None}


@dataclass(frozen=True)
class RerankSpec(KindSpec):
    """A reranker: its `scorer` (see `RERANKERS`), the instruction of the `qwen3` prompt (None:
    the card's web-search one), and the `question` scorer's system message and template."""

    scorer: str
    instruction: str | None = None
    system: str | None = None
    template: str = DEFAULT_QUESTION_TEMPLATE
    head: Any = None  # the `seqcls` scorer's `SeqClsHead`
    named: tuple[str, ...] = ()  # the labels a task names, while its model is not loaded yet

    name = "rerank"  # type: ignore[misc]
    Settings = RerankSettings
    task_fields = ("rerank",)
    calibrates = abstains = False  # type: ignore[misc]
    no_calibration = "calibration and --min-confidence do not apply to relevance scores: drop them"  # type: ignore[misc]

    @classmethod
    def wants(cls, args: KindArgs) -> bool:
        return args.get(RerankSettings) is not None

    @classmethod
    def from_args(cls, args: KindArgs) -> RerankSpec:
        own = args.get(RerankSettings)
        assert own is not None
        e = {"system": own.system, "template": own.template, "instruction": own.instruction}
        scorer, model_head = own.scorer, args.model.head
        if scorer in ("auto", "seqcls") and model_head is None and not args.model.loaded:
            return cls(scorer, named=tuple(args.labels)[:1])
        if args.model.embeds_only:  # no LM head to answer yes or no, no score head: no scorer can run
            raise LabelError(f"{args.model.name or 'this model'} {EMBEDDING_MODEL}")
        if scorer == "auto":
            if model_head is not None:
                scorer = "seqcls"
            elif "rerank" in args.model.name.lower():
                scorer = "qwen3"
            else:
                raise LabelError(f"{args.model.name or 'this model'} {NO_RERANKER}")
        if scorer not in RERANKERS:  # auto was resolved above
            raise LabelError(f"reranker {scorer!r} is not one of {', '.join(RERANKERS)} (or auto)")
        if args.get(QuestionsSettings) is not None or args.get(HeadSettings) is not None or args.examples:
            raise LabelError("a reranker scores (query, document) pairs: drop questions, heads and examples")
        if scorer == "seqcls":
            if model_head is None:
                raise LabelError("--reranker seqcls needs a sequence-classification checkpoint (a one-label head)")
            if model_head.num_labels != 1:
                raise LabelError(
                    f"this model is a {model_head.num_labels}-label classifier ({', '.join(model_head.labels[:6])}): "
                    "a reranker has one output; classify the pairs instead (mlx-slm classify with text_pair)"
                )
        elif model_head is not None:
            raise ModelError(model_head.no_lm_head())
        for name in ("system", "template", "instruction"):
            if e.get(name) is not None and name not in TAKES[scorer]:
                raise LabelError(f"--{name} ({name}=): {_WHY[scorer]}: drop --{name}")
        template = e.get("template") or DEFAULT_QUESTION_TEMPLATE
        if scorer == "question" and ("{query}" not in template or "{text}" not in template):
            raise LabelError(
                f"the question reranker's template must hold {{query}} and {{text}} (the document), got {template!r}"
            )
        return cls(scorer, e.get("instruction"), e.get("system"), template, model_head if scorer == "seqcls" else None)

    @property
    def labels(self) -> tuple[str, ...]:
        if self.head is not None:
            return (self.head.labels[0],)
        return self.named if self.scorer in ("auto", "seqcls") and self.named else ("yes",)

    def prompt(self, system: str | None, template: str) -> PromptFormat:
        return PromptFormat(None, "{text}")  # the scorer's own prompt (see `RerankKind.encode_query`)

    def record_shape(self, *, calibrated: bool = False, abstains: bool = False, scores: bool = False) -> Any:

        return RecordShape.of(self.labels, scores=scores, form="score")

    def _section(self) -> dict[str, Any]:
        out: dict[str, Any] = {"scorer": self.scorer}
        if self.scorer == "qwen3":
            out["instruction"] = self.instruction
        if self.scorer == "question":
            out.update(system=self.system, template=self.template)
        return {"rerank": out}

    def info(self) -> dict[str, Any]:
        return {"labels": list(self.labels), **self._section()}

    def for_request(self, labels: tuple[str, ...], same_prompt: bool) -> KindSpec | None:
        return self if labels == self.labels and same_prompt else None  # its prompt is the scorer's own

    def example_input(self, text: str) -> Any:
        return (text, text)  # a (query, document) pair

    def manifest(self, mode: str) -> dict[str, Any]:
        return {"labels": list(self.labels), "scoring": mode, "examples": [], "form": "score", **self._section()}

    def to_task(self, path: Any = None) -> dict[str, Any]:
        return {"labels": list(self.labels), **self._section()}

    def task_kwargs(self, mode: str) -> dict[str, Any]:
        r = self._section()["rerank"]
        return {
            "labels": self.labels,
            "section": RerankSettings(r["scorer"], r.get("instruction"), r.get("system"), r.get("template")),
        }

    @classmethod
    def read_task(
        cls, d: dict[str, Any], where: str, labels: list[str], calibration: CalibrationSpec
    ) -> dict[str, Any] | None:
        section = d.get("rerank")
        if section is None:
            return None
        if not isinstance(section, dict) or section.get("scorer") not in RERANKERS:
            raise TaskError(f"{where}: field 'rerank' must be an object with a scorer of {', '.join(RERANKERS)}")
        r = {k: section.get(k) for k in ("instruction", "system", "template")}
        return {"section": RerankSettings(section["scorer"], **r)}

    def bind(self, engine: Engine, fmt: PromptFormat, run: RunSettings) -> RerankKind:
        if self.scorer == "auto" or (self.scorer == "seqcls" and self.head is None):
            raise AssertionError("a reranker is chosen on its model before it is bound (Classifier)")
        return RerankKind(self, engine, fmt, run)


class RerankKind(OnePrompt):
    """Scores (query, document) items, each document after its query's cached tokens."""

    spec: RerankSpec

    def __init__(self, spec: RerankSpec, engine: Engine, fmt: PromptFormat, run: RunSettings):
        super().__init__(spec, engine, fmt, run)
        self.format_error = None
        self.prefix_tokens = ()  # every item has its own head (its query's)
        self.answer_rows: list[int] = []
        if spec.scorer != "seqcls":
            self.answer_rows = self._answer_ids()

    def _answer_ids(self) -> list[int]:
        """The token ids of `no` and `yes` (the card: `convert_tokens_to_ids`), each one token."""
        tok = self.engine.tokenizer
        ids = []
        for word in QWEN3_RERANKER_ANSWERS:
            got = tok.convert_tokens_to_ids(word)
            if got is None or tok.convert_ids_to_tokens(int(got)) != word:  # not in the vocabulary as such
                enc = tok(word, add_special_tokens=False)["input_ids"]
                if len(enc) != 1:
                    raise LabelError(
                        f"{word!r} is not one token in this model's tokenizer ({enc}): it cannot answer yes or no "
                        "as a reranker is asked"
                    )
                got = enc[0]
            ids.append(int(got))
        return ids

    @property
    def mode(self) -> str:
        return f"rerank ({self.spec.scorer})"

    def encode_query(self, query: str, docs: Sequence[str]) -> tuple[tuple[int, ...], list[list[int]]]:
        """(the query's head ids, each document's whole prompt ids): every prompt starts with the head."""
        spec, tok = self.spec, self.engine.tokenizer
        if spec.scorer == "qwen3":
            head, rests = qwen3_reranker_ids(tok, query, docs, spec.instruction)
            return tuple(head), [head + r for r in rests]
        if spec.scorer == "seqcls":
            probes = encode_texts(tok, [query] * len(PROBES), list(PROBES))
            seqs = encode_texts(tok, [query] * len(docs), list(docs))
            seqs = [spec.head.prompt_ids(s) for s in seqs]
        else:  # the user turn filled in one pass: a query holding "{text}" or other braces stays as it is
            fmt = PromptFormat(spec.system, "{text}")
            probes = tokenize(tok, [render(tok, fmt, self.question(query, p)) for p in PROBES])
            seqs = tokenize(tok, [render(tok, fmt, self.question(query, d)) for d in docs])
        return tuple(common_prefix(probes)), seqs

    def question(self, query: str, document: str) -> str:
        """The question scorer's user turn: its template with `{query}` and `{text}` (the
        document) filled in one pass."""
        return _QUESTION_SLOTS.sub(lambda m: query if m.group(0) == "{query}" else document, self.spec.template)

    def items(self, texts: Sequence[Any], start: int = 0) -> list[Item]:
        with self.engine.lock:
            items = check_texts(None, texts, start)
            by_query: dict[str, list[tuple[Item, str]]] = {}
            for it, x in zip(items, texts):
                if it.error is not None:
                    continue
                query, doc = split_pair(x)
                if doc is None or not doc.strip():
                    it.error = "a reranker scores a (query, document) pair: the document is missing or empty"
                    continue
                by_query.setdefault(query, []).append((it, doc))
            for query, group in by_query.items():
                head, seqs = self.encode_query(query, [d for _, d in group])
                # The query cache off (`use_prefix_cache=False`): no head, so every prompt runs whole.
                own = head if self.run.use_prefix_cache else ()
                for (item, doc), seq in zip(group, seqs):
                    item.ids, item.prefix = seq, own
                    if len(seq) > self.max_length:
                        self._cut(item, query, doc)
            return items

    def _cut(self, item: Item, query: str, doc: str) -> None:
        """An over-long prompt: its document cut as `run.truncate` says, or an error row."""
        if self.run.truncate is None:
            item.error = (
                f"prompt is {len(item.ids)} tokens, over the model's context of {self.max_length}: "
                "shorten the document, or pass --truncate head|tail|middle"
            )
            return
        tok, mode = self.engine.tokenizer, self.run.truncate
        doc_ids = tok(doc, add_special_tokens=False)["input_ids"]
        keep = len(doc_ids) - (len(item.ids) - self.max_length) - 4
        while keep > 0:
            if mode == "head":
                kept = tok.decode(doc_ids[:keep])
            elif mode == "tail":
                kept = tok.decode(doc_ids[-keep:])
            else:
                a = keep // 2
                kept = tok.decode(doc_ids[:a]) + " ... " + tok.decode(doc_ids[len(doc_ids) - (keep - a) :])
            _, (seq,) = self.encode_query(query, [kept])
            if len(seq) <= self.max_length:
                item.ids, item.truncated = seq, True
                return
            keep -= max(4, len(seq) - self.max_length)
        item.error = "the query and the prompt alone are longer than the model's context: shorten the query"

    def score(self, batch: Batch, items: list[Item], prefix: Any, st: Stats) -> list[Prediction]:
        if self.spec.scorer == "seqcls":
            logits = self.engine.sequence_logits(batch, prefix).astype(np.float64)[:, 0]  # (B,)
            scores = self.spec.head.probabilities(logits[:, None])[:, 0]
        else:
            first, _, _ = self.engine.forward(batch, prefix, mx.array(self.answer_rows, dtype=mx.int32))
            two = np.array(first, dtype=np.float64)  # (B, 2): the no and yes logits
            logits = two[:, 1] - two[:, 0]  # log-odds of yes
            scores = np.exp(-np.logaddexp(0.0, -logits))  # softmax over (no, yes) = sigmoid(yes - no)
        count(st, batch, 0)
        label = self.spec.labels[0]
        return [
            Prediction(it.index, label, {label: float(s)}, {label: float(x)}, len(it.ids), it.truncated, value=float(s))
            for it, s, x in zip(items, scores, logits)
        ]


def rerank_order(scores: Sequence[float], top_n: int | None = None) -> list[int]:
    """Document indices best first (ties keep input order), the first `top_n` of them."""
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
    return order if top_n is None else order[:top_n]


__all__ = ["RERANKERS", "RerankKind", "RerankSpec", "rerank_order"]
