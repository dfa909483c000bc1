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
