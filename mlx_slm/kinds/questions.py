"""Several questions per text in one pass: the text part once, each question a branch after it.

The plan (`branches.QuestionPlan`) splits each text's question prompts into the tokens they
share (the text part) and each question's own tokens; one forward a batch runs each row's text
part causally after the shared head's KV and every question's tokens and its options' trie as
branches of a per-row tree after it (`After.run`, `branches.pack_branches` with the text part
as the row's trunk); `branch_scores` reads each block's scores, `Question.answer` each answer
(a learned head question reads its branch's hidden states). One forward, not a text pass and a
branch pass: half the forwards, each twice the rows' tokens (larger products, more of them run
on both cores). Calibration and abstain are per question (`answers.QuestionCalibration`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import numpy as np

from ..engine.engine import Engine
from ..engine.prefix_cache import PrefixCache
from ..models import KV
from ..text import prompts
from ..text.answers import QuestionCalibration
from ..text.batching import Batch
from ..text.branches import QuestionPlan
from ..text.calibration import CalibrationSpec
from ..text.heads import head_input
from ..text.labels import LabelSet
from ..text.predictions import Item, Prediction, Stats
from ..text.prompts import PromptFormat
from ..text.questions import DEFAULT_SYSTEM, DEFAULT_TEMPLATE, Question, QuestionError, check_questions
from .base import (
    Kind,
    KindArgs,
    KindSettings,
    KindSpec,
    RunSettings,
    TaskError,
    bad_field,
    check_texts,
    refuse_by_size,
    require_lm_head,
    task_examples,
)
from .head import HeadSettings, check_head
from .labels import LOGIT_ROWS


@dataclass(frozen=True)
class QuestionsSettings(KindSettings):
    """Several questions per text (`questions=`: `Question`s or their dicts)."""

    questions: tuple[Any, ...]

    NAMES = ("questions",)

    @classmethod
    def take(cls, named: Mapping[str, Any]) -> QuestionsSettings | None:
        return None if named.get("questions") is None else cls(tuple(named["questions"]))

    def named(self, home: str | None = None) -> dict[str, Any]:
        return {"questions": self.questions}

    @property
    def trained(self) -> str | None:  # type: ignore[override]
        """A head question's head was trained on the task's own model, labels and prompt."""
        asked = (q if isinstance(q, Question) else Question.from_dict(q) for q in self.questions)
        return "learned head" if any(q.head is not None for q in asked) else None

    def no_resume(self, calibration: CalibrationSpec) -> str | None:
        if calibration.per_input:  # the priors per question are not recorded in the manifest
            return (
                "--resume with --questions and batch calibration would fit other priors on the rest of the input: "
                "start again without --resume"
            )
        return None


@dataclass(frozen=True)
class QuestionsSpec(KindSpec):
    """Questions (choice, yes/no, scale, multi, learned heads), each with its own options."""

    asked: tuple[Question, ...]

    name = "questions"  # type: ignore[misc]
    Settings = QuestionsSettings
    task_fields = ("questions",)
    truncates = False  # type: ignore[misc]
    no_truncation = "truncation is not supported with several questions yet: drop 'truncate'"  # type: ignore[misc]

    @classmethod
    def wants(cls, args: KindArgs) -> bool:
        return args.get(QuestionsSettings) is not None

    @classmethod
    def from_args(cls, args: KindArgs) -> QuestionsSpec:
        refuse(
            labels=bool(args.labels),
            head=args.get(HeadSettings) is not None,
            examples=bool(args.examples),
            label_descriptions=bool(args.label_descriptions),
            keep_logits=args.keep_logits,
            scoring=args.scoring != "auto",
            truncate=bool(args.truncate),
        )
        own = args.get(QuestionsSettings)
        assert own is not None
        qs = tuple(q if isinstance(q, Question) else Question.from_dict(q) for q in own.questions)
        return cls(qs)

    @property
    def labels(self) -> tuple[str, ...]:
        return ()

    @property
    def questions(self) -> tuple[Question, ...]:
        return self.asked

    @property
    def heads(self) -> list[Any]:
        return [q.head for q in self.asked if q.head is not None]

    def prompt(self, system: str | None, template: str) -> PromptFormat:
        """As given; the labels' default system message and template give way to the questions' own."""

        system = DEFAULT_SYSTEM if system is prompts.DEFAULT_SYSTEM else system
        template = DEFAULT_TEMPLATE if template is prompts.DEFAULT_TEMPLATE else template
        return PromptFormat(system, template)

    def calibration_run(
        self, spec: CalibrationSpec, min_confidence: float | None = None, on_fit: Any = None
    ) -> QuestionCalibration:
        return QuestionCalibration(spec, self.asked, min_confidence=min_confidence)

    def check_calibration(self, spec: CalibrationSpec, min_confidence: float | None = None) -> None:
        self.calibration_run(spec, min_confidence)  # refused here if it does not apply

    def to_task(self, path: Any = None) -> dict[str, Any]:
        return {"labels": [], "questions": [q.to_dict() for q in self.asked]}

    def info(self) -> dict[str, Any]:
        return {"labels": [], "questions": [q.record() for q in self.asked]}

    def for_request(self, labels: tuple[str, ...], same_prompt: bool) -> KindSpec | None:
        return self if not labels else None  # a request with labels asks one question: zero-shot labels

    def task_kwargs(self, mode: str) -> dict[str, Any]:
        return {"labels": (), "section": QuestionsSettings(self.asked)}

    def manifest(self, mode: str) -> dict[str, Any]:
        return {"labels": [], "questions": [q.record() for q in self.asked], "scoring": mode, "examples": []}

    @classmethod
    def read_task(
        cls, d: dict[str, Any], where: str, labels: list[str], calibration: CalibrationSpec
    ) -> dict[str, Any] | None:
        """Several questions (zero-shot ones and learned heads), checked one by one and as a set."""
        if "questions" not in d:
            return None
        examples = task_examples(d, where, labels)
        qs = d["questions"]
        if not isinstance(qs, list) or not qs:
            raise bad_field(d, where, "questions", "a non-empty list of questions")
        if labels or d.get("head") is not None or calibration.fitted:
            raise TaskError(
                f"{where}: a task with 'questions' has no labels, head or fitted prior of its own (each question "
                "carries its own): fix it, or save the task again"
            )
        try:
            asked = check_questions([Question.from_dict(q, f"{where}: question {i}") for i, q in enumerate(qs, 1)])
        except QuestionError as e:
            raise TaskError(str(e)) from None
        return {"examples": examples, "section": QuestionsSettings(tuple(asked))}

    def bind(self, engine: Engine, fmt: PromptFormat, run: RunSettings) -> QuestionsKind:
        return QuestionsKind(self, engine, fmt, run)


def refuse(**given: bool) -> None:
    """What a classifier that asks several questions does not take (each question carries its own options)."""
    bad = [k for k, v in given.items() if v]
    if bad:
        why = {
            "labels": "each question has its own labels",
            "examples": "few-shot examples answer one question",
            "label_descriptions": "a question carries its own descriptions",
        }
        raise QuestionError(
            f"questions= does not go with {bad[0]}"
            + (f" ({why[bad[0]]})" if bad[0] in why else " (not supported with several questions yet)")
            + ": drop it, or ask one question with labels="
        )


class QuestionsKind(Kind):
    """Every question of every row: the text part once, then each question as a branch."""

    spec: QuestionsSpec

    def __init__(self, spec: QuestionsSpec, engine: Engine, fmt: PromptFormat, run: RunSettings):
        require_lm_head(engine)
        if not getattr(engine.model, "supports_tree", False):
            raise QuestionError(
                f"several questions per text need one of our architectures (tree masks); {engine.path} runs "
                "through mlx-lm's class: ask one question (--labels) per run"
            )
        self.spec, self.engine, self.format, self.run = spec, engine, fmt, run
        self.plan = QuestionPlan(engine.tokenizer, spec.asked, fmt.system, fmt.template)
        self.plan.check_fits(run.max_length or engine.max_length)  # a question no text fits: refused once
        for q in self.plan.questions:
            if q.head is not None:
                check_head(q.head, engine)
        self.pool_from = len(self.plan.head)
        self.prefix_tokens = tuple(self.plan.head) if run.use_prefix_cache else ()

    @property
    def mode(self) -> str:
        return "questions"

    @property
    def label_extra(self) -> int:
        return self.plan.label_extra

    @property
    def row_extra(self) -> int:
        return self.plan.row_extra

    def items(self, texts: Sequence[Any], start: int = 0) -> list[Item]:
        with self.engine.lock:
            items = check_texts(None, texts, start)
            refuse_by_size(items, texts, self.engine.tokenizer, self.max_length)
            good = [(it, t) for it, t in zip(items, texts) if it.error is None]
            for (item, _), (common, chains) in zip(good, self.plan.split([t for _, t in good])):
                item.ids, item.chains = common, chains
                n = self.plan.longest(common, chains)
                if n > self.max_length:
                    item.error = (
                        f"the longest question's prompt is {n} tokens with its answer, over the model's context "
                        f"of {self.max_length}: shorten the text"
                    )
            return items

    def score(self, batch: Batch, items: list[Item], prefix: PrefixCache | None, st: Stats) -> list[Prediction]:
        """Every question of the batch's rows: each row's text part (its padding dropped) runs
        causally after the shared head's KV, and its branches after it, in one forward (a plan
        of several passes: the later ones after that forward's keys, seeing the text parts)."""
        plan, engine = self.plan, self.engine
        trunks = [row[real] for row, real in zip(batch.ids, batch.mask.astype(bool))]  # each text part, unpadded
        skip = 0 if prefix is not None else self.pool_from  # a head's mean covers the prompt after its shared head
        packs = plan.packs([it.chains for it in items], engine.pad_id, trunks)
        after = After.prefix(prefix, len(items))
        scores: list[np.ndarray] = [np.empty(0)] * len(plan.blocks)
        sums: dict[int, np.ndarray] = {}
        counts = None
        for i, pack in enumerate(packs):
            blocks = [plan.blocks[b] for b in pack.blocks]
            means = (plan.head_layers if plan.head_means else []) if i == 0 else []
            layers = sorted({x for b in blocks if b.head is not None for x in b.head.layers} | set(means))
            with engine.lock:
                h, hidden, kv = after.run(engine, pack, layers, return_kv=i == 0 and len(packs) > 1)
                if i == 0:
                    sums, counts = _text_means(hidden, means, trunks, skip)
                got = branch_scores(engine, h, pack, blocks, hidden, sums, counts)
            if kv is not None:
                after = after.then(kv, trunks, pack.ids.shape[1])
            for b, sc in zip(pack.blocks, got):
                scores[b] = sc
        ran = sum(p.tokens for p in packs)
        real = batch.real_tokens + sum(len(c) + plan.blocks[b].nodes for it in items for b, c in enumerate(it.chains))
        st.batches += 1
        st.processed_tokens += ran
        st.padding_tokens += ran - real
        st.label_tokens += ran - batch.real_tokens
        return [
            Prediction(
                item.index, n_tokens=len(item.ids) + sum(map(len, item.chains)), truncated=item.truncated, answers=ans
            )
            for item, ans in zip(items, plan.answers(scores))
        ]


