"""BlockLayouts built on the device, under ``jax.jit``, from traced masks (issue 25, item 3).

Three builders, pure ``jax.numpy`` (they jit, vmap and run on any backend; every scatter happens here, outside
the kernel, and all shapes depend on static arguments only):

  document_layout     packed documents from segment ids (``seqattn.tpu.block_classes``), inner full / causal /
                      sliding-window; partial tiles are left to the kernel's segment-id predicate (tile -2)
  topk_token_layout   DSA: per query the top-k selected keys; each listed tile gets its own stored int8 mask
  topk_tile_layout    Kascade: per q block the selected kv blocks, plus the causal part of the q block's own keys

Each returns a ``LayoutBuild``: the ``BlockLayout`` (its arrays jax arrays; rows at a fixed stride, the row
widths static) and two traced bool scalars:

  overflow  a row had more blocks than its static width (``q_width`` / ``kv_width`` / ``max_tiles``), or the
            call more tiles than ``max_stored_tiles``: the blocks past the bound are left out of *both* lists
            (the layout stays self-consistent and passes ``validate``, but masks too much out). Never set with
            the default bounds.
  invalid   the input holds values the C++ mask rejects (named per builder). Those values are ignored.

Under ``jit`` neither can raise; check them on the host (``bool(build.overflow)``), or turn them into a checked
error inside ``jax.experimental.checkify`` with ``checked(build)``. ``run_positions`` gives the positions the
kernel's predicate needs for a document layout built without positions.

Importing this module imports JAX (``seqattn.pallas`` itself does not).

The shared step: a grid ``code [rows, blocks]`` holding, per (row, block), the entry's tile code or
``_UNLISTED``; a cumulative sum over blocks gives each listed block its rank in its row, and one scatter puts it
at ``row * width + rank``. The key-major lists come from the same grid transposed, so both lists always name the
same tiles. Cost O(#tiles) per build in int32 memory (B * Hm * NQ * NK), besides what each builder adds.
"""

from __future__ import annotations

import functools
import operator
from typing import NamedTuple

import numpy as np

import jax.numpy as jnp
from jax import lax

from .. import _core
from ..tpu import _as_int32, _shape, block_classes
from .layout import FULL_TILE, PREDICATE_TILE, BlockLayout, LayoutShape

_UNLISTED = -3  # grid code of a block a row does not list (below every tile code the layout defines)


class LayoutBuild(NamedTuple):
    """A traced builder's result: the layout and the flags it cannot raise under jit (see the module doc)."""

    layout: BlockLayout
    overflow: object  # bool scalar
    invalid: object  # bool scalar


def checked(build):
    """The layout of ``build``, with ``overflow`` / ``invalid`` as checkify checks (use inside
    ``jax.experimental.checkify.checkify``; outside it JAX refuses the checks when tracing)."""
    from jax.experimental import checkify

    checkify.check(~build.overflow, "BlockLayout builder: more blocks than a static bound allows (a row's width, "
                   "or max_stored_tiles)")
    checkify.check(~build.invalid, "BlockLayout builder: the input holds values the C++ mask rejects")
    return build.layout


# --- shared steps -------------------------------------------------------------------------------------------------

def _positive_int(v, name, who):
    try:
        i = operator.index(v)
    except TypeError:
        raise ValueError(f"{who}: {name} must be a positive int, got {v!r}") from None
    if i < 1:
        raise ValueError(f"{who}: {name} must be a positive int, got {i}")
    return int(i)


def _width(v, name, default, who):
    return default if v is None else _positive_int(v, name, who)


