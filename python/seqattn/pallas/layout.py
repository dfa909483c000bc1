"""The block layout our Pallas TPU kernel reads: which kv blocks each q block visits, and their masks.

The kernel's grid runs over *listed* blocks only, so its metadata is a list per q block (and, for the dK/dV
pass, a list per kv block) -- the CSR form the CUDA backend uploads (``backends/device_mask.hpp``), flattened
into int32 arrays that live in SMEM as scalar prefetch. Every data-dependent index the kernel uses comes from
these arrays; nothing is gathered inside the kernel.

Shapes (all int32 unless noted). ``B`` batch, ``Hm`` mask heads (1 for a head-invariant mask, else the number
of query heads), ``NQ = ceil(q_len / block_q)``, ``NK = ceil(kv_len / block_kv)``.

Query-major (forward and dQ), one row per (b, h, q-block), row ``r = (b * Hm + h) * NQ + qb``:

  q_start  [B * Hm * NQ]  first entry of row r
  q_count  [B * Hm * NQ]  number of listed kv blocks of row r (0: a fully masked q block)
  q_kv     [Eq]           kv block of each entry; a row's entries increase
  q_tile   [Eq]           -1: full tile (no mask work); t >= 0: partial, its element mask is q_tiles[t];
                          -2: partial, its element mask is the kernel's segment-id predicate alone
  q_fetch  [Eq]           the q_tiles block the kernel's mask operand fetches at this entry: q_tile where
                          >= 0, else the nearest partial tile before it in entry order (0 if none), so
                          a full tile fetches nothing new
  q_tiles  int8 [Tq, block_q, block_kv]  deduplicated element masks, 1 = attend (Tq >= 1)

Key-major (dK/dV), one row per (b, h, kv-block), row ``c = (b * Hm + h) * NK + kb``: ``kv_start``,
``kv_count``, ``kv_q`` (q block of each entry), ``kv_tile``, ``kv_fetch`` and ``kv_tiles`` int8
``[Tk, block_kv, block_q]`` (the transposed element masks: ``kv_tiles[t][j, i]`` is (query i, key j)).

Guarantees every builder gives (``validate`` checks them; the kernel relies on them):

- Entries of row r are ``start[r] .. start[r] + count[r] - 1``. Rows need not be contiguous: a compact
  (CSR) builder packs them, a traced builder under ``jit`` uses a fixed stride. For every row,
  ``start[r] + max(count[r] - 1, 0)`` is a valid entry index, so the kernel reads entry
  ``start[r] + min(j, max(count[r] - 1, 0))`` at grid step j without clamping: steps past a row's count
  repeat its last block (no new DMA) and do no compute.
- An empty row (count 0) starts at the last entry listed before it (entry 0 when there is none), so its grid
  steps repeat the block index the previous row ended on: no DMA for a row that computes nothing. (Pointing it at
  the next row's first entry would fetch that block early, and across a batch or kv-head boundary fetch it for the
  wrong sequence or head, an extra copy.)
- A full tile (-1) is allowed at every (query, key) pair of its block_q x block_kv box, all of them inside
  the sequences' lengths; a tile that crosses a sequence's end is partial, its mask 0 outside. Rows of
  queries past a sequence's end therefore compute nothing and come out 0 with LSE -inf, like fully masked
  rows.
- ``q_width`` >= every q_count (the forward/dQ grid's last axis); ``kv_width`` >= every kv_count.
- Empty tiles are listed nowhere.

Segment-id predicate: when the kernel is given segment ids (and positions), a partial tile's mask is
``tile bits AND (q_id == kv_id) AND (q_id != 0) AND inner(q_pos, kv_pos)`` (bits taken as all ones for -2): id 0
is padding and matches nothing, itself included (the engine's DocumentMask). Full tiles are never masked. A builder
that lists a tile as full must know it is full under the ids as well (no padding id in it).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

_Q_FIELDS = ("q_start", "q_count", "q_kv", "q_tile", "q_fetch", "q_tiles")
_KV_FIELDS = ("kv_start", "kv_count", "kv_q", "kv_tile", "kv_fetch", "kv_tiles")

FULL_TILE = -1
PREDICATE_TILE = -2


class LayoutShape(NamedTuple):
    """The static part of a BlockLayout (hashable: a pytree's aux data)."""

    batch: int
    mask_heads: int
    q_len: int
    kv_len: int
    block_q: int
    block_kv: int
    q_width: int
    kv_width: int

    @property
    def num_q_blocks(self):
        return -(-self.q_len // self.block_q)

    @property
    def num_kv_blocks(self):
        return -(-self.kv_len // self.block_kv)


class BlockLayout(NamedTuple):
    """Arrays of the layout (numpy on the host, jax arrays under jit) and its static shape."""

    q_start: object
    q_count: object
    q_kv: object
    q_tile: object
    q_fetch: object
    q_tiles: object
    kv_start: object
    kv_count: object
    kv_q: object
    kv_tile: object
    kv_fetch: object
    kv_tiles: object
    shape: LayoutShape

    def arrays(self):
        return tuple(getattr(self, f) for f in _Q_FIELDS + _KV_FIELDS)


def _register_pytree():
    try:
        import jax
    except ImportError:  # the layout is usable from NumPy alone
        return
    jax.tree_util.register_pytree_node(
        BlockLayout,
        lambda lay: (lay.arrays(), lay.shape),
        lambda shape, arrays: BlockLayout(*arrays, shape),
    )


_register_pytree()


def fetch_indices(tile):
    """q_fetch / kv_fetch from q_tile / kv_tile: the nearest partial tile at or before each entry (0 if none)."""
    tile = np.asarray(tile, np.int32)
    stamp = np.where(tile >= 0, np.arange(tile.size), -1)
    last = np.maximum.accumulate(stamp) if tile.size else stamp
    return np.where(last >= 0, tile[np.maximum(last, 0)], 0).astype(np.int32)


def _dedup(tiles):
    """Distinct tiles in first-seen order and the index of each input tile."""
    if not tiles:
        return [], []
    flat = np.stack(tiles).reshape(len(tiles), -1)
    uniq, first, inverse = np.unique(flat, axis=0, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    return [tiles[first[o]] for o in order], list(rank[inverse.reshape(-1)])


def _lists(allowed, block_r, block_c):
    """Per-row entry lists of a [B, Hm, R, C] bool mask tiled by (block_r, block_c)."""
    b_, hm, r_len, c_len = allowed.shape
    nr, nc = -(-r_len // block_r), -(-c_len // block_c)
    padded = np.zeros((b_, hm, nr * block_r, nc * block_c), bool)
    padded[:, :, :r_len, :c_len] = allowed
    tiles = padded.reshape(b_, hm, nr, block_r, nc, block_c).transpose(0, 1, 2, 4, 3, 5)
    starts, counts, cols, kinds, partial = [], [], [], [], []
    for b in range(b_):
        for h in range(hm):
            for r in range(nr):
                starts.append(len(cols))  # an empty row's start is moved back below
                n = 0
                for c in range(nc):
                    t = tiles[b, h, r, c]
                    if not t.any():
                        continue
                    n += 1
                    cols.append(c)
                    if t.all():
                        kinds.append(FULL_TILE)
                    else:
                        kinds.append(len(partial))
                        partial.append(t.astype(np.int8))
                counts.append(n)
    distinct, index = _dedup(partial)
    kinds = [k if k < 0 else int(index[k]) for k in kinds]
    if not cols:  # one dummy entry so every row's start names a valid entry
        cols, kinds = [0], [FULL_TILE]
    # An empty row repeats the last entry listed before it (the contract: no DMA for it).
    starts = [s if n else max(s - 1, 0) for s, n in zip(starts, counts)]
    tile_arr = np.stack(distinct) if distinct else np.zeros((1, block_r, block_c), np.int8)
    tile = np.asarray(kinds, np.int32)
    return (np.asarray(starts, np.int32), np.asarray(counts, np.int32), np.asarray(cols, np.int32), tile,
            fetch_indices(tile), tile_arr)


def layout_from_dense(allowed, *, block_q, block_kv):
    """The BlockLayout of a dense bool mask ``[B, Hm, q_len, kv_len]`` (True = attend). O(q_len * kv_len).

    The reference builder: tests compare every other builder with it, and it serves small masks given as
    dense arrays. Padding (queries or keys past a sequence's end) must already be False in ``allowed``.
    """
    allowed = np.asarray(allowed)
    if allowed.ndim != 4 or allowed.dtype != np.bool_:
        raise ValueError(f"layout_from_dense: allowed must be a bool array [batch, mask_heads, q_len, kv_len], got "
                         f"dtype {allowed.dtype} and shape {allowed.shape}")
    for name, v in (("block_q", block_q), ("block_kv", block_kv)):
        if not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"layout_from_dense: {name} must be a positive int, got {v!r}")
    b_, hm, q_len, kv_len = allowed.shape
    q = _lists(allowed, block_q, block_kv)
    kv = _lists(allowed.transpose(0, 1, 3, 2), block_kv, block_q)
    # kv rows list q blocks; their tiles are [block_kv, block_q] element masks (key j, query i).
    shape = LayoutShape(b_, hm, q_len, kv_len, int(block_q), int(block_kv), max(1, int(q[1].max(initial=0))),
                        max(1, int(kv[1].max(initial=0))))
    return BlockLayout(*q, *kv, shape)


def dense_from_layout(layout, *, predicate=None, key_major=False):
    """The [B, Hm, q_len, kv_len] bool mask a layout describes (host; tests), read from its query-major lists, or
    from its key-major ones with ``key_major``. ``predicate``, when given, is a [B, q_len, kv_len] bool array
    standing for the kernel's segment-id predicate on partial tiles."""
    s = layout.shape
    nq, nk = s.num_q_blocks, s.num_kv_blocks
    names = ("kv_start", "kv_count", "kv_q", "kv_tile", "kv_tiles") if key_major else \
        ("q_start", "q_count", "q_kv", "q_tile", "q_tiles")
    start, count, other, tile, tiles = (np.asarray(getattr(layout, f)) for f in names)
    out = np.zeros((s.batch, s.mask_heads, nq * s.block_q, nk * s.block_kv), bool)
    pred = None
    if predicate is not None:
        pred = np.zeros((s.batch, nq * s.block_q, nk * s.block_kv), bool)
        pred[:, : s.q_len, : s.kv_len] = predicate
    blocks = nk if key_major else nq
    for b in range(s.batch):
        for h in range(s.mask_heads):
            for blk in range(blocks):
                r = (b * s.mask_heads + h) * blocks + blk
                for e in range(start[r], start[r] + count[r]):
                    qb, kb = (int(other[e]), blk) if key_major else (blk, int(other[e]))
                    t = int(tile[e])
                    rows = slice(qb * s.block_q, (qb + 1) * s.block_q)
                    cols = slice(kb * s.block_kv, (kb + 1) * s.block_kv)
                    if t == FULL_TILE:
                        out[b, h, rows, cols] = True
                        continue
                    m = np.ones((s.block_q, s.block_kv), bool) if t == PREDICATE_TILE else \
                        (tiles[t].T if key_major else tiles[t]) != 0
                    if pred is not None:
                        m = m & pred[b, rows, cols]
                    out[b, h, rows, cols] = m
    return out[:, :, : s.q_len, : s.kv_len]


def validate(layout):
    """Checks the guarantees above on a host layout; ValueError naming the field otherwise."""
    s = layout.shape
    nq, nk = s.num_q_blocks, s.num_kv_blocks
    for prefix, rows, cols, width, tile_shape in (("q", nq, nk, s.q_width, (s.block_q, s.block_kv)),
                                                  ("kv", nk, nq, s.kv_width, (s.block_kv, s.block_q))):
        start, count, col, tile, fetch, tiles = (np.asarray(getattr(layout, f"{prefix}_{n}")) for n in
                                                 ("start", "count", "kv" if prefix == "q" else "q", "tile",
                                                  "fetch", "tiles"))
        n_rows = s.batch * s.mask_heads * rows
        if start.shape != (n_rows,) or count.shape != (n_rows,):
            raise ValueError(f"BlockLayout: {prefix}_start / {prefix}_count must have shape ({n_rows},), got "
                             f"{start.shape} / {count.shape}")
        if tiles.ndim != 3 or tiles.shape[1:] != tile_shape or tiles.shape[0] < 1:
            raise ValueError(f"BlockLayout: {prefix}_tiles must have shape [>=1, {tile_shape[0]}, {tile_shape[1]}], "
                             f"got {tiles.shape}")
        n = col.shape[0]
        if not (col.shape == tile.shape == fetch.shape == (n,)) or n < 1:
            raise ValueError(f"BlockLayout: {prefix} entry arrays must share one non-empty shape, got {col.shape}, "
                             f"{tile.shape}, {fetch.shape}")
        if count.max(initial=0) > width or count.min(initial=0) < 0:
            raise ValueError(f"BlockLayout: {prefix}_count must lie in [0, {prefix}_width={width}]")
        last = start + np.maximum(count - 1, 0)
        if start.min(initial=0) < 0 or last.max(initial=0) >= n:
            raise ValueError(f"BlockLayout: {prefix}_start + count - 1 must name an entry in [0, {n})")
        if col.min() < 0 or col.max() >= cols:
            raise ValueError(f"BlockLayout: {prefix} entries must name blocks in [0, {cols})")
        if tile.min() < PREDICATE_TILE or tile.max() >= tiles.shape[0] or fetch.min() < 0 or \
                fetch.max() >= tiles.shape[0]:
            raise ValueError(f"BlockLayout: {prefix}_tile / {prefix}_fetch name tiles outside [0, {tiles.shape[0]})")
        listed_before = -1
        for r in range(n_rows):
            if count[r] == 0 and start[r] != max(listed_before, 0):
                raise ValueError(f"BlockLayout: empty row {r} of {prefix} must start at the last entry listed before "
                                 f"it ({max(listed_before, 0)}), got {start[r]}")
            if count[r]:
                listed_before = start[r] + count[r] - 1
            e = col[start[r]: start[r] + count[r]]
            if np.any(np.diff(e) <= 0):
                raise ValueError(f"BlockLayout: row {r} of {prefix} lists its blocks out of order: {e.tolist()}")
