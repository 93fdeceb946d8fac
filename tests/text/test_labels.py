"""The labels' token trie (pure logic, no model): what `build_trie` promises the packed pass.

Every label's later tokens are scored along its own path of (node, next token) edges; a
node sees exactly its ancestors; chunks are closed under ancestors and bounded in size;
and the batch planner counts the trie's tokens in every row's budget.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlx_slm.text.batching import plan
from mlx_slm.text.labels import LabelSet, build_trie

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


def test_plan_counts_the_trie_in_every_row():
    lengths = [10] * 20
    assert [len(b) for b in plan(lengths, 32, max_tokens=100)] == [10, 10]
    assert [len(b) for b in plan(lengths, 32, max_tokens=100, row_extra=40)] == [2] * 10  # 2 x (10 + 40) = 100
    assert [len(b) for b in plan(lengths, 32, max_tokens=100, row_extra=500)] == [1] * 20  # a row alone may exceed it
    with pytest.raises(ValueError):
        plan(lengths, 32, max_tokens=100, row_extra=-1)
