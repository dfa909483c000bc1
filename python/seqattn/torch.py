"""PyTorch flex_attention BlockMasks from seqattn masks.

``block_mask(mask, B, H, Q_LEN, KV_LEN, BLOCK_SIZE=128)`` returns a real
``torch.nn.attention.flex_attention.BlockMask`` whose block lists are exactly
those ``create_block_mask`` builds for the same pattern (partial and full
tiles, the key-side lists, int32, the same index order; short edge tiles are
partial), computed in C++ from the mask's structure without materialising the
Q x KV mask. Its ``mask_mod`` answers every element exactly from a tile table
(one id per tile plus the distinct partial tiles), so ``flex_attention`` runs
with it, compiled or not. The rules: docs/semantics/splash-and-flex.md §7-§9.
"""

from __future__ import annotations

import numpy as np
import torch
from torch.nn.attention.flex_attention import BlockMask as FlexBlockMask

from . import _core
from ._core import BlockMask, Mask

_EMPTY_TILE = -1
_FULL_TILE = -2


def _as_tensor(a, device):
    return None if a is None else torch.from_numpy(a).to(device)


def tile_mask_mod(tile_ids, tile_bits, block_size):
    """A flex mask_mod reading the tile table (``tile_ids`` [B', H', Qb, Kb], ``tile_bits`` [n, bq, bkv]).

    B' and H' of 1 broadcast over the batch and the heads.
    """
    bq, bkv = block_size
    if tile_bits.shape[0] == 0:  # no partial tile: keep the gather in bounds
        tile_bits = torch.zeros((1, bq, bkv), dtype=torch.bool, device=tile_ids.device)
    else:
        tile_bits = tile_bits.to(torch.bool)
    nb, nh = tile_ids.shape[0], tile_ids.shape[1]

    def mask_mod(b, h, q_idx, kv_idx):
        tid = tile_ids[b % nb, h % nh, q_idx // bq, kv_idx // bkv]
        bit = tile_bits[tid.clamp(min=0), q_idx % bq, kv_idx % bkv]
        return (tid == _FULL_TILE) | ((tid >= 0) & bit)

    return mask_mod


def _block_size(block_size):
    """(block_q, block_kv) from an int or a pair of ints, as create_block_mask's BLOCK_SIZE."""
    if isinstance(block_size, (int, np.integer)) and not isinstance(block_size, bool):
        return int(block_size), int(block_size)
    try:
        pair = tuple(block_size)
    except TypeError:
        pair = ()
    if isinstance(block_size, str) or len(pair) != 2 or not all(
        isinstance(b, (int, np.integer)) and not isinstance(b, bool) for b in pair
    ):
        raise ValueError(f"block_mask: BLOCK_SIZE must be an int or a pair (block_q, block_kv) of ints, "
                         f"got {block_size!r}")
    return int(pair[0]), int(pair[1])


def block_mask_arrays(mask, B, H, Q_LEN=None, KV_LEN=None, BLOCK_SIZE=128, *, separate_full_blocks=True,
                      compute_q_blocks=True):
    """The flex arrays (and the tile table) as a dict of NumPy int32 arrays."""
    B = 1 if B is None else int(B)
    H = 1 if H is None else int(H)
    bq, bkv = _block_size(BLOCK_SIZE)
    if isinstance(mask, BlockMask):
        if tuple(mask.block_size) != (bq, bkv):
            raise ValueError(f"block_mask: the BlockMask has block_size {tuple(mask.block_size)}, "
                             f"BLOCK_SIZE is ({bq}, {bkv})")
        return _core._flex_block_mask_arrays_from_block_mask(mask, B, H, separate_full_blocks, compute_q_blocks)
    if not isinstance(mask, Mask):
        raise ValueError(f"mask: expected a seqattn.Mask or seqattn.BlockMask, got {type(mask).__name__}")
    # Masks holding per-sequence data (documents, top-k, one prefix length per
    # sequence, ...) are built for their own rows; the export broadcasts 1 row to B.
    mask_batch = mask.batch or 1
    own = mask.lengths
    if own is not None:
        qs, kvs = own
        mask_batch = len(qs)
        Q_LEN = qs[0] if Q_LEN is None else Q_LEN
        KV_LEN = kvs[0] if KV_LEN is None else KV_LEN
    if Q_LEN is None:
        raise ValueError(f"block_mask: Q_LEN is required for {mask!r} (it holds no lengths of its own)")
    KV_LEN = Q_LEN if KV_LEN is None else KV_LEN
    return _core._flex_block_mask_arrays(mask, B, H, int(Q_LEN), int(KV_LEN), int(bq), int(bkv), mask_batch,
                                         separate_full_blocks, compute_q_blocks)


def block_mask(mask, B, H, Q_LEN=None, KV_LEN=None, BLOCK_SIZE=128, *, device="cpu", separate_full_blocks=True,
               compute_q_blocks=True):
    """A ``torch.nn.attention.flex_attention.BlockMask`` for a seqattn mask (or BlockMask).

    ``B`` / ``H`` may be None (1, broadcast), as in ``create_block_mask``; a mask that differs per batch row
    (documents, top-k, ...) must hold B rows or 1. ``Q_LEN`` / ``KV_LEN`` default to the mask's own lengths.
    """
    d = block_mask_arrays(mask, B, H, Q_LEN, KV_LEN, BLOCK_SIZE, separate_full_blocks=separate_full_blocks,
                          compute_q_blocks=compute_q_blocks)
    t = {k: _as_tensor(d[k], device) for k in ("kv_num_blocks", "kv_indices", "full_kv_num_blocks",
                                               "full_kv_indices", "q_num_blocks", "q_indices", "full_q_num_blocks",
                                               "full_q_indices", "tile_ids", "tile_bits")}
    block_size = tuple(d["block_size"])
    return FlexBlockMask(
        seq_lengths=tuple(d["seq_lengths"]),
        kv_num_blocks=t["kv_num_blocks"],
        kv_indices=t["kv_indices"],
        full_kv_num_blocks=t["full_kv_num_blocks"],
        full_kv_indices=t["full_kv_indices"],
        q_num_blocks=t["q_num_blocks"],
        q_indices=t["q_indices"],
        full_q_num_blocks=t["full_q_num_blocks"],
        full_q_indices=t["full_q_indices"],
        BLOCK_SIZE=block_size,
        mask_mod=tile_mask_mod(t["tile_ids"], t["tile_bits"], block_size),
    )


__all__ = ["block_mask", "block_mask_arrays", "tile_mask_mod"]