# --------------------------------------------------------------------------- one pass of branches


@dataclass(frozen=True)
class After:
    """What a pass of branches runs after: the cached keys and values (per layer; None: nothing
    cached), which of them each row sees ((B, C) bool; None: all), and each row's RoPE position
    of the pass's first token (B,)."""

    kv: list[KV] | None
    mask: mx.array | None
    start: np.ndarray

    @classmethod
    def prefix(cls, prefix: Any, rows: int) -> After:
        """After the shared prompt head's KV (a `PrefixCache`; a `StackedPrefix`: each row its own), or nothing."""
        if prefix is None:
            return cls(None, None, np.zeros(rows, dtype=np.int32))
        if getattr(prefix, "mask", None) is not None:
            return cls(prefix.kv, prefix.mask, np.asarray(prefix.lengths, dtype=np.int32))
        return cls(prefix.kv, mx.ones((rows, len(prefix)), dtype=mx.bool_), np.full(rows, len(prefix), np.int32))

    def run(
        self, engine: Engine, pack: Any, layers: Sequence[int], return_kv: bool
    ) -> tuple[mx.array, dict[int, np.ndarray], list[KV] | None]:
        """One forward of `pack` after this: its hidden states (B, T, D), those after `layers`
        (float32, {layer: (B, T, D)}) and, if asked, the KV of the cache and the pack's tokens."""
        collect: dict[int, Any] | None = dict.fromkeys(layers) if layers else None
        got = engine.continue_after(
            self.kv,
            self.mask,
            pack.ids,
            positions=self.start[:, None] + pack.positions,
            tree=pack.visible,
            collect=collect,
            return_kv=return_kv,
        )
        h, kv = got if return_kv else (got, None)
        hidden = {x: np.array(v.astype(mx.float32)) for x, v in collect.items()} if collect else {}
        return h, hidden, kv

    def then(self, kv: list[KV], trunks: Sequence[np.ndarray], width: int) -> After:
        """After a pass that ran each row's trunk first (`kv`: the cache's and the pass's `width`
        tokens' keys): later passes see the cache and the trunks, never that pass's branches."""
        t = np.array([len(x) for x in trunks], dtype=np.int32)
        mine = mx.array(np.arange(width)[None, :] < t[:, None])
        mask = mine if self.mask is None else mx.concatenate([self.mask, mine], axis=1)
        return After(kv, mask, self.start + t)