def _pack(code, width):
    """Per row of ``code [R, C]`` (tile code per block, ``_UNLISTED`` where not listed): its listed blocks in
    ascending order at stride ``width`` (the caller has left at most ``width`` per row). Returns (start, count,
    col, tile, fetch).

    Slots past a row's count repeat its last block with a full-tile code: the kernel never computes there, and a
    full code keeps each later entry's fetch index what it would be without the padding.
    """
    r, c = code.shape
    listed = code != _UNLISTED
    n = jnp.sum(listed, axis=-1, dtype=jnp.int32)
    rank = jnp.cumsum(listed, axis=-1, dtype=jnp.int32) - 1
    keep = listed & (rank < width)  # all of them, as called; the bound keeps a slip from writing out of the row
    row = lax.broadcasted_iota(jnp.int32, (r, c), 0)
    # Rows x width may not fit a flat int32 index for huge grids, so scatter with a 2-D index; dropped
    # entries go to an out-of-range row (a negative index would wrap).
    dest_row = jnp.where(keep, row, r)
    dest_slot = jnp.where(keep, rank, 0)
    col_ids = lax.broadcasted_iota(jnp.int32, (r, c), 1)
    cols = jnp.zeros((r, width), jnp.int32).at[dest_row, dest_slot].set(col_ids, mode="drop")
    tiles = jnp.full((r, width), FULL_TILE, jnp.int32).at[dest_row, dest_slot].set(code, mode="drop")
    count = jnp.minimum(n, width)
    slot = lax.broadcasted_iota(jnp.int32, (r, width), 1)
    last_col = jnp.take_along_axis(cols, jnp.maximum(count - 1, 0)[:, None], axis=1)
    cols = jnp.where(slot < count[:, None], cols, last_col)
    tile = tiles.reshape(-1)
    # fetch: the nearest stored tile at or before each entry (layout.fetch_indices, as a cumulative max).
    stamp = jnp.where(tile >= 0, jnp.arange(tile.shape[0], dtype=jnp.int32), -1)
    last = lax.cummax(stamp, axis=0)
    fetch = jnp.where(last >= 0, tile[jnp.maximum(last, 0)], 0)
    start = jnp.arange(r, dtype=jnp.int32) * width
    # An empty row starts at the last entry listed before it (layout contract: its steps repeat that block, no DMA).
    row_last = jnp.where(count > 0, start + count - 1, -1)
    before = jnp.concatenate([jnp.full((1,), -1, jnp.int32), lax.cummax(row_last, axis=0)[:-1]])
    start = jnp.where(count > 0, start, jnp.maximum(before, 0))
    return start, count, cols.reshape(-1), tile, fetch


def _both_ways(code, q_tiles, shape):
    """LayoutBuild parts from the q-major grid ``code [B * Hm, NQ, NK]`` and the stored tiles.

    A block past its q row's width or its kv row's width is dropped from both lists, so they stay transposes of
    each other (dropping only lowers the other ranks, so one pass suffices).
    """
    bh, nq, nk = code.shape
    listed = code != _UNLISTED
    q_rank = jnp.cumsum(listed, axis=2, dtype=jnp.int32) - 1
    kv_rank = jnp.cumsum(listed, axis=1, dtype=jnp.int32) - 1
    keep = listed & (q_rank < shape.q_width) & (kv_rank < shape.kv_width)
    code = jnp.where(keep, code, _UNLISTED)
    overflow = jnp.any(listed & ~keep)
    q = _pack(code.reshape(bh * nq, nk), shape.q_width)
    kv = _pack(code.transpose(0, 2, 1).reshape(bh * nk, nq), shape.kv_width)
    layout = BlockLayout(*q[:5], q_tiles, *kv[:5], q_tiles.transpose(0, 2, 1), shape)
    return layout, overflow


# --- documents ----------------------------------------------------------------------------------------------------

_PREDICATE_KINDS = ("full", "causal", "sliding_window")


def _predicate_mask(mask, self_attention):
    """Refuses inner masks the kernel's predicate cannot reproduce on a partial tile."""
    if mask is None:
        return None
    if not isinstance(mask, _core.Mask):
        raise ValueError(f"document_layout: mask must be a seqattn mask or None, got {type(mask).__name__}")
    if mask.kind not in _PREDICATE_KINDS:
        raise ValueError(
            f"document_layout: mask={mask!r} (kind {mask.kind!r}) cannot be applied by the kernel's predicate "
            "q_id == kv_id AND inner(q_pos, kv_pos); supported: FullMask, CausalMask, SlidingWindowMask "
            "(one mask for every head)")
    if mask.kind != "full" and mask.alignment == _core.Alignment.bottom_right and not self_attention:
        # With distinct q and kv runs, bottom-right lines up the runs' ends, which q_pos >= kv_pos does not see.
        raise ValueError(
            f"document_layout: mask={mask!r} is bottom-right aligned, which the predicate on positions reproduces "
            "for self-attention only; with kv_segment_ids pass top-left and positions that line the runs up")
    return mask


