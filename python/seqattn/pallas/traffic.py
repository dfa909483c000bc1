"""Work a block-sparse TPU kernel does, counted from its metadata: grid steps, steps that compute, DMAs, bytes.

TPU speed cannot be measured without a TPU; what a kernel's metadata makes it do can. Pallas copies an operand's
block into VMEM when the block index its index_map returns differs from the previous grid step's (a repeated
index costs no DMA), so walking the grid in order and counting index changes per operand gives the HBM traffic.

``layout_forward_work`` counts our kernel's forward pass over a ``BlockLayout`` (grid (batch, q head, q block,
listed step), the index maps of ``seqattn.pallas``); ``splash_forward_work`` counts Splash's forward pass over a
MaskInfo (grid (head, q block, kv step), K/V at ``data_next``, the partial mask at ``mask_next``, computing where
``block_mask`` is nonzero). Both return a ``Work``; only the ratio of two counts means anything about speed.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class Work(NamedTuple):
    grid_steps: int  # steps the grid runs (each costs a little even when it computes nothing)
    computed: int  # steps that run the matmuls
    kv_fetches: int  # K and V block pairs copied from HBM
    mask_fetches: int  # partial-tile masks copied from HBM
    q_fetches: int  # Q blocks copied in (= output blocks written back)
    hbm_bytes: int  # all of the above in bytes, LSE included

    def __add__(self, other):
        return Work(*(a + b for a, b in zip(self, other)))


def _changes(keys):
    """How many times a sequence of (row of) block indices changes, counting the first as a change."""
    keys = np.asarray(keys)
    if keys.shape[0] == 0:
        return 0
    if keys.ndim == 1:
        keys = keys[:, None]
    return int(1 + np.count_nonzero(np.any(keys[1:] != keys[:-1], axis=1)))


def _bytes(q_fetches, kv_fetches, mask_fetches, block_q, block_kv, head_dim, itemsize, mask_itemsize):
    qo = q_fetches * block_q * (2 * head_dim * itemsize + 4)  # Q in, O and the fp32 LSE out
    kv = kv_fetches * 2 * block_kv * head_dim * itemsize
    return int(qo + kv + mask_fetches * block_q * block_kv * mask_itemsize)


def layout_forward_work(layout, *, heads, kv_heads, head_dim, itemsize=2):
    """Our kernel's forward pass over ``layout`` for q [B, heads, q_len, head_dim], K/V with ``kv_heads``."""
    s = layout.shape
    if heads % kv_heads or (s.mask_heads not in (1, heads)):
        raise ValueError(f"layout_forward_work: heads={heads} must be a multiple of kv_heads={kv_heads} and the "
                         f"layout's mask_heads={s.mask_heads} 1 or heads")
    nq, width = s.num_q_blocks, s.q_width
    start, count = np.asarray(layout.q_start), np.asarray(layout.q_count)
    kv, fetch = np.asarray(layout.q_kv), np.asarray(layout.q_fetch)
    b, h, i, j = np.meshgrid(np.arange(s.batch), np.arange(heads), np.arange(nq), np.arange(width), indexing="ij")
    row = (b * s.mask_heads + (h if s.mask_heads > 1 else 0)) * nq + i
    entry = start[row] + np.minimum(j, np.maximum(count[row] - 1, 0))
    kv_key = np.stack([b, h // (heads // kv_heads), kv[entry]], axis=-1).reshape(-1, 3)
    computed = int(np.count_nonzero(j < count[row]))
    kv_fetches = _changes(kv_key)
    mask_fetches = _changes(fetch[entry].reshape(-1)) if np.any(np.asarray(layout.q_tile) >= 0) else 0
    q_fetches = s.batch * heads * nq
    return Work(int(j.size), computed, kv_fetches, mask_fetches, q_fetches,
                _bytes(q_fetches, kv_fetches, mask_fetches, s.block_q, s.block_kv, head_dim, itemsize, 1))


def splash_forward_work(info, *, heads, kv_heads, head_dim, block_q, block_kv, itemsize=2):
    """Splash's forward pass over a MaskInfo (``seqattn.splash.mask_info`` or Splash's own ``_process_mask``).

    ``info.block_mask`` / ``data_next`` / ``mask_next`` are [mask heads or 1, q blocks, kv steps]; a causal
    mask that Splash evaluates in the kernel (``q_sequence`` set, no stored tiles) fetches no masks.
    """
    block_mask = np.asarray(info.block_mask)
    data_next = np.asarray(info.data_next)
    hm, nq, width = block_mask.shape
    h, i, j = np.meshgrid(np.arange(heads), np.arange(nq), np.arange(width), indexing="ij")
    hsel = h if hm > 1 else np.zeros_like(h)
    kv_key = np.stack([h // (heads // kv_heads), data_next[hsel, i, j]], axis=-1).reshape(-1, 2)
    computed = int(np.count_nonzero(block_mask[hsel, i, j]))
    kv_fetches = _changes(kv_key)
    mask_fetches = 0
    if getattr(info, "mask_next", None) is not None and getattr(info, "partial_mask_blocks", None) is not None:
        mask_fetches = _changes(np.asarray(info.mask_next)[hsel, i, j].reshape(-1))
    q_fetches = heads * nq
    return Work(int(h.size), computed, kv_fetches, mask_fetches, q_fetches,
                _bytes(q_fetches, kv_fetches, mask_fetches, block_q, block_kv, head_dim, itemsize, 1))
