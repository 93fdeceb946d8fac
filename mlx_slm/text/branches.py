"""Several questions about one text in one pass: the text's tokens once, each question a branch.

Every question's full prompt is rendered and tokenized whole (a BPE merge may cross the
boundary between the text and the question, so tokenizing the question alone could give
ids no real prompt holds). The tokens all of one text's question prompts share (capped so
that each question keeps at least its last token), the text part, run once, causally, after
the shared prompt head from the prefix cache. What is left of each prompt, the question's
own tokens, then its options' token trie, runs as one branch of a tree after it, every
branch of a row in the same forward as the row's text part (its trunk):

    row r:  [shared head (prefix KV)] | text part | q1 tokens, q1 trie | q2 ... | pad
                                                    └ sees the head, the text part and its own ancestors only

A branch token sees the row's cached keys (the head), its text part and its own branch's
earlier tokens, never another branch (`visible`, a per-row tree mask), at the RoPE position
it has in its question's own prompt (`positions`). So each answer is the one that question's
prompt gets alone; `kinds.questions.QuestionsKind.score` runs the packs (more branch tokens
than `MAX_PASS_TOKENS` a row: further passes after the first one's keys, seeing the text part).

Pure planning here (no model): rendering, the split, and packing branches into passes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .labels import LabelSet, build_labelset
from .prompts import PromptFormat, common_prefix, render, shared_prefix, tokenize
from .questions import QUESTION_PLACEHOLDER, Question, QuestionError, check_questions, check_template, user_turn

# Branch tokens (question tokens + option trie nodes) run per row in one pass; more are split
# into further passes over the same KV. The batch planner counts a pass's tokens in every row.
MAX_PASS_TOKENS = 1024


@dataclass(frozen=True)
class Block:
    """One branch's settings: which question it answers, its prompt format and its options
    (scored by their tokens, or by a learned head on the branch's hidden states)."""

    question: int  # index into the plan's questions
    fmt: PromptFormat
    options: LabelSet
    head: Any = None  # a `heads.Head` reading the text's own prompt

    @property
    def nodes(self) -> int:
        return sum(len(c) for c in self.options.trie)


@dataclass
class Pack:
    """Some branches of every row of a batch, laid out for one pass (positions relative to
    the row's end of text; padding at the right sees only itself)."""

    blocks: list[int]  # which blocks (indices into the plan's blocks) this pack runs
    ids: np.ndarray  # (B, T) int32
    positions: np.ndarray  # (B, T) int32, 0 = the first token after the text part
    visible: np.ndarray  # (B, T, T) bool: a branch token sees itself and its ancestors
    answer_at: np.ndarray  # (B, K) int: each block's last question token (where options' first tokens are read)
    node_at: np.ndarray  # (B, N) int: every trie node of every block, block by block
    chain_len: np.ndarray  # (B, K) int: each block's own prompt tokens (a head's mean covers them)

    @property
    def tokens(self) -> int:
        return int(self.ids.size)


class QuestionPlan:
    """How a classifier asks its questions: the blocks (one per question, one per label of a
    `multi` question), the split of each text's prompts, and the packs of branches."""

    def __init__(self, tokenizer: Any, questions: Sequence[Question], system: str | None, template: str):
        check_template(template)
        self.questions = check_questions(questions)
        self.tokenizer = tokenizer
        blocks = []
        for qi, q in enumerate(self.questions):
            if "{text}" in q.question:
                raise QuestionError(f"question {q.name!r} holds {{text}}: the text goes in the template")
            for wording, options in q.blocks():
                if q.head is not None:  # the text's own prompt, as the head was trained on
                    fmt = PromptFormat(system, template.replace(QUESTION_PLACEHOLDER, ""))
                    blocks.append(Block(qi, fmt, LabelSet(tuple(options), tuple(() for _ in options), "head"), q.head))
                    continue
                fmt = PromptFormat(system, user_turn(template, "{text}", wording))
                ls = build_labelset(tokenizer, options, render(tokenizer, fmt, "example"), "auto")
                if q.type.yes_no and ls.mode != "first-token":
                    raise QuestionError(
                        f"question {q.name!r}: the answer words {list(options)} are not one token each in this "
                        f"model's tokenizer ({[list(t) for t in ls.token_ids]}): give one-token words as 'answers'"
                    )
                blocks.append(Block(qi, fmt, ls))
        self.blocks: tuple[Block, ...] = tuple(blocks)
        # Every prompt starts with this (system and template head): its KV is the prefix cache's.
        self.head = shared_prefix(tokenizer, self.blocks[0].fmt)
        probe = [tokenize(tokenizer, [render(tokenizer, b.fmt, "example text")])[0] for b in self.blocks]
        # Each question's prompt with a two-word text and its longest option (`check_fits`).
        self.fixed = [len(p) + b.options.max_len - 1 for p, b in zip(probe, self.blocks)]
        cut = branch_cut(probe)
        # Tokens a row runs after its text part, per pass: what the batch planner budgets.
        self.groups = pass_groups([len(p) - cut + b.nodes for p, b in zip(probe, self.blocks)])
        self.row_extra = max(sum(len(probe[i]) - cut + self.blocks[i].nodes for i in g) for g in self.groups)
        # The longest option after its own prompt: what each prompt must leave room for.
        self.label_extra = max(0, max(b.options.max_len - 1 for b in self.blocks))
        # Heads' layers: the text part's hidden states there are kept (a mean covers them too).
        self.head_layers = sorted({x for b in self.blocks if b.head is not None for x in b.head.layers})
        self.head_means = any("mean" in b.head.poolings for b in self.blocks if b.head is not None)

    def check_fits(self, max_length: int) -> None:
        """A question whose prompt is over the context with a two-word text could be asked of no
        text: one `QuestionError` naming it, before any work (not an error row per text)."""
        for n, b in zip(self.fixed, self.blocks):
            if n > max_length:
                q = self.questions[b.question]
                raise QuestionError(
                    f"question {q.name!r}: its prompt alone (system, template, question and its longest answer) "
                    f"is {n} tokens with a two-word text, over the model's context of {max_length}: shorten the "
                    "question (or its labels and descriptions, or --system/--template)"
                )

    # ------------------------------------------------------------------ texts to tokens
    def split(self, texts: Sequence[str]) -> list[tuple[list[int], list[list[int]]]]:
        """Per text: (the tokens all its question prompts share, each block's own tokens after them)."""
        nb = len(self.blocks)
        ids = tokenize(self.tokenizer, [render(self.tokenizer, b.fmt, t) for t in texts for b in self.blocks])
        out = []
        for i in range(len(texts)):
            mine = ids[i * nb : (i + 1) * nb]
            cut = branch_cut(mine)
            out.append((mine[0][:cut], [p[cut:] for p in mine]))
        return out

    def longest(self, common: Sequence[int], chains: Sequence[Sequence[int]]) -> int:
        """Tokens of the longest full question prompt with its longest option: what must fit the context."""
        return len(common) + max(len(c) + b.options.max_len - 1 for c, b in zip(chains, self.blocks))

    # ------------------------------------------------------------------ packing
    def packs(
        self,
        chains: Sequence[Sequence[Sequence[int]]],
        pad_id: int,
        trunks: Sequence[Sequence[int]] | None = None,
    ) -> list[Pack]:
        """The branches of a batch's rows (`chains[r][b]`: row r's tokens for block b), in passes;
        `trunks[r]`: row r's text part, run causally in the first pass before its branches."""
        return [self._pack(g, chains, pad_id, trunks if i == 0 else None) for i, g in enumerate(self.groups)]

    def _pack(
        self,
        group: list[int],
        chains: Sequence[Sequence[Sequence[int]]],
        pad_id: int,
        trunks: Sequence[Sequence[int]] | None = None,
    ) -> Pack:
        rows = [[(chains[r][b], self.blocks[b].options) for b in group] for r in range(len(chains))]
        return pack_branches(rows, pad_id, group, trunks)

    # ------------------------------------------------------------------ scores to answers
    def answers(self, scores: Sequence[np.ndarray]) -> list[dict[str, dict[str, Any]]]:
        """Per row, {question name: answer}, from each block's (B, options) scores."""
        B = len(scores[0]) if scores else 0
        by_q: dict[int, list[int]] = {}
        for i, b in enumerate(self.blocks):
            by_q.setdefault(b.question, []).append(i)
        return [
            {q.name: q.answer([scores[i][r] for i in by_q[qi]]) for qi, q in enumerate(self.questions)}
            for r in range(B)
        ]


def pack_branches(
    rows: Sequence[Sequence[tuple[Sequence[int], LabelSet]]],
    pad_id: int,
    blocks: Sequence[int] = (),
    trunks: Sequence[Sequence[int]] | None = None,
) -> Pack:
    """One pass of branches: `rows[r]` lists row r's branches (its question tokens, and the
    options whose trie nodes follow them), each row its own (a row may have fewer, or none:
    padding). What the questions kind packs (every row the same blocks) and what decisions
    pack (each request its own questions). `blocks`: the plan's block indices, recorded.
    `trunks[r]`: tokens row r runs first, causally, that all its branches see (the rest of a
    state, run in the same pass as its questions); positions count from the trunk's start."""
    B = len(rows)
    tl = [len(trunks[r]) if trunks is not None else 0 for r in range(B)]
    lens = [tl[r] + sum(len(chain) + sum(len(c) for c in ls.trie) for chain, ls in row) for r, row in enumerate(rows)]
    T = max(max(lens, default=0), 1)
    K = max((len(row) for row in rows), default=0)
    N = max((sum(sum(len(c) for c in ls.trie) for _, ls in row) for row in rows), default=0)
    ids = np.full((B, T), pad_id, dtype=np.int32)
    pos = np.zeros((B, T), dtype=np.int32)
    vis = np.broadcast_to(np.eye(T, dtype=bool), (B, T, T)).copy()
    answer_at = np.zeros((B, K), dtype=np.int64)
    chain_len = np.zeros((B, K), dtype=np.int64)
    node_at = np.zeros((B, N), dtype=np.int64)
    for r, row in enumerate(rows):
        t = tl[r]
        if t:
            ids[r, :t] = trunks[r]  # type: ignore[index]
            pos[r, :t] = np.arange(t)
            vis[r, :t, :t] = np.tril(np.ones((t, t), dtype=bool))
        at, n_at = t, 0
        for k, (chain, options) in enumerate(row):
            m, start = len(chain), at
            ids[r, at : at + m] = chain
            pos[r, at : at + m] = t + np.arange(m)
            vis[r, at : at + m, at : at + m] = np.tril(np.ones((m, m), dtype=bool))
            vis[r, at : at + m, :t] = True
            answer_at[r, k], chain_len[r, k] = at + m - 1, m
            at += m
            for c in options.trie:  # nodes see the trunk, the whole chain and their own ancestors
                n = len(c)
                ids[r, at : at + n] = c.tokens
                pos[r, at : at + n] = t + m + c.depth
                vis[r, at : at + n, :t] = True
                vis[r, at : at + n, start : start + m] = True
                vis[r, at : at + n, at : at + n] = c.visible
                node_at[r, n_at : n_at + n] = np.arange(at, at + n)
                at, n_at = at + n, n_at + n
    return Pack(list(blocks), ids, pos, vis, answer_at, node_at, chain_len)


def branch_cut(prompts: Sequence[Sequence[int]]) -> int:
    """Where prompts of one text split into the start they share (run once, the trunk) and each
    one's own tokens (its branch): at their common prefix, but at least one token short of the
    shortest, so every branch keeps a last position to answer from."""
    return min(len(common_prefix(prompts)), min(len(p) for p in prompts) - 1)


def pass_groups(sizes: Sequence[int], cap: int = MAX_PASS_TOKENS) -> list[list[int]]:
    """Consecutive blocks cut into passes of at most `cap` tokens a row (a block alone may exceed it)."""
    groups: list[list[int]] = [[]]
    total = 0
    for i, n in enumerate(sizes):
        if groups[-1] and total + n > cap:
            groups.append([])
            total = 0
        groups[-1].append(i)
        total += n
    return groups