def run_positions(segment_ids):
    """int32, the shape of ``segment_ids [..., S]``: each token's offset in its run of equal ids -- the
    positions the kernel's predicate needs when ``document_layout`` was given no positions."""
    ids = _as_int32(segment_ids, "segment_ids", "run_positions")
    if ids.ndim < 1:
        raise ValueError(f"run_positions: segment_ids must have shape (..., S), got {_shape(ids)}")
    t = lax.broadcasted_iota(jnp.int32, ids.shape, ids.ndim - 1)
    prev = jnp.concatenate([jnp.zeros_like(ids[..., :1]), ids[..., :-1]], axis=-1)
    first = (t == 0) | (ids != prev)
    return t - lax.cummax(jnp.where(first, t, 0), axis=ids.ndim - 1)


def document_layout(segment_ids, positions=None, *, mask=None, block_q, block_kv, kv_segment_ids=None,
                    kv_positions=None, q_width=None, kv_width=None):
    """The BlockLayout of packed documents, from traced segment ids; partial tiles masked by the kernel.

    segment_ids     int [B, S_q], TransformerEngine ids (0 = padding), as ``seqattn.tpu.block_classes``.
    positions       int [B, S_q] / [S_q] or None: each token's local coordinate (None: its offset in its run).
    kv_segment_ids  int [B, S_kv] or None (self-attention); kv_positions likewise.
    mask            the mask inside each document (static): None / ``FullMask()``, ``CausalMask(alignment)`` or
                    ``SlidingWindowMask(left, right, alignment)``; bottom-right alignment with self-attention only.
    block_q, block_kv  tile sizes (static); the last block of a side may be short.
    q_width         static bound on the kv blocks of a q block (default NK: never overflows).
    kv_width        static bound on the q blocks of a kv block (default NQ).

    Tile codes: -1 where every pair of the tile is allowed and inside [S_q] x [S_kv]; -2 where some pair is;
    empty tiles unlisted. No int8 tile is stored (``q_tiles`` is one zero tile). A -2 tile is exact only through
    the kernel's predicate, applied to the same ids and positions:

        allowed(i, j) = q_id[i] == kv_id[j] != 0  AND  inner(q_pos[i], kv_pos[j])
        inner: full; causal q_pos >= kv_pos; window q_pos - left <= kv_pos <= q_pos + right (-1: unbounded)

    with ids past S taken as 0 and, without positions, q_pos / kv_pos = ``run_positions(ids)``. These three
    inner masks depend on q_pos - kv_pos alone, which is what lets one predicate over the whole row equal the
    mask in each document's local coordinates. Refused (ValueError): ChunkedCausalMask and PrefixLMMask (they
    need each run's start), bottom-right alignment between distinct q and kv runs (it needs the runs' ends;
    for self-attention it equals top-left and is accepted), and a PerHeadMask (a predicate per head). Note the
    ``!= 0``: a partial tile may hold padding pairs, which the C++ masks out, so the kernel must too.

    ``invalid`` is always False: ids or positions the C++ rejects (an id in two runs, positions that do not
    count up by one in a run) cannot be detected under jit, and their layout is unspecified, as
    ``block_classes`` says. Cost: ``block_classes`` (O(S + #tiles)) plus O(#tiles).
    """
    who = "document_layout"
    bq, bkv = _positive_int(block_q, "block_q", who), _positive_int(block_kv, "block_kv", who)
    mask = _predicate_mask(mask, kv_segment_ids is None)
    q_ids = _as_int32(segment_ids, "segment_ids", who)
    if q_ids.ndim != 2 or q_ids.shape[1] == 0:
        raise ValueError(f"{who}: segment_ids must have shape [batch, S] with S >= 1, got {_shape(q_ids)}")
    kv_ids = q_ids if kv_segment_ids is None else _as_int32(kv_segment_ids, "kv_segment_ids", who)
    if kv_ids.ndim != 2 or kv_ids.shape[0] != q_ids.shape[0] or kv_ids.shape[1] == 0:
        raise ValueError(f"{who}: kv_segment_ids must have shape [{q_ids.shape[0]}, S_kv] with S_kv >= 1 "
                         f"(segment_ids {_shape(q_ids)}), got {_shape(kv_ids)}")
    b, s_q = q_ids.shape
    s_kv = kv_ids.shape[1]
    nq, nk = -(-s_q // bq), -(-s_kv // bkv)
    shape = LayoutShape(b, 1, s_q, s_kv, bq, bkv, _width(q_width, "q_width", nk, who),
                        _width(kv_width, "kv_width", nq, who))
    classes = block_classes(q_ids, positions, kv_segment_ids=kv_segment_ids, kv_positions=kv_positions, inner=mask,
                            block_size=(bq, bkv))[:, 0]
    # block_classes calls a short last block full when its real pairs are; the layout's -1 also promises the
    # padding pairs of the box, which do not exist, so those tiles go to the predicate (ids past S are 0).
    edge = np.zeros((nq, nk), bool)
    if s_q % bq:
        edge[-1, :] = True
    if s_kv % bkv:
        edge[:, -1] = True
    code = jnp.where(classes == 2, jnp.where(jnp.asarray(edge), PREDICATE_TILE, FULL_TILE),
                     jnp.where(classes == 1, PREDICATE_TILE, _UNLISTED)).astype(jnp.int32)
    layout, overflow = _both_ways(code, jnp.zeros((1, bq, bkv), jnp.int8), shape)
    return LayoutBuild(layout, overflow, jnp.bool_(False))


# --- DSA: top-k tokens --------------------------------------------------------------------------------------------

def _heads_view(x, name, who, lead):
    """x [B, rows, k] or [B, Hm, rows, k] as int32 [B, Hm, rows, k]."""
    a = _as_int32(x, name, who)
    if a.ndim not in (3, 4) or 0 in a.shape:
        raise ValueError(f"{who}: {name} must have shape [batch, {lead}, k] or [batch, heads, {lead}, k] with no "
                         f"empty dim, got {_shape(a)}")
    return a[:, None] if a.ndim == 3 else a


def topk_token_layout(indices, *, kv_len, block_q, block_kv, max_tiles=None, max_stored_tiles=None, kv_width=None):
    """The BlockLayout of a DSA top-k selection (``seqattn.TopKMask``), built on the device.

    indices    int [B, q_len, k] (one set per query, shared by every head, as MaxText) or [B, Hm, q_len, k] (one
               per mask head). -1 = no index (padding).
    kv_len     keys (static). Query q may see key j iff j is among its indices.
    max_tiles  static bound on the kv blocks listed per q block, the q-major width (default min(NK, block_q * k):
               never overflows).
    max_stored_tiles  static bound on the listed tiles of the whole call, the number of stored masks (default
               B * Hm * NQ * max_tiles: never overflows). A selection confined to the causal past with
               block_q == block_kv, for one, lists at most B * Hm * NQ * (NQ + 1) / 2.
    kv_width   static bound on the q blocks listed per kv block (default NQ).

    Every listed tile stores its own int8 mask, scattered from the indices (no deduplication under jit: equal
    tiles cannot be found without a sort of the tiles); the listed tiles take the storage slots in q-major
    order. A tile whose bits are all set is listed as full (-1) and its slot is left unused. ``kv_tiles`` is
    ``q_tiles`` transposed. Memory of the tiles: 2 * max_stored_tiles * block_q * block_kv bytes -- with the
    defaults as much as the dense mask per side, so give the bounds the selection's real spread.

    ``invalid``: some index is outside [-1, kv_len), or a query repeats a key (both errors of the C++
    TopKMask); out-of-range indices are ignored, a repeated one counts once. Repeats are found by comparing, per
    stored tile, the indices that landed in it with the bits set, so repeats inside tiles lost to overflow are
    not reported (overflow is). Cost: O(B * Hm * q_len * k) scatters and gathers, O(#tiles) for the lists and
    O(tile memory) to clear and reduce the tiles.
    """
    who = "topk_token_layout"
    bq, bkv = _positive_int(block_q, "block_q", who), _positive_int(block_kv, "block_kv", who)
    kv_len = _positive_int(kv_len, "kv_len", who)
    idx = _heads_view(indices, "indices", who, "q_len")
    b, hm, q_len, k = idx.shape
    nq, nk = -(-q_len // bq), -(-kv_len // bkv)
    width = _width(max_tiles, "max_tiles", min(nk, bq * k), who)
    shape = LayoutShape(b, hm, q_len, kv_len, bq, bkv, width, _width(kv_width, "kv_width", nq, who))
    rows = b * hm * nq
    n_slots = _width(max_stored_tiles, "max_stored_tiles", rows * width, who)

    idx = idx.reshape(b * hm, q_len, k)
    valid = (idx >= 0) & (idx < kv_len)
    out_of_range = jnp.any(valid != (idx != -1))
    q = lax.broadcasted_iota(jnp.int32, idx.shape, 1)
    row = lax.broadcasted_iota(jnp.int32, idx.shape, 0) * nq + q // bq
    kb = jnp.where(valid, idx, 0) // bkv
    row_or_drop = jnp.where(valid, row, rows)  # an out-of-range row: the scatter drops it

    listed = jnp.zeros((rows, nk), jnp.bool_).at[row_or_drop, kb].set(True, mode="drop")
    rank = jnp.cumsum(listed, axis=-1, dtype=jnp.int32) - 1
    kept = listed & (rank < width)
    # Storage slots in q-major order: a tile's rank among all kept tiles of the call.
    order = (jnp.cumsum(kept.reshape(-1), dtype=jnp.int32) - 1).reshape(rows, nk)
    stored = kept & (order < n_slots)
    slot_grid = jnp.where(stored, order, n_slots)
    slot = jnp.where(valid, slot_grid[jnp.minimum(row, rows - 1), kb], n_slots)
    tiles = jnp.zeros((n_slots, bq, bkv), jnp.int8).at[slot, q % bq, jnp.where(valid, idx, 0) % bkv].set(
        1, mode="drop")
    landed = jnp.zeros((n_slots,), jnp.int32).at[slot].add(1, mode="drop")
    bits = jnp.sum(tiles, axis=(1, 2), dtype=jnp.int32)
    repeated = jnp.any(landed != bits)
    full = bits == bq * bkv
    slot_code = jnp.where(full, FULL_TILE, jnp.arange(n_slots, dtype=jnp.int32))
    code = jnp.where(stored, slot_code[jnp.minimum(slot_grid, n_slots - 1)], _UNLISTED)
    layout, overflow = _both_ways(code.reshape(b * hm, nq, nk), tiles, shape)
    overflow = overflow | jnp.any(listed & ~stored)  # the tiles dropped above, before the grid
    return LayoutBuild(layout, overflow, out_of_range | repeated)


# --- Kascade: top-k kv tiles per q block --------------------------------------------------------------------------

@functools.lru_cache(maxsize=32)
def _kascade_tables(q_len, kv_len, bq, bkv):
    """Static tables of the Kascade rule (depend on the shapes only), deduplicated host-side in NumPy.

    Per q block t: d0 / nd, the kv blocks [d0, d0 + nd) holding the q block's own keys [fp, p_last];
    diag[t, m, s], the code of block d0 + m when it is not (s = 0) or is (s = 1) selected; before[t], the code of
    a selected block wholly before fp. Returns (d0, nd, diag, before, tiles); codes index ``tiles``.
    """
    start = kv_len - q_len
    nq = -(-q_len // bq)
    first = start + np.arange(nq) * bq
    rows = np.minimum(bq, q_len - np.arange(nq) * bq)
    last = first + rows - 1
    d0, d1 = first // bkv, last // bkv
    nd = d1 - d0 + 1
    diag = np.full((nq, int(nd.max()), 2), _UNLISTED, np.int32)
    before = np.full((nq,), FULL_TILE, np.int32)
    stored, seen = [], {}

    def code_of(m):
        if not m.any():
            return _UNLISTED
        if m.all():
            return FULL_TILE
        key = m.tobytes()
        if key not in seen:
            seen[key] = len(stored)
            stored.append(m.astype(np.int8))
        return seen[key]

    i = np.arange(bq)[:, None]
    j = np.arange(bkv)[None, :]
    cache = {}
    for t in range(nq):
        for m in range(int(nd[t])):
            k0 = (d0[t] + m) * bkv
            for s in (0, 1):
                # The tile depends on the q block only through these: memoise (most tiles repeat).
                key = (int(rows[t]), int(first[t] - k0), int(min(kv_len - k0, bkv)), s)
                if key not in cache:
                    key_pos = k0 + j
                    cache[key] = code_of((i < rows[t]) & (key_pos < kv_len) & (key_pos <= first[t] + i) &
                                         ((key_pos >= first[t]) | bool(s)))
                diag[t, m, s] = cache[key]
        if rows[t] < bq:  # a short last q block: a selected past block is partial (its padding rows)
            before[t] = code_of(np.broadcast_to(i < rows[t], (bq, bkv)))
    tiles = np.stack(stored) if stored else np.zeros((1, bq, bkv), np.int8)
    return d0.astype(np.int32), nd.astype(np.int32), diag, before, tiles


def topk_tile_layout(tile_indices, *, q_len, kv_len, block_q, block_kv, q_width=None, kv_width=None):
    """The BlockLayout of a Kascade reuse layer: per q block the kv blocks an anchor layer selected.

    tile_indices  int [B, NQ, k] or [B, Hm, NQ, k], NQ = ceil(q_len / block_q): per q block (and head or KV
                  group) the selected kv blocks, in any order; -1 = none. The anchor's top-k, reused as it is.
    q_len, kv_len static; q_len <= kv_len: the queries are the last q_len of kv_len positions (a prefill from
                  scratch has kv_len == q_len; an extension sits after a cached prefix).
    q_width, kv_width  static bounds on the lists (defaults: the most k selections can list, and NQ; never
                  overflow).

    The rule, Kascade's reuse key set (paper / ``scenarios/kascade.hpp``, spec §C.1) with the q tile = the q
    block and the selection at kv-block granularity: query i of q block t, at position p = kv_len - q_len + i,
    whose block's first query sits at fp(t), sees key j iff

        j <= p  AND  ( j >= fp(t)  OR  block(j) is selected for t )

    i.e. the selected blocks' keys before the q block plus the causal part of its own keys, each key once (the
    C++ scenario's I(t) U [tile_start, q]). A selected block at or after fp adds nothing the causal rule would
    keep (the anchor's zero-score future picks, spec §C.4); a block straddling fp gives its keys before fp. With
    block_q == block_kv and kv_len - q_len a multiple of block_kv this is also the TPU fork's "selected U
    diagonal tile, AND token-causal" (§C.3 path B).

    Entries per row ascending; full tiles -1; partial tiles (the own-keys blocks, short blocks) name stored
    int8 masks, which depend on the shapes only: they are computed and deduplicated on the host once per shape
    (a handful of tiles), and the device only decides which blocks are listed. ``invalid``: some index is
    outside [-1, NK) (ignored); repeats are allowed (a set).
    """
    who = "topk_tile_layout"
    bq, bkv = _positive_int(block_q, "block_q", who), _positive_int(block_kv, "block_kv", who)
    q_len, kv_len = _positive_int(q_len, "q_len", who), _positive_int(kv_len, "kv_len", who)
    if q_len > kv_len:
        raise ValueError(f"{who}: q_len ({q_len}) must not exceed kv_len ({kv_len}): the queries are the last "
                         "q_len key positions")
    nq, nk = -(-q_len // bq), -(-kv_len // bkv)
    sel = _heads_view(tile_indices, "tile_indices", who, "NQ")
    b, hm, n_blocks, k = sel.shape
    if n_blocks != nq:
        raise ValueError(f"{who}: tile_indices {_shape(sel)} must have NQ = ceil(q_len / block_q) = {nq} q blocks "
                         f"(q_len {q_len}, block_q {bq}), got {n_blocks}")
    d0, nd, diag, before, tiles = _kascade_tables(q_len, kv_len, bq, bkv)
    exact = int(np.max(np.minimum(k, d0) + nd))  # selected blocks before d0, plus the own-keys blocks
    shape = LayoutShape(b, hm, q_len, kv_len, bq, bkv, _width(q_width, "q_width", exact, who),
                        _width(kv_width, "kv_width", nq, who))

    sel = sel.reshape(b * hm * nq, k)
    valid = (sel >= 0) & (sel < nk)
    invalid = jnp.any(valid != (sel != -1))
    row = lax.broadcasted_iota(jnp.int32, sel.shape, 0)
    chosen = jnp.zeros((b * hm * nq, nk), jnp.bool_).at[jnp.where(valid, row, b * hm * nq),
                                                         jnp.where(valid, sel, 0)].set(True, mode="drop")
    chosen = chosen.reshape(b * hm, nq, nk)
    # The static tables enter as [NQ]-sized constants; the [NQ, NK] grid is formed from iotas on the device.
    qb = lax.broadcasted_iota(jnp.int32, (nq, nk), 0)
    rel = lax.broadcasted_iota(jnp.int32, (nq, nk), 1) - jnp.asarray(d0)[:, None]  # place among own-keys blocks
    own = (rel >= 0) & (rel < jnp.asarray(nd)[:, None])
    diag_pick = jnp.asarray(diag)[qb, jnp.clip(rel, 0, diag.shape[1] - 1)]  # [NQ, NK, 2]
    code_own = jnp.where(chosen, diag_pick[None, :, :, 1], diag_pick[None, :, :, 0])
    code_before = jnp.where(chosen & (rel < 0)[None], jnp.asarray(before)[None, :, None], _UNLISTED)
    code = jnp.where(own[None], code_own, code_before).astype(jnp.int32)
    layout, overflow = _both_ways(code, jnp.asarray(tiles), shape)
    return LayoutBuild(layout, overflow, invalid)
