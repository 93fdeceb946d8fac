"""Label token sequences (`text/labels.py`): first-token or full-sequence scoring, the label and gold
rules, and the labels' token trie (pure logic, no model): what `build_trie` promises the packed pass.

Every label's later tokens are scored along its own path of (node, next token) edges; a
node sees exactly its ancestors; chunks are closed under ancestors and bounded in size
(the batch planner counting the trie's tokens in every row's budget is in test_batching.py).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer

from mlx_slm.text.labels import LabelError, LabelSet, build_labelset, build_trie, parse_labels, softmax
from mlx_slm.text.prompts import PromptFormat, render

# Label token sequences: 1-8 tokens over a small alphabet, so shared prefixes are common.
labelsets = st.lists(
    st.lists(st.integers(0, 6), min_size=1, max_size=8).map(tuple), min_size=2, max_size=60, unique=True
)


def _check_chunks(token_ids, chunks, max_nodes):
    seen = []
    for c in chunks:
        T = len(c)
        # Depth-first order: a node's ancestors come first, so the tree mask is within the causal one.
        assert np.array_equal(c.visible, np.tril(c.visible)) and c.visible.diagonal().all()
        # A node at depth d sees exactly d + 1 nodes (itself and its ancestors), one per depth.
        for i in range(T):
            seen_depths = sorted(c.depth[c.visible[i]].tolist())
            assert seen_depths == list(range(c.depth[i] + 1))
        need = max(len(token_ids[k]) - 1 for k in c.labels)
        assert T <= max(max_nodes, need)
        for col, k in enumerate(c.labels):
            toks = token_ids[k]
            edges = np.flatnonzero(c.paths[:, col])
            assert len(edges) == len(toks) - 1  # one edge per later token
            # The edges along the path feed toks[0..n-2] and predict toks[1..n-1], in order of depth.
            by_depth = sorted(edges, key=lambda e: c.depth[c.edge_node[e]])
            assert [int(c.edge_token[e]) for e in by_depth] == list(toks[1:])
            assert [int(c.tokens[c.edge_node[e]]) for e in by_depth] == list(toks[:-1])
            leaf = c.edge_node[by_depth[-1]]
            assert [int(t) for t in c.tokens[c.visible[leaf]]] == list(toks[:-1])  # the leaf sees the label's prefix
        seen.extend(int(k) for k in c.labels)
    multi = sorted(k for k, t in enumerate(token_ids) if len(t) > 1)
    assert sorted(seen) == multi  # every multi-token label in exactly one chunk; one-token labels in none


@settings(max_examples=200, deadline=None)
@given(labelsets, st.integers(1, 40))
def test_trie_paths_chunks_and_masks(token_ids, max_nodes):
    chunks = build_trie(token_ids, max_nodes)
    _check_chunks(token_ids, chunks, max_nodes)


@settings(max_examples=100, deadline=None)
@given(labelsets)
def test_one_chunk_shares_every_common_prefix(token_ids):
    chunks = build_trie(token_ids, max_nodes=10_000)
    assert len(chunks) <= 1
    proper = {t[:d] for t in token_ids for d in range(1, len(t))}
    assert sum(len(c) for c in chunks) == len(proper)  # a prefix shared by several labels is one node


def test_shared_leading_tokens_are_run_once():
    ids = [(1, 2, 3, 4), (1, 2, 3, 5), (1, 2, 6), (1, 7), (1,), (8,)]
    (c,) = build_trie(ids)
    # Nodes are the proper prefixes (1), (1, 2), (1, 2, 3): three tokens run for four multi-token labels.
    assert c.tokens.tolist() == [1, 2, 3] and c.depth.tolist() == [0, 1, 2]
    assert c.labels.tolist() == [0, 1, 2, 3]
    # Edges (node, next token): shared ones once (6 distinct for 9 label tokens after the first).
    assert sorted(zip(c.edge_node.tolist(), c.edge_token.tolist())) == [(0, 2), (0, 7), (1, 3), (1, 6), (2, 4), (2, 5)]
    assert c.paths.sum(axis=0).tolist() == [3, 3, 2, 1]


def test_labelset_trie_only_in_sequence_mode():
    ls = LabelSet(("a", "b"), ((1,), (2,)), "first-token")
    assert ls.trie == () and ls.row_tokens == 0
    ls = LabelSet(("a", "ab", "abc"), ((1,), (1, 2), (1, 2, 3)), "sequence")
    assert ls.row_tokens == 2 and len(ls.trie) == 1


@pytest.fixture(scope="module")
def tok(tiny_qwen_hf):
    return AutoTokenizer.from_pretrained(str(tiny_qwen_hf))


def test_labels_first_token_mode(tok):
    ls = build_labelset(tok, ["a", "b", "c"], render(tok, PromptFormat(), "x"))
    assert ls.mode == "first-token" and all(len(t) == 1 for t in ls.token_ids)


def test_labels_sequence_mode_when_first_tokens_are_shared(tok):
    ls = build_labelset(tok, ["refund request", "refund status"], render(tok, PromptFormat(), "x"))
    assert ls.mode == "sequence"
    assert ls.token_ids[0][0] == ls.token_ids[1][0]


@pytest.mark.parametrize(
    "labels, msg",
    [(["a", ""], "empty"), (["a", "a"], "twice"), (["a"], "at least two"), ([" a", "  "], "empty")],
)
def test_bad_labels_refused(tok, labels, msg):
    with pytest.raises(LabelError, match=msg):
        build_labelset(tok, labels, render(tok, PromptFormat(), "x"))


def test_first_token_mode_refused_for_multi_token_labels(tok):
    with pytest.raises(LabelError, match="sequence"):
        build_labelset(tok, ["refund request", "refund status"], render(tok, PromptFormat(), "x"), "first-token")


def test_parse_labels_and_softmax():
    assert parse_labels(" billing, technical ,account") == ["billing", "technical", "account"]
    p = softmax([1.0, 1.0])
    assert p.tolist() == [0.5, 0.5]


def test_base_model_labels_follow_the_prompt_after_a_space(tmp_path):
    """Without a chat template the prompt ends "Category:", and a model writes " billing"."""
    from mlx_slm.text.labels import build_labelset
    from tests.conftest import make_tokenizer

    tok = make_tokenizer(tmp_path)
    tok.chat_template = None
    probe = render(tok, PromptFormat("Sort.", "Ticket: {text}\nCategory:"), "example")
    assert probe.endswith("Category:")
    ls = build_labelset(tok, ["billing", "technical"], probe)
    for lab, ids in zip(ls.labels, ls.token_ids):
        assert tok.decode(list(ids)) == " " + lab


def test_one_home_for_label_and_gold_rules():
    """labels.py holds the rules every caller words its own way: a label, a label set, a gold label."""
    from mlx_slm.text.labels import (
        GOLD_MISSING,
        GOLD_NOT_STRING,
        LABEL_EMPTY,
        LABEL_NOT_STRING,
        MIN_LABELS,
        gold_problem,
        label_problem,
    )

    assert MIN_LABELS == 2
    assert (
        label_problem("billing") is None and label_problem(" ") == LABEL_EMPTY and label_problem(3) == LABEL_NOT_STRING
    )
    labels = ["billing", "technical"]
    assert gold_problem("billing", labels) is None and gold_problem(None, labels) == GOLD_MISSING
    assert gold_problem(["billing"], labels) == GOLD_NOT_STRING
    for bad in ("", " billing", "account"):
        assert gold_problem(bad, labels) is not None
    assert gold_problem("anything", None) is None and gold_problem(" x", None) is not None