def _text_means(
    hidden: dict[int, np.ndarray], layers: Sequence[int], trunks: Sequence[np.ndarray], skip: int
) -> tuple[dict[int, np.ndarray], np.ndarray | None]:
    """A mean-pooling head's text part: each row's float32 sum of its trunk's hidden states after
    `layers` past its first `skip` tokens ({layer: (B, D)}), and their count (B,)."""
    if not layers:
        return {}, None
    t = np.array([len(x) for x in trunks])
    T = next(iter(hidden.values())).shape[1]
    cols = np.arange(T)[None, :]
    w = ((cols < t[:, None]) & (cols >= skip)).astype(np.float32)
    sums = {x: (hidden[x] * w[..., None]).sum(axis=1) for x in layers}
    return sums, w.sum(axis=1)


def branch_scores(
    engine: Engine,
    h: mx.array,
    pack: Any,
    blocks: Sequence[Any],
    hidden: dict[int, np.ndarray],
    text_sums: dict[int, np.ndarray],
    text_counts: np.ndarray | None,
) -> list[np.ndarray]:
    """Each block's (B, options) scores from a pass's hidden states: its options' tokens
    (`option_scores`), or a learned head on the branch's hidden states (`_head_scores`)."""
    B = pack.ids.shape[0]
    options = [b.options if b.head is None else None for b in blocks]
    got = option_scores(engine, h, pack, [options] * B)
    out = [
        np.stack([got[r][k] for r in range(B)]) if o is not None else np.zeros((B, 0)) for k, o in enumerate(options)
    ]
    for k, b in enumerate(blocks):
        if b.head is not None:
            out[k] = _head_scores(b.head, hidden, pack, k, text_sums, text_counts)
    return out


