"""Several questions per text in one pass: the text part once, each question a branch after it.

The plan (`branches.QuestionPlan`) splits each text's question prompts into the tokens they
share (the batch row) and each question's own tokens; `Engine.encode` runs the rows, then
`branch_scores` runs every question's tokens and its options' trie as branches of a per-row
tree after them, and `Question.answer` reads each answer (a learned head question reads its
branch's hidden states). Calibration and abstain are per question (`answers.QuestionCalibration`).
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
    count,
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
        plan = self.plan
        skip = 0 if prefix is not None else self.pool_from  # a head's mean covers the prompt after its shared head
        kv, sums, counts = self.engine.encode(batch, prefix, plan.head_layers if plan.head_means else (), skip)
        scores: list[np.ndarray] = [np.empty(0)] * len(plan.blocks)
        ran = 0
        p = len(prefix) if prefix is not None else 0
        for pack in plan.packs([it.chains for it in items], self.engine.pad_id):
            got = branch_scores(self.engine, kv, batch, p, pack, [plan.blocks[b] for b in pack.blocks], sums, counts)
            for b, s in zip(pack.blocks, got):
                scores[b] = s
            ran += pack.tokens
        count(st, batch, ran)
        return [
            Prediction(
                item.index, n_tokens=len(item.ids) + sum(map(len, item.chains)), truncated=item.truncated, answers=ans
            )
            for item, ans in zip(items, plan.answers(scores))
        ]


# --------------------------------------------------------------------------- one pass of branches


def branch_scores(
    engine: Engine,
    kv: list[KV],
    batch: Batch,
    prefix_len: int,
    pack: Any,
    blocks: Sequence[Any],
    text_sums: dict[int, np.ndarray] | None = None,
    text_counts: np.ndarray | None = None,
) -> list[np.ndarray]:
    """Each block's option scores (B, options) from one pass over a pack of branches
    (`branches.Pack`) after the rows' KV: an option's first-token logit (label rows only:
    the normalizer is one per block and row, and cancels in its softmax) plus the exact
    log-probabilities of its later tokens from its trie nodes, as the labels kind does for
    one prompt. `blocks[k]` is the `branches.Block` of the pack's k-th block. A block with a
    learned head reads its branch's hidden states instead (the last position, and for a
    mean the text part's `text_sums` / `text_counts` from `encode` joined with the branch's
    own tokens): the head's log-probabilities."""
    B, L = batch.ids.shape
    cache_mask = engine.cache_mask(batch, prefix_len)
    end = batch.offsets.astype(np.int32) + L  # each row's position after its text part
    layers = sorted({x for b in blocks if b.head is not None for x in b.head.layers})
    collect: dict[int, Any] | None = dict.fromkeys(layers) if layers else None
    options = [b.options if b.head is None else None for b in blocks]
    with engine.lock:
        h = engine.continue_after(
            kv, cache_mask, pack.ids, positions=end[:, None] + pack.positions, tree=pack.visible, collect=collect
        )
        got = option_scores(engine, h, pack, [options] * B)
        out = [
            np.stack([got[r][k] for r in range(B)]) if o is not None else np.zeros((B, 0))
            for k, o in enumerate(options)
        ]
        if collect:
            hidden = {layer: np.array(v.astype(mx.float32)) for layer, v in collect.items()}
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
