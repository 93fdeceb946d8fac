"""Length-bucketed batch planning: pure numpy, no model.

At batch size 1 a small model streams every weight to serve one sequence; batching
amortizes that, but padding a batch to a long outlier wastes compute. So: sort by
length, cut batches by a token budget (rows x longest row, padding included) and a
maximum row count, left-pad each batch only to its own longest row (the last real
token then sits at index -1 of every row), and give each row the RoPE offset that
keeps its real tokens at their unbatched positions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

# The most padding an inference batch holds, as a share of the tokens it runs (`plan`'s
# `max_padding`; the pipeline plans with it): a plan then runs at most 1 / (1 - 0.1) = 1.11x its
# rows' own tokens, as docs/rerank.md promises a reranker's short documents (at most 1.15x).
MAX_PADDING = 0.1


@dataclass
class Batch:
    """One padded batch. `indices` are positions in the planner's input list."""

    indices: np.ndarray  # (B,) int64
    ids: np.ndarray  # (B, L) int32, left padded
    mask: np.ndarray  # (B, L) bool, True for real tokens
    offsets: np.ndarray  # (B,) int32: cache length minus the row's padding

    @property
    def real_tokens(self) -> int:
        return int(self.mask.sum())

    @property
    def padded_tokens(self) -> int:
        return int(self.ids.size)


def plan(
    lengths: Sequence[int],
    batch_size: int = 32,
    max_tokens: int | None = None,
    sort: bool = True,
    row_extra: int = 0,
    max_padding: float | None = None,
) -> list[np.ndarray]:
    """Group item indices into batches.

    sort: order by length (stable, so equal lengths keep input order) before cutting.
    max_tokens: cap on rows x (longest row + row_extra) per batch; a single longer item gets
        its own batch. row_extra: tokens every row runs besides its prompt (a label trie).
    max_padding: cap on a batch's padding, as a share of the tokens it runs (rows x (longest
        row + row_extra)): a batch is cut before the row that would take it over, so the padding
        of a whole plan is at most that share of its tokens (`MAX_PADDING`: what inference plans
        with). Short rows of varied lengths are what it cuts: their padding is a large share.
    """
    if batch_size < 1:
        raise ValueError("batch_size must be at least 1")
    if max_tokens is not None and max_tokens < 1:
        raise ValueError("max_tokens must be at least 1")
    if row_extra < 0:
        raise ValueError("row_extra must be at least 0")
    if max_padding is not None and not 0.0 <= max_padding < 1.0:
        raise ValueError("max_padding must be a share from 0 to below 1")
    lengths = np.asarray(lengths, dtype=np.int64)
    order = np.argsort(lengths, kind="stable") if sort else np.arange(len(lengths))
    batches: list[np.ndarray] = []
    cur: list[int] = []
    longest, total = 0, 0  # the batch's longest row and its rows' tokens
    for i in order:
        n = int(lengths[i])
        new_longest = max(longest, n)
        runs = (len(cur) + 1) * (new_longest + row_extra)  # what the batch would run with row i
        too_many = len(cur) >= batch_size
        too_big = max_tokens is not None and cur and runs > max_tokens
        too_padded = (
            max_padding is not None and cur and runs - (total + n + (len(cur) + 1) * row_extra) > max_padding * runs
        )
        if cur and (too_many or too_big or too_padded):
            batches.append(np.array(cur, dtype=np.int64))
            cur, new_longest, total = [], n, 0
        cur.append(int(i))
        longest, total = new_longest, total + n
    if cur:
        batches.append(np.array(cur, dtype=np.int64))
    return batches


def pad(seqs: Sequence[Sequence[int]], indices: np.ndarray, pad_id: int, cache_len: int | np.ndarray = 0) -> Batch:
    """Left-pad `seqs[indices]` to the longest; offsets put real tokens after `cache_len` (one
    length for every row, or each row's own (B,): rows continuing prefixes of their own)."""
    rows = [seqs[i] for i in indices]
    L = max(len(r) for r in rows)
    ids = np.full((len(rows), L), pad_id, dtype=np.int32)
    mask = np.zeros((len(rows), L), dtype=bool)
    for r, s in enumerate(rows):
        if len(s):
            ids[r, L - len(s) :] = s
            mask[r, L - len(s) :] = True
    pads = L - np.array([len(r) for r in rows], dtype=np.int32)
    return Batch(np.asarray(indices, dtype=np.int64), ids, mask, (cache_len - pads).astype(np.int32))


def padding_stats(lengths: Sequence[int], batches: Sequence[np.ndarray]) -> tuple[int, int]:
    """(real tokens, padded tokens) for a plan."""
    lengths = np.asarray(lengths)
    real = int(lengths.sum())
    padded = int(sum(len(b) * lengths[b].max() for b in batches))
    return real, padded