def option_scores(
    engine: Engine, h: mx.array, pack: Any, options: Sequence[Sequence[LabelSet | None]]
) -> list[list[np.ndarray | None]]:
    """Each branch's option scores from a pass's hidden states `h` (B, T, D): `options[r][k]`
    is row r's k-th branch's `LabelSet` (None: not scored by tokens). An option's score is its
    first token's logit at the branch's last question token (label rows only: the normalizer is
    one per branch, and cancels in its softmax) plus the exact log-probabilities of its later
    tokens from its trie nodes. Rows asking the same branches are scored together. [r][k]."""
    B, D = len(options), h.shape[-1]
    res: list[list[np.ndarray | None]] = [[None] * len(row) for row in options]
    live = [o for row in options for o in row if o is not None]
    if not live:
        return res
    with engine.lock:
        rows = np.unique(np.concatenate([np.asarray(o.first_ids, dtype=np.int64) for o in live]))
        at = mx.array(pack.answer_at.astype(np.int32))  # (B, K)
        K = pack.answer_at.shape[1]
        ans = mx.take_along_axis(h, at[..., None], axis=1).reshape(-1, D)
        first = np.array(engine.model.logits(ans, mx.array(rows)).astype(mx.float32), dtype=np.float64)
        first = first.reshape(B, K, len(rows))
        lse = got = tokens = None
        if pack.node_at.shape[1]:
            N = pack.node_at.shape[1]
            nodes = mx.take_along_axis(h, mx.array(pack.node_at.astype(np.int32))[..., None], axis=1).reshape(-1, D)
            tokens = np.unique(np.concatenate([c.edge_token for o in live for c in o.trie]))
            lse, got = engine.vocab_logprob_parts(nodes, tokens, LOGIT_ROWS)
            lse, got = lse.reshape(B, N), got.reshape(B, N, len(tokens))
    same: dict[tuple[int, ...], list[int]] = {}
    for r, row in enumerate(options):
        same.setdefault(tuple(id(o) for o in row), []).append(r)
    for members in same.values():
        rr = np.asarray(members)
        base = 0
        for k, o in enumerate(options[members[0]]):
            if o is None:
                continue
            s = first[rr, k][:, np.searchsorted(rows, o.first_ids)]  # (G, options)
            for c in o.trie:  # each option's later tokens: its trie edges
                node = base + c.edge_node
                lp = got[rr][:, node, np.searchsorted(tokens, c.edge_token)] - lse[rr][:, node]  # type: ignore[index]
                s[:, c.labels] += lp @ c.paths
                base += len(c)
            for g, r in enumerate(members):
                res[r][k] = s[g]
    return res


def _head_scores(
    head: Any,
    hidden: dict[int, np.ndarray],
    pack: Any,
    k: int,
    text_sums: dict[int, np.ndarray] | None,
    text_counts: np.ndarray | None,
) -> np.ndarray:
    """A head's log-probabilities for block k of a pack, from the branch's hidden states after
    its layers ({layer: (B, T, D)}): what `Engine.features` gives for the text's own prompt."""

    layers = sorted(set(head.layers))
    rows = np.arange(pack.answer_at.shape[0])
    last = pack.answer_at[:, k]
    feats: dict[str, np.ndarray] = {}
    if "last" in head.poolings:
        feats["last"] = np.stack([hidden[x][rows, last] for x in layers], axis=1)
    if "mean" in head.poolings:
        assert text_sums is not None and text_counts is not None
        m = pack.chain_len[:, k]
        means = []
        for x in layers:
            own = np.stack([hidden[x][r, last[r] - m[r] + 1 : last[r] + 1].sum(axis=0) for r in rows])
            means.append((text_sums[x] + own) / (text_counts + m)[:, None])
        feats["mean"] = np.stack(means, axis=1).astype(np.float32)
    return head.log_probs(head_input(feats, layers, head))
