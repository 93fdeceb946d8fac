"""Label token sequences and the choice between first-token and full-sequence scoring.

Labels are tokenized as the model would emit them right after the generation prompt:
we tokenize `prompt + label` and keep the ids past the prompt's own ids, so a merge at
the boundary is seen. When every label is one token (and so all first tokens differ),
the logits of those tokens at the last prompt position decide. Otherwise (a label of
several tokens, or labels that share a first token) each label is scored as the sum of
the log-probabilities of its tokens.

In sequence mode the first token's log-probability is taken from the label rows only:
its normalizer (the log-sum-exp over the whole vocabulary at the last prompt position)
is the same for every label of an item, so it cancels in the softmax over labels and
never changes which label wins. Later tokens are normalized over the full vocabulary,
since each label's context differs there. Reported `scores` are therefore
log-probabilities up to one per-item constant; `probs` are exact.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from ..ground.errors import UserError

MODES = ("auto", "first-token", "sequence")


class LabelError(UserError, ValueError):
    pass


class NotItsLabels(LabelError):
    """Labels asked of a classifier that has its own (fine-tuned adapters, a sequence classifier's
    head). The kind does not know where the labels came from; the command that does (`--labels`, or
    a task file's `labels` field) says so with `where`."""

    def __init__(self, what: str, own: Sequence[str], asked: Sequence[str], fix: str):
        self.what, self.own, self.asked, self.fix = what, list(own), list(asked), fix
        super().__init__(self.where("the labels given", "give its own labels, or none"))

    def where(self, source: str, remedy: str) -> str:
        """The message with the labels' `source` named and its `remedy`."""
        return f"{self.what} has its own labels {self.own[:8]}; {source} are {self.asked[:8]}: {remedy} ({self.fix})"


# Trie nodes run in one packed pass per batch (a larger trie is split into chunks of at most
# this many nodes, each closed under ancestors). The pass's transient memory is about
# rows x nodes x (vocabulary floats for the log-softmax, taken LOGIT_ROWS positions at a time,
# + attention scores over cache + nodes); the batch planner counts the nodes as tokens of
# every row, so the token budget bounds it (see `kinds.labels.trie_logprobs`).
MAX_TRIE_NODES = 256


@dataclass(frozen=True)
class TrieChunk:
    """Part of the labels' token trie, closed under ancestors, run as one extra sequence per row.

    A node is a proper prefix of some label's token sequence (p_1 .. p_d); it feeds the
    token p_d at RoPE position prompt_end + d - 1 and its output predicts the next token.
    Nodes are in depth-first order, so a node's ancestors come before it: the tree mask is
    a subset of the causal one.
    """

    tokens: np.ndarray  # (T,) int32: the token each node feeds
    depth: np.ndarray  # (T,) int32: 0 for a label's first token
    visible: np.ndarray  # (T, T) bool: visible[i, j] iff node j is node i or one of its ancestors
    edge_node: np.ndarray  # (E,) int32: the node whose output predicts the edge's token
    edge_token: np.ndarray  # (E,) int32
    paths: np.ndarray  # (E, K) float64 0/1: label k's score sums the edges on its path
    labels: np.ndarray  # (K,) int64: indices of the labels scored in this chunk (each label in one chunk)

    def __len__(self) -> int:
        return len(self.tokens)


def build_trie(token_ids: Sequence[Sequence[int]], max_nodes: int = MAX_TRIE_NODES) -> list[TrieChunk]:
    """The labels' continuations (every token after the first) as trie chunks.

    Each label's path lies wholly in one chunk; a chunk holds at most `max_nodes` nodes
    unless one label alone needs more (its length - 1). Labels are taken in token order, so
    labels that share leading tokens share nodes. One-token labels need no node.
    """
    order = sorted((tuple(t), k) for k, t in enumerate(token_ids) if len(t) > 1)
    groups: list[tuple[dict[tuple[int, ...], int], list[int]]] = []
    nodes: dict[tuple[int, ...], int] = {}
    members: list[int] = []
    for toks, k in order:
        need = [toks[:d] for d in range(1, len(toks)) if toks[:d] not in nodes]
        if members and len(nodes) + len(need) > max_nodes:
            groups.append((nodes, members))
            nodes, members = {}, []
            need = [toks[:d] for d in range(1, len(toks))]
        for p in need:
            nodes[p] = len(nodes)
        members.append(k)
    if members:
        groups.append((nodes, members))
    chunks = []
    for nodes, members in groups:
        T = len(nodes)
        prefixes = sorted(nodes, key=nodes.get)
        visible = np.zeros((T, T), dtype=bool)
        for p, i in nodes.items():
            for d in range(1, len(p) + 1):
                visible[i, nodes[p[:d]]] = True
        edges: dict[tuple[int, int], int] = {}
        uses: list[tuple[int, int]] = []  # (edge, column)
        for col, k in enumerate(members):
            toks = tuple(token_ids[k])
            for d in range(1, len(toks)):
                e = edges.setdefault((nodes[toks[:d]], toks[d]), len(edges))
                uses.append((e, col))
        paths = np.zeros((len(edges), len(members)), dtype=np.float64)
        for e, col in uses:
            paths[e, col] = 1.0
        pairs = sorted(edges, key=edges.get)
        chunks.append(
            TrieChunk(
                tokens=np.array([p[-1] for p in prefixes], dtype=np.int32),
                depth=np.array([len(p) - 1 for p in prefixes], dtype=np.int32),
                visible=visible,
                edge_node=np.array([n for n, _ in pairs], dtype=np.int32),
                edge_token=np.array([t for _, t in pairs], dtype=np.int32),
                paths=paths,
                labels=np.array(members, dtype=np.int64),
            )
        )
    return chunks


@dataclass(frozen=True)
class LabelSet:
    labels: tuple[str, ...]
    token_ids: tuple[tuple[int, ...], ...]
    mode: str  # "first-token" or "sequence"
    max_trie_nodes: int = MAX_TRIE_NODES

    @property
    def first_ids(self) -> list[int]:
        return [t[0] for t in self.token_ids]

    @property
    def max_len(self) -> int:
        return max(len(t) for t in self.token_ids)

    @cached_property
    def trie(self) -> tuple[TrieChunk, ...]:
        """The label continuations as trie chunks (empty in first-token mode)."""
        if self.mode != "sequence":
            return ()
        return tuple(build_trie(self.token_ids, self.max_trie_nodes))

    @property
    def row_tokens(self) -> int:
        """Extra tokens each row runs for its labels in one pass (the largest chunk): the
        batch planner counts them against the token budget."""
        return max((len(c) for c in self.trie), default=0)


def parse_labels(text: str) -> list[str]:
    """Comma-separated labels from the command line; whitespace around each is dropped."""
    return [part.strip() for part in text.split(",")]


MIN_LABELS = 2  # a choice needs at least two labels

# What `label_problem` finds wrong with one label of a label set.
LABEL_NOT_STRING = "not a string"
LABEL_EMPTY = "empty"  # "" or only whitespace


def label_problem(label: Any) -> str | None:
    """The one rule for a single label: `LABEL_NOT_STRING`, `LABEL_EMPTY`, or None if it is a
    usable label. `validate` applies it to every label; a caller that checks only a request's or
    a file's shape (the HTTP request, a task file) applies it and words the problem its own way."""
    if not isinstance(label, str):
        return LABEL_NOT_STRING
    if not label.strip():
        return LABEL_EMPTY
    return None


def validate(labels: Sequence[str]) -> list[str]:
    """The labels as a list, checked: at least two, non-empty strings, none given twice (nor
    two that differ only in surrounding whitespace, which the command line and the service
    strip). One string is refused: iterating it would make each character a label."""
    if isinstance(labels, (str, bytes)):
        raise LabelError(
            f"labels must be a list of strings, got one {type(labels).__name__} {labels[:60]!r}: pass "
            f"a list, e.g. {parse_labels(labels)[:3] if isinstance(labels, str) else ['billing', 'technical']!r}"
        )
    try:
        labels = list(labels)
    except TypeError:
        raise LabelError(
            f"labels must be a list of strings, got {type(labels).__name__}: pass e.g. ['billing', 'technical']"
        ) from None
    if len(labels) < MIN_LABELS:
        raise LabelError(f"need at least two labels to choose from, got {labels!r}")
    for i, lab in enumerate(labels):
        problem = label_problem(lab)
        if problem == LABEL_NOT_STRING:
            raise LabelError(
                f'label {i + 1} is {type(lab).__name__} {lab!r}: labels must be strings, e.g. "{lab}" '
                f"(labels: {labels!r})"
            )
        if problem == LABEL_EMPTY:
            raise LabelError(f"label {i + 1} is empty: remove it or give it a name (labels: {labels!r})")
    seen: dict[str, int] = {}  # by the label without surrounding whitespace
    for i, lab in enumerate(labels):
        j = seen.setdefault(lab.strip(), i)
        if j != i and labels[j] == lab:
            raise LabelError(f"label {lab!r} is given twice (positions {j + 1} and {i + 1})")
        if j != i:
            raise LabelError(
                f"labels {labels[j]!r} (position {j + 1}) and {lab!r} (position {i + 1}) differ only in "
                "surrounding whitespace: give each label once, without spaces around it"
            )
    return labels


# What `gold_problem` finds wrong with a gold label (each caller words it with its own prefix and fix).
GOLD_MISSING = "missing"  # None, or only whitespace
GOLD_NOT_STRING = "not a string"  # e.g. a number from JSON or a pandas NaN
GOLD_SPACES = "spaces around it"  # ' billing' would be a label of its own beside 'billing'
GOLD_UNKNOWN = "not one of the labels"


def gold_problem(gold: Any, labels: Sequence[str] | None = None) -> str | None:
    """The one gold-label rule: what is wrong with `gold` as an item's gold label among `labels`
    (one of the `GOLD_*` kinds), or None if nothing is. A gold equal to one of the labels is
    always fine; else, in order: missing (None or blank), not a string, spaces around it, not one
    of the labels. `labels=None` checks the form only (before the label set is known).

    It returns a problem code, not a message: callers (task files, eval and calibration data, train,
    `gold_indices`) name the item their own way (file and line, item index) and say how to fix it."""
    if gold is None:
        return GOLD_MISSING
    if not isinstance(gold, str):
        return GOLD_NOT_STRING
    if labels is not None and gold in labels:
        return None
    if not gold.strip():
        return GOLD_MISSING
    if gold != gold.strip():
        return GOLD_SPACES
    return None if labels is None else GOLD_UNKNOWN


def tokenize_labels(tokenizer: Any, labels: Sequence[str], probe_prompt: str, sep: str = "") -> list[tuple[int, ...]]:
    """Ids of each label as emitted right after `probe_prompt` (a rendered prompt).

    `sep` goes between prompt and label: "" after a chat template's generation prompt, " "
    after a plain-text prompt such as "Category:" (a base model writes "Category: billing").
    """
    head = tokenizer(probe_prompt, add_special_tokens=False)["input_ids"]
    out = []
    for lab in labels:
        both = tokenizer(probe_prompt + sep + lab, add_special_tokens=False)["input_ids"]
        if both[: len(head)] == head and len(both) > len(head):
            ids = both[len(head) :]
        else:  # the label merged into the prompt's last token: fall back to the label alone
            ids = tokenizer(sep + lab, add_special_tokens=False)["input_ids"]
        out.append(tuple(int(i) for i in ids))
    return out


def build_labelset(tokenizer: Any, labels: Sequence[str], probe_prompt: str, mode: str = "auto") -> LabelSet:
    labels = validate(labels)
    if mode not in MODES:
        raise LabelError(f"scoring mode {mode!r} is not one of {', '.join(MODES)}")
    plain = not getattr(tokenizer, "chat_template", None) and not probe_prompt.endswith((" ", "\n"))
    ids = tokenize_labels(tokenizer, labels, probe_prompt, sep=" " if plain else "")
    for lab, t in zip(labels, ids):
        if not t:
            raise LabelError(f"label {lab!r} tokenizes to nothing")
    by_ids: dict[tuple[int, ...], str] = {}
    for lab, t in zip(labels, ids):
        if t in by_ids:
            raise LabelError(f"labels {by_ids[t]!r} and {lab!r} tokenize identically ({list(t)}): make them differ")
        by_ids[t] = lab
    firsts = [t[0] for t in ids]
    can_first = all(len(t) == 1 for t in ids) and len(set(firsts)) == len(firsts)
    if mode == "first-token" and not can_first:
        raise LabelError(
            "first-token scoring needs every label to be one distinct token; "
            f"token ids here: {dict(zip(labels, map(list, ids)))}. Use --scoring sequence (or auto)"
        )
    chosen = "first-token" if (mode == "first-token" or (mode == "auto" and can_first)) else "sequence"
    return LabelSet(tuple(labels), tuple(ids), chosen)


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def log_softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    m = x.max(axis=axis, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=axis, keepdims=True))


def check_none_label(none_label: Any, labels: Sequence[str]) -> str | None:
    """The label that means "none of these" (None: no such label), which must be one of `labels`
    and not the only other one: a `LabelError` naming the fix."""
    if none_label is None:
        return None
    if not isinstance(none_label, str) or none_label not in labels:
        raise LabelError(
            f"the none label {none_label!r} is not one of the labels {list(labels)[:8]}: add it to the labels (the "
            "answer that means none of these), or drop --none-label"
        )
    if len(labels) < 3:
        raise LabelError(f"with the none label {none_label!r} there must be at least two other labels to choose from")
    return none_label
