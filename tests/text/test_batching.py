import numpy as np
import pytest

from mlx_slm.text.batching import pad, padding_stats, plan


def test_plan_covers_every_item_once():
    lengths = [5, 1, 9, 3, 3, 7, 2, 8]
    batches = plan(lengths, batch_size=3)
    got = np.concatenate(batches)
    assert sorted(got.tolist()) == list(range(len(lengths)))
    assert all(len(b) <= 3 for b in batches)


def test_sorted_batches_are_ascending_and_stable():
    lengths = [4, 2, 4, 2, 9]
    flat = np.concatenate(plan(lengths, batch_size=2)).tolist()
    assert flat == [1, 3, 0, 2, 4]  # equal lengths keep input order


def test_no_sort_keeps_input_order():
    flat = np.concatenate(plan([4, 2, 9, 1], batch_size=3, sort=False)).tolist()
    assert flat == [0, 1, 2, 3]


def test_token_budget_caps_rows_times_longest():
    lengths = [10] * 10 + [50, 60]
    batches = plan(lengths, batch_size=32, max_tokens=40)
    for b in batches:
        longest = max(lengths[i] for i in b)
        assert len(b) * longest <= 40 or len(b) == 1
    assert [len(b) for b in batches] == [4, 4, 2, 1, 1]


def test_pad_left_aligns_last_token_and_offsets():
    seqs = [[1, 2, 3], [4], [5, 6]]
    b = pad(seqs, np.array([0, 1, 2]), pad_id=0, cache_len=10)
    assert b.ids.tolist() == [[1, 2, 3], [0, 0, 4], [0, 5, 6]]
    assert b.mask.tolist() == [[True] * 3, [False, False, True], [False, True, True]]
    # the first real token of each row sits at position 10, as it would unbatched
    assert b.offsets.tolist() == [10, 8, 9]
    assert (b.real_tokens, b.padded_tokens) == (6, 9)


def test_padding_stats():
    lengths = [1, 2, 3, 10]
    assert padding_stats(lengths, [np.array([0, 1, 2, 3])]) == (16, 40)
    assert padding_stats(lengths, plan(lengths, batch_size=2)) == (16, 4 + 20)


@pytest.mark.parametrize("bad", [dict(batch_size=0), dict(max_tokens=0)])
def test_plan_rejects_bad_settings(bad):
    with pytest.raises(ValueError):
        plan([1, 2], **bad)


# --------------------------------------------------------------------------- the padding bound (issue 40)
def _runs(lengths, batches, row_extra=0):
    return sum(len(b) * (max(lengths[i] for i in b) + row_extra) for b in batches)


@pytest.mark.parametrize("row_extra", [0, 3])
def test_max_padding_bounds_every_batchs_padding(row_extra):
    """Each batch's padding is at most the share of the tokens it runs (a row alone: none), so a
    plan of short rows of varied lengths runs at most 1 / (1 - share) its rows' own tokens."""
    from mlx_slm.text.batching import MAX_PADDING

    rng = np.random.default_rng(0)
    for _ in range(50):
        lengths = rng.integers(1, 40, size=rng.integers(1, 120)).tolist()
        batches = plan(lengths, batch_size=32, max_tokens=None, row_extra=row_extra, max_padding=MAX_PADDING)
        assert sorted(np.concatenate(batches).tolist()) == list(range(len(lengths)))
        for b in batches:
            runs = len(b) * (max(lengths[i] for i in b) + row_extra)
            assert runs - sum(lengths[i] + row_extra for i in b) <= MAX_PADDING * runs
        real = sum(lengths) + row_extra * len(lengths)
        assert _runs(lengths, batches, row_extra) <= real / (1 - MAX_PADDING)


def test_twenty_four_short_rows_are_cut_by_padding_not_run_as_one_batch():
    """The reranker's short documents of issue 40: one batch padded them to the longest (1.16x
    the floor on Qwen3-Reranker); the bound cuts the batch where the padding would pass 10 %."""
    lengths = [26, 31, 27, 44, 29, 35, 52, 28, 30, 26, 61, 33, 27, 38, 29, 47, 30, 26, 34, 40, 28, 55, 31, 36]
    one = plan(lengths, batch_size=32, max_tokens=None)
    assert len(one) == 1 and _runs(lengths, one) / sum(lengths) > 1.5
    cut = plan(lengths, batch_size=32, max_tokens=None, max_padding=0.1)
    assert _runs(lengths, cut) / sum(lengths) <= 1.1 and len(cut) <= 6


def test_classify_plans_are_no_worse_with_the_bound():
    """Classify's default plan (32 rows, 512 tokens) on the workload's long-tailed prompt
    lengths is the same with the bound (its budget already keeps rows of a length together); a
    plan without a token budget runs fewer tokens, in at most a few more batches."""
    from mlx_slm.text.batching import MAX_PADDING

    rng = np.random.default_rng(1)
    lengths = np.clip(rng.lognormal(4.2, 0.5, size=1024).astype(int), 20, 420).tolist()
    for bs, budget in ((32, 512), (8, None), (32, 2048)):
        before = plan(lengths, bs, budget)
        after = plan(lengths, bs, budget, max_padding=MAX_PADDING)
        assert _runs(lengths, after) <= _runs(lengths, before)
        assert len(after) <= len(before) + max(2, len(before) // 10), (bs, budget, len(before), len(after))
    same = plan(lengths, 32, 512)
    assert [b.tolist() for b in plan(lengths, 32, 512, max_padding=MAX_PADDING)] == [b.tolist() for b in same]


def test_max_padding_out_of_range_is_refused():
    for bad in (-0.1, 1.0, 2):
        with pytest.raises(ValueError, match="max_padding"):
            plan([1, 2], max_padding=bad)


def test_plan_counts_the_trie_in_every_row():
    lengths = [10] * 20
    assert [len(b) for b in plan(lengths, 32, max_tokens=100)] == [10, 10]
    assert [len(b) for b in plan(lengths, 32, max_tokens=100, row_extra=40)] == [2] * 10  # 2 x (10 + 40) = 100
    assert [len(b) for b in plan(lengths, 32, max_tokens=100, row_extra=500)] == [1] * 20  # a row alone may exceed it
    with pytest.raises(ValueError):
        plan(lengths, 32, max_tokens=100, row_extra=-1)
