"""The work counts of seqattn.pallas.traffic on layouts small enough to count by hand."""

import numpy as np
import pytest

from seqattn.pallas import layout_from_dense
from seqattn.pallas.traffic import layout_forward_work


def test_causal_counts_by_hand():
    # 4 blocks of 8: rows list [0], [0 1], [0 1 2], [0 1 2 3]; grid width 4. K/V index along the grid:
    # 0000 0111 0122 0123 -> 9 changes (the first included); the diagonal tile is the one partial tile.
    dense = np.tril(np.ones((32, 32), bool))[None, None]
    w = layout_forward_work(layout_from_dense(dense, block_q=8, block_kv=8), heads=1, kv_heads=1, head_dim=4,
                            itemsize=2)
    assert w.grid_steps == 16 and w.computed == 10 and w.kv_fetches == 9 and w.mask_fetches == 1
    assert w.q_fetches == 4
    assert w.hbm_bytes == 4 * 8 * (2 * 4 * 2 + 4) + 9 * 2 * 8 * 4 * 2 + 1 * 8 * 8


def test_gqa_heads_share_a_mask_and_fetch_their_own_kv(rng):
    dense = rng.random((2, 1, 40, 56)) < 0.2
    lay = layout_from_dense(dense, block_q=8, block_kv=16)
    one = layout_forward_work(lay, heads=1, kv_heads=1, head_dim=8)
    four = layout_forward_work(lay, heads=4, kv_heads=2, head_dim=8)
    assert four.computed == 4 * one.computed == 4 * int(np.asarray(lay.q_count).sum())
    assert four.grid_steps == 4 * one.grid_steps
    assert four.q_fetches == 4 * one.q_fetches
    assert one.kv_fetches <= four.kv_fetches <= 4 * one.kv_fetches


def test_rejects_heads_that_do_not_group():
    lay = layout_from_dense(np.ones((1, 2, 8, 8), bool), block_q=8, block_kv=8)
    with pytest.raises(ValueError, match="mask_heads=2"):
        layout_forward_work(lay, heads=4, kv_heads=4, head_dim=8)
    with pytest.raises(ValueError, match="kv_heads=3"):
        layout_forward_work(lay, heads=2, kv_heads=3, head_dim=8)


def test_empty_rows_repeat_the_previous_block_and_fetch_nothing():
    """A short first sequence in a padded batch: its last q block lists nothing. Its grid steps repeat the block
    the row before ended on (the layout contract), so they fetch nothing; pointed at the next row's first entry
    (the old rule) they would copy sequence 1's block for sequence 0, one extra K/V fetch per empty row."""
    dense = np.zeros((2, 1, 32, 32), bool)
    dense[0, :, :12, :12] = np.tril(np.ones((12, 12), bool))  # sequence 0: 12 tokens, q blocks 2 and 3 empty
    dense[1] = np.tril(np.ones((32, 32), bool))
    lay = layout_from_dense(dense, block_q=8, block_kv=8)
    count, start = np.asarray(lay.q_count), np.asarray(lay.q_start)
    assert count[2] == count[3] == 0 and start[2] == start[3] == start[1] + count[1] - 1
    listed_before = np.concatenate([[0], np.cumsum(count)[:-1]])
    old = lay._replace(q_start=np.minimum(listed_before, np.asarray(lay.q_kv).size - 1).astype(np.int32))
    new_work = layout_forward_work(lay, heads=1, kv_heads=1, head_dim=4)
    old_work = layout_forward_work(old, heads=1, kv_heads=1, head_dim=4)
    assert new_work.computed == old_work.computed == int(count.sum())
    assert new_work.kv_fetches == old_work.kv_fetches - 1  # the two empty rows: one change to sequence 1 saved
