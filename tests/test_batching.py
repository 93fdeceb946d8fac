import numpy as np
import pytest

from mlx_slm.batching import pad, padding_stats, plan


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
