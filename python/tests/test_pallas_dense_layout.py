"""seqattn.pallas.layout's reference builder: the lists and tiles rebuild the dense mask, both ways round."""

import numpy as np
import pytest

from seqattn.pallas import dense_from_layout, layout_from_dense, validate
from seqattn.pallas.layout import fetch_indices


@pytest.mark.parametrize("block_q,block_kv", [(8, 8), (16, 8), (8, 32)])
def test_round_trip_on_random_masks(rng, block_q, block_kv):
    for _ in range(6):
        b, hm, sq, skv = 2, int(rng.integers(1, 3)), int(rng.integers(1, 70)), int(rng.integers(1, 70))
        dense = rng.random((b, hm, sq, skv)) < rng.choice([0.05, 0.4])
        dense[:, :, :, : skv // 3] |= np.tril(np.ones((sq, skv // 3), bool))  # some full tiles
        dense[:, :, sq // 2] = False  # a fully masked row
        lay = layout_from_dense(dense, block_q=block_q, block_kv=block_kv)
        validate(lay)
        assert (dense_from_layout(lay) == dense).all()
        assert (dense_from_layout(lay, key_major=True) == dense).all()
        assert lay.shape.q_width == max(1, int(lay.q_count.max()))
        tiles = lay.q_tiles.reshape(lay.q_tiles.shape[0], -1)
        assert len(np.unique(tiles, axis=0)) == tiles.shape[0]  # deduplicated


def test_empty_mask_has_one_dummy_entry():
    lay = layout_from_dense(np.zeros((1, 1, 10, 20), bool), block_q=8, block_kv=8)
    validate(lay)
    assert lay.q_count.tolist() == [0, 0] and lay.q_kv.shape == (1,) and lay.kv_count.tolist() == [0, 0, 0]


def test_full_tiles_never_cross_the_end():
    lay = layout_from_dense(np.ones((1, 1, 12, 12), bool), block_q=8, block_kv=8)
    assert lay.q_tile.tolist() == [-1, 0, 1, 2]  # only the inner 8 x 8 tile is full


def test_fetch_repeats_the_last_partial_tile():
    assert fetch_indices([-1, 3, -1, -1, 2, -1]).tolist() == [0, 3, 3, 3, 2, 2]
    assert fetch_indices([]).tolist() == []


def test_bad_input_names_the_argument():
    with pytest.raises(ValueError, match="bool array"):
        layout_from_dense(np.ones((4, 4)), block_q=8, block_kv=8)
    with pytest.raises(ValueError, match="block_kv"):
        layout_from_dense(np.ones((1, 1, 4, 4), bool), block_q=8, block_kv=0)
    lay = layout_from_dense(np.tril(np.ones((1, 1, 16, 16), bool)), block_q=8, block_kv=8)
    with pytest.raises(ValueError, match="out of order"):
        validate(lay._replace(q_kv=lay.q_kv[::-1].copy()))
    with pytest.raises(ValueError, match="q_count"):
        validate(lay._replace(q_count=lay.q_count + 5))
