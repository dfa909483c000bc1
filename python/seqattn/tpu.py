"""Device-side block metadata for TPU kernels: tile classes from traced segment ids.

``block_classes`` computes, inside ``jax.jit`` and from traced ``segment_ids`` /
``positions``, the class of every (q-block, kv-block) tile of a document mask
(empty / partial / full, the values of ``seqattn.TileClass``) -- the classes
``seqattn.DocumentMask(...).block_mask(block_size=...).classes()`` computes on
the host in C++, on every input the C++ accepts. Pure ``jax.numpy``: it jits,
vmaps and runs on any backend, so a training step can rebuild its block mask
on the device each step without a host round trip.

``multi_item_classes`` does the same for multi-item scoring masks (sglang-jax) from traced tokens, as
``seqattn.MultiItemMask(...).block_mask(...).classes()`` computes them.

Importing this module imports JAX; ``import seqattn`` does not.
"""

from __future__ import annotations

import operator
from typing import Any, NamedTuple

import numpy as np

import jax
import jax.numpy as jnp
from jax import lax

from . import _core

_INT32_MIN = -(2**31)
_INT32_MAX = 2**31 - 1
# Intermediate local offsets are clamped to [-_BOUND, _BOUND]; exact as long as
# every sequence is shorter than _BOUND / 2 tokens (checked: _MAX_TOKENS).
_BOUND = 2**30
_MAX_TOKENS = 2**29

# The inner masks this builder supports and the parameters each one's interval needs (mask properties).
_PARAMS = {"full": (), "causal": (), "sliding_window": ("left", "right"), "chunked_causal": ("chunk",),
           "prefix_lm": ("prefix",)}

SUPPORTED_INNER = (
    "FullMask, CausalMask, SlidingWindowMask, ChunkedCausalMask and PrefixLMMask with one int prefix, "
    "each top-left or bottom-right aligned"
)


def _spec_of(mask, what):
    """(kind, params) of one structural mask; ValueError naming `what` otherwise."""
    kind = mask.kind if isinstance(mask, _core.Mask) else None
    if kind not in _PARAMS or (kind == "prefix_lm" and mask.prefix is None):
        extra = " (a prefix length per sequence is not supported yet)" if kind == "prefix_lm" else ""
        raise ValueError(
            f"block_classes: {what}={mask!r} (kind {kind!r}) is not supported{extra}; supported: {SUPPORTED_INNER}, "
            "or a PerHeadMask of them"
        )
    params = tuple((name, int(getattr(mask, name))) for name in _PARAMS[kind])
    if kind != "full":
        params += (("bottom_right", mask.alignment == _core.Alignment.bottom_right),)
    return kind, params


def _inner_specs(inner):
    """One (kind, params) per head: a tuple of one spec for head-invariant masks, H for a PerHeadMask."""
    if inner is None:
        return (("full", ()),)
    if not isinstance(inner, _core.Mask):
        raise ValueError(f"block_classes: inner must be a seqattn mask or None, got {type(inner).__name__}")
    if inner.kind != "per_head":
        return (_spec_of(inner, "inner"),)
    return tuple(_spec_of(m, f"inner's head {h}") for h, m in enumerate(inner.masks))


def _shape(x):
    return tuple(int(d) for d in np.shape(x))


def _as_int32(x, name, who):
    """x as an int32 array (traced or not); wider integers are range-checked where their values are known."""
    if x is None:
        return None
    if not hasattr(x, "dtype"):
        x = np.asarray(x)
    dtype = np.dtype(x.dtype)
    if dtype.kind not in "iub":
        raise ValueError(f"{who}: {name} must hold integers, got dtype {dtype} of shape {_shape(x)}")
    if dtype == np.int32:
        return jnp.asarray(x)
    if np.can_cast(dtype, np.int32, casting="safe"):
        return jnp.asarray(x).astype(jnp.int32)
    if isinstance(x, jax.core.Tracer):
        raise ValueError(
            f"{who}: {name} of shape {_shape(x)} must be int32 when traced, got {dtype} "
            "(wider ids cannot be range-checked under jit)"
        )
    a = np.asarray(x)
    if a.size and (a.min() < _INT32_MIN or a.max() > _INT32_MAX):
        raise ValueError(f"{who}: {name} of shape {a.shape} holds values outside int32")
    return jnp.asarray(a.astype(np.int32))


def _block_size(block_size, who):
    if isinstance(block_size, (int, np.integer)):
        block_size = (block_size, block_size)
    try:
        bq, bkv = (operator.index(b) for b in block_size)
    except (TypeError, ValueError):
        raise ValueError(f"{who}: block_size must be an int or a pair of ints, got {block_size!r}") from None
    if bq <= 0 or bkv <= 0:
        raise ValueError(f"{who}: block_size must be positive, got ({bq}, {bkv})")
    return int(bq), int(bkv)


def _shift(x, c):
    """clip(x + c, -_BOUND, _BOUND), exactly, for int32 x (any value) and a Python int c (any size)."""
    lo = max(_INT32_MIN, -_BOUND - c)
    hi = min(_INT32_MAX, _BOUND - c)
    if lo > hi:  # |c| so large that every x lands beyond a bound
        return jnp.full(x.shape, _BOUND if c > 0 else -_BOUND, jnp.int32)
    wrapped = (c + 2**31) % 2**32 - 2**31  # x + c is in [-_BOUND, _BOUND]: the int32 sum wraps to it exactly
    return jnp.clip(x, lo, hi) + jnp.int32(wrapped)


def _runs(ids, pos):
    """Per token of ids [N, S]: (nonzero, run begin, run end, position of the run's first token)."""
    n, s = ids.shape
    t = lax.broadcasted_iota(jnp.int32, (n, s), 1)
    nz = ids != 0
    zero = jnp.zeros((n, 1), ids.dtype)
    prev = jnp.concatenate([zero, ids[:, :-1]], axis=1)
    nxt = jnp.concatenate([ids[:, 1:], zero], axis=1)
    starts = nz & (ids != prev)  # R3: only a change of id starts or ends a run
    ends = nz & (ids != nxt)
    begin = lax.cummax(jnp.where(starts, t, -1), axis=1)
    end = lax.cummin(jnp.where(ends, t + 1, s), axis=1, reverse=True)
    begin = jnp.maximum(begin, 0)  # padding before the first run: never read
    if pos is None:
        pos_begin = jnp.zeros((n, s), jnp.int32)  # local coordinate = offset in the run
    else:
        pos_begin = jnp.take_along_axis(pos, begin, axis=1)
    return nz, begin, end, pos_begin


def _match_kv_runs(q_ids, kv_ids):
    """For each q token, the first token of the kv run with its id (R4: at most one) and whether there is one.

    A stable sort of the kv tokens by id keeps each id's tokens in token order, so the first kv token with a q
    token's id, found by binary search, is its run's start: O(S log S).
    """
    n, s_kv = kv_ids.shape
    t = lax.broadcasted_iota(jnp.int32, (n, s_kv), 1)
    keys, where = lax.sort((kv_ids, t), dimension=1, num_keys=1, is_stable=True)
    idx = jax.vmap(lambda k, v: jnp.searchsorted(k, v, side="left"))(keys, q_ids)
    idx = jnp.minimum(idx, s_kv - 1).astype(jnp.int32)
    found = jnp.take_along_axis(keys, idx, axis=1) == q_ids
    first = jnp.take_along_axis(where, idx, axis=1)
    return found, jnp.where(found, first, 0)


def _local_interval(kind, params, rq, qlen, qpb, klen, kpb):
    """Each q row's allowed keys as offsets [a, b) into its kv run (before clamping to [0, klen]).

    rq: the row's offset in its q run; qlen / klen: run lengths; qpb / kpb: local coordinates of the runs'
    first tokens. Only int32 arithmetic with magnitudes below 2^31 (see _shift).
    """
    p = dict(params)
    zeros = jnp.zeros_like(rq)
    if kind == "full":
        return zeros, klen, None
    # The diagonal as an offset into the kv run: row rq's diagonal is key offset rq + diag. Bottom-right
    # lines up the runs' last tokens whatever their positions; top-left the runs' local coordinates.
    diag = (klen - qlen) if p["bottom_right"] else (qpb - kpb)
    if kind == "causal":
        return zeros, rq + _shift(diag, 1), None
    if kind == "sliding_window":
        left, right = p["left"], p["right"]
        a = zeros if left < 0 else rq + _shift(diag, -left)
        b = klen if right < 0 else rq + _shift(diag, right + 1)
        return a, b, None
    if kind == "prefix_lm":
        return zeros, jnp.maximum(_shift(-kpb, p["prefix"]), rq + _shift(diag, 1)), None
    # chunked_causal: the diagonal's local key coordinate, then its chunk's start.
    chunk = p["chunk"]
    if p["bottom_right"]:
        pd = (kpb + (klen - 1)) - ((qlen - 1) - rq)  # the kv run's last position minus the rows to the q run's end
    else:
        pd = qpb + rq
    nonneg = jnp.maximum(pd, 0)
    chunk_start = nonneg - nonneg % chunk if chunk <= _INT32_MAX else jnp.zeros_like(nonneg)
    a = chunk_start - kpb
    b = _shift(nonneg - kpb, 1)
    return a, b, pd >= 0


def _check_grid(who, lead, nq, nkv):
    """The number of rows in the leading dims; the scatter's flat int32 index must reach every tile."""
    n = int(np.prod(lead, dtype=np.int64))
    if n * nq * (nkv + 1) > _INT32_MAX:
        raise ValueError(f"{who}: {n} rows of {nq} x {nkv} tiles exceed the int32 index of the tile grid")
    return n


def _rows_per_tile(n, nq, nkv, q_block, ranges):
    """int32 [n, nq, nkv]: per tile, how many (row, range) pairs of its q-block cover its kv-block.

    q_block [n, S]: each row's q-block; ranges: (first, past, ok) per row, kv-block ranges [first, past) with
    0 <= first and past <= nkv where ok. One scatter of +1 at `first` and -1 at `past` into each q-block's row
    of kv-blocks, then a cumulative sum over kv-blocks: O(S + #tiles), never [S, blocks].
    """
    width = nkv + 1
    row_base = (lax.broadcasted_iota(jnp.int32, q_block.shape, 0) * nq + q_block) * width
    idx, upd = [], []
    for first, past, ok in ranges:
        weight = ok.astype(jnp.int32)
        idx += [(row_base + jnp.where(ok, first, 0)).ravel(), (row_base + jnp.where(ok, past, 0)).ravel()]
        upd += [weight.ravel(), -weight.ravel()]
    counts = jnp.zeros(n * nq * width, jnp.int32).at[jnp.concatenate(idx)].add(
        jnp.concatenate(upd), mode="promise_in_bounds")
    return jnp.cumsum(counts.reshape(n, nq, width)[:, :, :nkv], axis=-1)


def block_classes(segment_ids, positions=None, *, kv_segment_ids=None, kv_positions=None, inner=None,
                  block_size=(128, 128)):
    """Tile classes of a document mask, from traced segment ids, in ``jax.numpy``.

    Arguments (JAX or NumPy arrays, traced or not):
      segment_ids     int [*E, S_q] (usually [B, S]): TransformerEngine segment ids, 0 = padding. A non-zero id
                      forms one contiguous run per row; ids need not start at 1, be dense or be increasing.
      positions       int, the shape of segment_ids or a trailing part of it (broadcast over the rest), or None:
                      each token's local coordinate, counting up by one inside a run from a first value >= 0.
                      Without positions a token's local coordinate is its offset in its run.
      kv_segment_ids  int [*E, S_kv] (same leading dims), or None for self-attention (the keys are the queries);
                      q and kv runs with the same id are paired (cross attention, KV caches).
      kv_positions    as positions, for the keys; only with kv_segment_ids.
      inner           the mask applied inside each document, in local coordinates (as ``DocumentMask``'s
                      ``inner``): None (full), ``seqattn.FullMask()``, ``CausalMask(alignment)``,
                      ``SlidingWindowMask(left, right, alignment)``, ``ChunkedCausalMask(chunk, alignment)`` or
                      ``PrefixLMMask(prefix, alignment)`` with one int prefix, or a ``PerHeadMask`` of them
                      (head h uses the h-th). Static.
      block_size      (block_q, block_kv) or one int for both. Static. The last block of a side may be short.

    Returns int8 [*E, H, ceil(S_q / block_q), ceil(S_kv / block_kv)], H = 1 (one mask for every head) or the
    PerHeadMask's head count: per (row, head, q-block, kv-block) the ``seqattn.TileClass`` value, 0 empty,
    1 partial (some but not all pairs allowed), 2 full -- exactly ``seqattn.DocumentMask(segment_ids,
    positions, inner, kv_segment_ids=..., kv_segment_pos=...).block_mask(block_size=block_size).classes()``
    on every input the C++ accepts. Heads with equal masks are computed once. Query token i may see key j
    iff they carry the same non-zero id and the inner mask allows them in local coordinates, the inner mask
    seeing a run as the first (first position + length) coordinates of its document (so bottom-right
    alignment lines up the runs' last tokens, as in TE).

    Inputs the C++ rejects (an id in two runs, negative ids or positions, positions that do not count up by
    one) cannot be detected under jit: their classes are unspecified. With positions only a run's first
    position is read.

    How: per token, its run (cumulative max / min of the run starts and ends) and, for each query row, the
    one interval of keys it may see (every supported inner mask allows an interval per row); a tile is
    non-empty iff some row's interval meets its columns (a +1/-1 scatter per row into its q-block's row of
    kv-blocks, then a cumulative sum over kv-blocks) and full iff every row's interval covers them (the
    largest start and smallest end per q-block). Cost O(S + #tiles) time and memory for self-attention;
    with kv_segment_ids the pairing of q and kv runs by id adds a sort and a binary search per token
    (O(S log S)). No [S, S] or [S, block] temporary. Sequences must be shorter than 2^29 tokens.
    """
    specs = _inner_specs(inner)
    bq, bkv = _block_size(block_size, "block_classes")
    q_ids = _as_int32(segment_ids, "segment_ids", "block_classes")
    if q_ids.ndim < 1:
        raise ValueError(f"block_classes: segment_ids must have shape (*E, S), got {_shape(q_ids)}")
    if kv_positions is not None and kv_segment_ids is None:
        raise ValueError("block_classes: kv_positions given without kv_segment_ids")
    self_attention = kv_segment_ids is None
    kv_ids = q_ids if self_attention else _as_int32(kv_segment_ids, "kv_segment_ids", "block_classes")
    if kv_ids.ndim < 1 or kv_ids.shape[:-1] != q_ids.shape[:-1]:
        raise ValueError(
            f"block_classes: segment_ids {_shape(q_ids)} and kv_segment_ids {_shape(kv_ids)} must agree in every "
            "dim but the last"
        )

    def positions_of(pos, ids, name, ids_name):
        if pos is None:
            return None
        pos = _as_int32(pos, name, "block_classes")
        if pos.ndim < 1 or pos.ndim > ids.ndim or ids.shape[ids.ndim - pos.ndim:] != pos.shape:
            raise ValueError(
                f"block_classes: {name} of shape {_shape(pos)} must match {ids_name} {_shape(ids)} or a trailing "
                "part of it"
            )
        return jnp.broadcast_to(pos, ids.shape)

    q_pos = positions_of(positions, q_ids, "positions", "segment_ids")
    kv_pos = q_pos if self_attention else positions_of(kv_positions, kv_ids, "kv_positions", "kv_segment_ids")
    s_q, s_kv = q_ids.shape[-1], kv_ids.shape[-1]
    if max(s_q, s_kv) >= _MAX_TOKENS:
        raise ValueError(f"block_classes: sequences of {s_q} (q) and {s_kv} (kv) tokens; at most {_MAX_TOKENS - 1}")
    lead = q_ids.shape[:-1]
    nq, nkv = -(-s_q // bq), -(-s_kv // bkv)
    heads = len(specs)
    if s_q == 0 or s_kv == 0:
        return jnp.zeros(lead + (heads, nq, nkv), jnp.int8)

    n = _check_grid("block_classes", lead, nq, nkv)
    flat = lambda x: None if x is None else x.reshape(n, x.shape[-1])  # noqa: E731
    q_ids, kv_ids, q_pos, kv_pos = flat(q_ids), flat(kv_ids), flat(q_pos), flat(kv_pos)

    q_nz, qb, qe, qpb = _runs(q_ids, q_pos)
    if self_attention:
        found, kb, ke, kpb = q_nz, qb, qe, qpb
    else:
        _, _, kv_e, kv_pb = _runs(kv_ids, kv_pos)
        found, kb = _match_kv_runs(q_ids, kv_ids)
        found = found & q_nz
        ke = jnp.take_along_axis(kv_e, kb, axis=1)
        kpb = jnp.take_along_axis(kv_pb, kb, axis=1)

    t = lax.broadcasted_iota(jnp.int32, (n, s_q), 1)
    rq, qlen, klen = t - qb, qe - qb, ke - kb
    j = jnp.arange(nkv, dtype=jnp.int32)
    c0 = j * bkv
    c1 = jnp.minimum(c0 + bkv, s_kv)

    def classes_of(spec):
        a, b, row_ok = _local_interval(*spec, rq, qlen, qpb, klen, kpb)
        a = jnp.clip(a, 0, klen)
        b = jnp.clip(b, 0, klen)
        sees = found & (a < b)
        if row_ok is not None:
            sees = sees & row_ok
        lo, hi = kb + a, kb + b  # the row's keys [lo, hi), global kv indices

        # Non-empty tiles: the rows reaching each tile, counted from each seeing row's range of kv-blocks.
        nonempty = _rows_per_tile(n, nq, nkv, t // bq, [(lo // bkv, (hi - 1) // bkv + 1, sees)]) > 0

        # Full tiles: every row of the q-block sees all of the tile's columns. Rows past S_q are neutral.
        pad = nq * bq - s_q
        lo_all = jnp.pad(jnp.where(sees, lo, _INT32_MAX), ((0, 0), (0, pad)), constant_values=-1)
        hi_all = jnp.pad(jnp.where(sees, hi, -1), ((0, 0), (0, pad)), constant_values=_INT32_MAX)
        max_lo = lo_all.reshape(n, nq, bq).max(axis=-1)
        min_hi = hi_all.reshape(n, nq, bq).min(axis=-1)
        full = (max_lo[:, :, None] <= c0) & (min_hi[:, :, None] >= c1)
        return jnp.where(nonempty, jnp.where(full, 2, 1), 0).astype(jnp.int8)

    # Heads with the same mask share one computation (a head group).
    distinct = list(dict.fromkeys(specs))
    per_group = [classes_of(spec) for spec in distinct]
    classes = jnp.stack([per_group[distinct.index(spec)] for spec in specs], axis=1)
    return classes.reshape(lead + (heads, nq, nkv))

def multi_item_classes(tokens, delimiter, *, lengths=None, block_size=(128, 128)):
    """Tile classes of a multi-item scoring mask (sglang-jax), from traced tokens, in ``jax.numpy``.

    Arguments (JAX or NumPy arrays, traced or not):
      tokens      int [*E, S]: each row one packed request ``query ‖ d ‖ item_1 ‖ d ‖ … ‖ item_n ‖ d``.
      delimiter   the delimiter token d (an int, or a traced int scalar).
      lengths     int [*E] or None: the request's length in each row (tokens past it are not read; rows and
                  keys past it allow nothing); None: S. Traced.
      block_size  (block_q, block_kv) or one int for both. Static. Keys and queries share S.

    Returns int8 [*E, 1, ceil(S / block_q), ceil(S / block_kv)], TileClass values (0 empty, 1 partial,
    2 full) -- exactly ``seqattn.MultiItemMask([row[:length] for each row], d).block_mask(block_size=...)
    .classes()`` (padded with 0 to S's blocks) for rows the C++ accepts: at least two delimiters, the first
    after a non-empty query and the last at the request's end. With prefix_end = (first delimiter) + 1 and
    seg_start(q) = 1 + (the last delimiter before q), query q sees key k iff k <= q and (q < prefix_end or
    k < prefix_end or k >= seg_start(q)) (docs/semantics/multi-item-topk-kascade.md §A.3, TV-A2 included).
    A row that is not such a request is plain causal over its length (§A.3: not multi-item), where the C++
    raises.

    How: per row the keys form at most two intervals, [0, prefix_end) and [seg_start(q), q] (one when they
    touch); a tile is non-empty iff an interval meets it and full iff every row of its q-block has an
    interval covering it, each counted by one scatter per interval end and a cumulative sum over kv-blocks.
    O(S + #tiles) time and memory.
    """
    bq, bkv = _block_size(block_size, "multi_item_classes")
    tok = _as_int32(tokens, "tokens", "multi_item_classes")
    if tok.ndim < 1:
        raise ValueError(f"multi_item_classes: tokens must have shape (*E, S), got {_shape(tok)}")
    lead, s = tok.shape[:-1], tok.shape[-1]
    if s >= _MAX_TOKENS:
        raise ValueError(f"multi_item_classes: sequences of {s} tokens; at most {_MAX_TOKENS - 1}")
    if isinstance(delimiter, (int, np.integer)):
        if not _INT32_MIN <= int(delimiter) <= _INT32_MAX:
            raise ValueError(f"multi_item_classes: delimiter {int(delimiter)} is outside int32")
        delim = jnp.int32(int(delimiter))
    else:
        delim = _as_int32(delimiter, "delimiter", "multi_item_classes")
        if delim.shape != ():
            raise ValueError(f"multi_item_classes: delimiter must be a scalar, got shape {_shape(delim)}")
    if lengths is None:
        length = jnp.full(lead, s, jnp.int32)
    else:
        length = _as_int32(lengths, "lengths", "multi_item_classes")
        if length.shape != lead:
            raise ValueError(
                f"multi_item_classes: lengths of shape {_shape(length)} must have tokens' leading shape {lead} "
                f"(tokens {_shape(tok)})"
            )
        length = jnp.clip(length, 0, s)
    nq, nkv = -(-s // bq), -(-s // bkv)
    if s == 0:
        return jnp.zeros(lead + (1, nq, nkv), jnp.int8)

    n = _check_grid("multi_item_classes", lead, nq, nkv)
    tok, length = tok.reshape(n, s), length.reshape(n, 1)
    t = lax.broadcasted_iota(jnp.int32, (n, s), 1)
    valid = t < length
    is_delim = (tok == delim) & valid
    first_delim = jnp.min(jnp.where(is_delim, t, s), axis=1, keepdims=True)
    last_delim = jnp.max(jnp.where(is_delim, t, -1), axis=1, keepdims=True)
    # A request: a non-empty query and a delimiter at the end. (With one delimiter, the C++ rejects the row and
    # the mask below is causal anyway: prefix_end = length.)
    multi = (first_delim > 0) & (last_delim == length - 1)
    prefix_end = jnp.where(multi, first_delim + 1, 0)
    # seg_start(q) = 1 + the last delimiter strictly before q (0 before the first one: then q < prefix_end).
    before = jnp.concatenate([jnp.full((n, 1), -1, jnp.int32), jnp.where(is_delim, t, -1)[:, :-1]], axis=1)
    seg_start = jnp.where(multi, lax.cummax(before, axis=1) + 1, 0)
    in_prefix = t < prefix_end
    split = ~in_prefix & (seg_start > prefix_end)  # [0, prefix_end) and [seg_start, q] with a gap between
    end1 = jnp.where(split, prefix_end, t + 1)  # interval 1: [0, end1)
    lo2, hi2 = seg_start, t + 1  # interval 2 (split rows only)

    last_block_end = (length - 1) // bkv + 1  # kv-blocks of the request: [0, last_block_end)

    def covered(lo, hi):  # kv-blocks whose keys (up to the request's end) lie inside [lo, hi)
        first = (lo + bkv - 1) // bkv
        past = jnp.where(hi >= length, last_block_end, hi // bkv)
        return first, past

    q_block = t // bq
    reach = _rows_per_tile(n, nq, nkv, q_block, [
        (jnp.zeros_like(t), (end1 - 1) // bkv + 1, valid),
        (lo2 // bkv, (hi2 - 1) // bkv + 1, valid & split),
    ])
    f1, p1 = covered(jnp.zeros_like(t), end1)
    f2, p2 = covered(lo2, hi2)
    cover = _rows_per_tile(n, nq, nkv, q_block, [(f1, p1, valid & (f1 < p1)), (f2, p2, valid & split & (f2 < p2))])
    rows = jnp.clip(length - jnp.arange(nq, dtype=jnp.int32) * bq, 0, bq)  # [n, nq]: the q-block's rows
    full = (cover == rows[:, :, None]) & (rows[:, :, None] > 0)
    classes = jnp.where(reach > 0, jnp.where(full, 2, 1), 0).astype(jnp.int8)
    return classes.reshape(lead + (1, nq, nkv))




# --- Splash fed by traced metadata -------------------------------------------------------------------------------

# Inner masks whose element mask in a document equals the static mask in global coordinates (self-attention:
# a pair in one run has q_local - k_local = q - k, and both runs have the same length), so Splash's static
# mask and its segment-id operand together mask the partial tiles exactly.
_SHIFT_INVARIANT = ("full", "causal", "sliding_window")


def _next_active(active, coord):
    """For each step of an iteration order, ``coord`` of the first active step at or after it.

    After the last active step the order wraps to the first one; with no active step every entry is 0. This is
    the rule of Splash's ``_process_mask`` for ``data_next`` and ``mask_next``: a skipped grid step names the
    block the next computing step needs, so the pipeline fetches it early and never fetches in between.
    active: bool [N]; coord: int32 [N]. O(N).
    """
    n = active.shape[0]
    step = jnp.arange(n, dtype=jnp.int32)
    nxt = lax.cummin(jnp.where(active, step, n), axis=0, reverse=True)
    first = nxt[0]
    nxt = jnp.where(nxt == n, first, nxt)
    return jnp.where(first == n, 0, coord[jnp.minimum(nxt, n - 1)])


def _small_int(bound):
    """Splash's scalar-memory dtype for values in [0, bound] (its downcast_smem_data rule)."""
    if bound <= np.iinfo(np.int8).max:
        return jnp.int8
    return jnp.int16 if bound <= np.iinfo(np.int16).max else jnp.int32


def _static_blocks(static):
    """The static MaskInfo's partial blocks with an all-ones block appended (its index is the old count)."""
    if static.partial_mask_blocks is None:
        return None
    blocks = np.asarray(static.partial_mask_blocks, dtype=np.bool_)
    return np.concatenate([blocks, np.ones((1,) + blocks.shape[1:], np.bool_)])


def _partial_block_of(static_classes, static_mask_next, ones):
    """int32 per tile: the static partial block of a tile the static mask has partial, else ``ones`` (the
    appended all-ones block) -- the element mask of a tile the documents make partial."""
    return jnp.asarray(np.where(static_classes == 1, static_mask_next, ones).astype(np.int32))


def _traced_mask_info(classes, static, *, is_dkv, downcast):
    """One example's (data_next, mask_next, block_mask) from its tile classes and the static mask's MaskInfo.

    classes: int8 [Hm, nq, nkv], the document mask's TileClass values (a subset of the static mask's tiles);
    the static MaskInfo has the same grid (not shrunk). A tile the static mask has partial keeps its partial
    block; a tile the static mask has full but the documents cut gets the all-ones block ``_static_blocks``
    appends (the segment-id operand masks it).
    """
    heads, nq, nkv = classes.shape
    cls = classes.astype(jnp.int32)
    has_blocks = static.partial_mask_blocks is not None
    if has_blocks:
        ones = int(np.shape(static.partial_mask_blocks)[0])
        block_of = _partial_block_of(np.broadcast_to(np.asarray(static.block_mask), (heads, nq, nkv)),
                                     np.broadcast_to(np.asarray(static.mask_next), (heads, nq, nkv)), ones)

    # Splash's iteration order: (head, q-block, kv-block) forward, (kv-block, head, q-block) for dK/dV, whose
    # data_next holds q-block indices.
    order = (2, 0, 1) if is_dkv else (0, 1, 2)
    back = tuple(int(a) for a in np.argsort(order))
    grid = tuple((heads, nq, nkv)[a] for a in order)
    data_coord = lax.broadcasted_iota(jnp.int32, (heads, nq, nkv), 1 if is_dkv else 2)
    in_order = lambda x: jnp.transpose(x, order).reshape(-1)  # noqa: E731
    from_order = lambda x: jnp.transpose(x.reshape(grid), back)  # noqa: E731

    data_next = from_order(_next_active(in_order(cls > 0), in_order(data_coord)))
    mask_next = from_order(_next_active(in_order(cls == 1), in_order(block_of))) if has_blocks else None
    block_mask = cls
    if downcast:
        block_mask = block_mask.astype(jnp.int8)
        data_next = data_next.astype(_small_int(nq if is_dkv else nkv))
        if has_blocks:
            mask_next = mask_next.astype(_small_int(ones))
    return data_next, mask_next, block_mask


@jax.tree_util.register_pytree_node_class
class SplashMetadata(NamedTuple):
    """Splash's MaskInfos for a batch of documents, built under jit by ``splash_mask_info``.

    ``forward``, ``dq`` and ``dkv`` are JAX ``MaskInfo``s whose ``data_next``, ``mask_next`` and ``block_mask``
    carry a leading batch dim ([B, H, q-blocks, kv-blocks]) and whose ``partial_mask_blocks`` and ``q_sequence``
    are the static mask's (shared by every row); ``dq`` is None with the fused backward kernel.
    ``mask_function`` is the static Splash mask's callable or None. A pytree (``mask_function`` is static), so
    it can be returned from and passed into jitted functions.
    """

    forward: Any
    dq: Any
    dkv: Any
    mask_function: Any

    def tree_flatten(self):
        return (self.forward, self.dq, self.dkv), self.mask_function

    @classmethod
    def tree_unflatten(cls, mask_function, children):
        return cls(*children, mask_function)


def _splash_setup(mask, block_sizes, who):
    """(specs, block_sizes, mask) after checking the mask is one Splash can pair with segment ids exactly."""
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk

    if mask is None:
        mask = _core.FullMask()
    specs = _inner_specs(mask)
    for h, (kind, _) in enumerate(specs):
        if kind not in _SHIFT_INVARIANT:
            where = f" (head {h})" if len(specs) > 1 else ""
            raise ValueError(
                f"{who}: mask={mask!r}{where}: a {kind} mask is applied in each document's own coordinates, which "
                "Splash's static mask (global coordinates) cannot express; supported: FullMask, CausalMask, "
                "SlidingWindowMask (either alignment) or a PerHeadMask of them"
            )
    if block_sizes is None:
        block_sizes = sk.BlockSizes.get_default()
    return specs, block_sizes, mask


def _static_info(mask, block_shape, is_dkv, s, heads, downcast):
    from .splash import process_mask

    return process_mask(mask, block_shape, is_dkv, q_len=s, kv_len=s, heads=heads, downcast_smem_data=downcast,
                        shrink_grid=False)


def _padding_diagonal_tiles(ids, bq, bkv):
    """bool [B, nq, nkv]: the tiles holding a padding token's own (q, kv) pair.

    Splash gives a row of a q-block whose tiles are all skipped 0/0 and a log-sum-exp of -inf. The dQ and
    dK/dV passes may use other block sizes than the forward pass, so they may visit such a row (inside a larger
    q-block) and compute exp(s - lse) = inf, times a zero cotangent: NaN in dK and dV. Visiting, in the forward
    pass, the tile of each padding token's own pair gives every padding row a finite log-sum-exp (the segment-id
    operand lets padding see padding); those rows' outputs are set to 0 afterwards.
    """
    n, s = ids.shape
    nq, nkv = s // bq, s // bkv
    t = jnp.arange(s, dtype=jnp.int32)
    tile = (lax.broadcasted_iota(jnp.int32, (n, s), 0) * nq + t // bq) * nkv + t // bkv
    hits = jnp.zeros(n * nq * nkv, jnp.int32).at[tile.ravel()].add((ids == 0).astype(jnp.int32).ravel(),
                                                                   mode="promise_in_bounds")
    return (hits > 0).reshape(n, nq, nkv)


def _pass_classes(who, segment_ids, positions, mask, passes):
    """(S, [(name, (bq, bkv), is_dkv, classes [B, H, nq, nkv]) per pass]) for the traced metadata builders.

    Checks the ids and that every pass's block sizes divide S; passes with equal block sizes share their
    classes; the forward pass also visits each padding token's own tile (``_padding_diagonal_tiles``).
    """
    ids = _as_int32(segment_ids, "segment_ids", who)
    if ids.ndim != 2:
        raise ValueError(f"{who}: segment_ids must have shape (B, S), got {_shape(ids)}")
    s = ids.shape[1]
    for name, (bq, bkv), _ in passes:
        if s % bq or s % bkv:
            raise ValueError(
                f"{who}: the sequence length {s} (segment_ids {_shape(ids)}) must be a multiple of the {name} "
                f"block sizes ({bq}, {bkv}) (Splash has no short blocks)"
            )
    shared, out = {}, []
    for name, (bq, bkv), is_dkv in passes:
        if (bq, bkv) not in shared:
            shared[bq, bkv] = block_classes(ids, positions, inner=mask, block_size=(bq, bkv))
        classes = shared[bq, bkv]
        if name == "forward":
            extra = (classes == 0) & _padding_diagonal_tiles(ids, bq, bkv)[:, None]
            classes = jnp.where(extra, jnp.int8(1), classes)
        out.append((name, (bq, bkv), is_dkv, classes))
    return s, out


def splash_mask_info(segment_ids, positions=None, *, mask=None, block_sizes=None, downcast_smem_data=True):
    """Splash's forward, dQ and dK/dV MaskInfos of packed documents, from traced segment ids, under jit.

    segment_ids  int [B, S] (TransformerEngine ids, 0 = padding; as ``block_classes``), self-attention.
    positions    as ``block_classes`` (optional; they do not change these masks).
    mask         the mask inside each document (static): ``FullMask()`` (None), ``CausalMask``,
                 ``SlidingWindowMask`` or a ``PerHeadMask`` of them. In one document these equal the same mask
                 over the whole sequence, which is what lets Splash's static mask plus its segment-id operand
                 mask the partial tiles; chunked-causal and prefix-LM masks are refused.
    block_sizes  Splash ``BlockSizes`` (default: Splash's); S must be a multiple of every block size.

    Per row, the tiles the documents leave empty are skipped (``block_mask`` 0) and ``data_next`` /
    ``mask_next`` name the next computing tile, as Splash's ``_process_mask`` would for that row's dense mask
    (without grid shrinking, whose shapes would depend on the values); tiles wholly inside one document keep
    the static mask's class. In the forward MaskInfo a padding token's own tile is also visited (see
    ``_padding_diagonal_tiles``). O(S + #tiles) per row, no [S, S] temporary.
    """
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask_info as mi

    specs, block_sizes, mask = _splash_setup(mask, block_sizes, "splash_mask_info")
    shapes = [("forward", (block_sizes.block_q, block_sizes.block_kv), False)]
    if block_sizes.has_backward_blocks:
        if not block_sizes.use_fused_bwd_kernel:
            shapes.append(("dq", (block_sizes.block_q_dq, block_sizes.block_kv_dq), False))
        shapes.append(("dkv", (block_sizes.block_q_dkv, block_sizes.block_kv_dkv), True))
    s, passes = _pass_classes("splash_mask_info", segment_ids, positions, mask, shapes)
    infos, fn = {}, None
    for name, (bq, bkv), is_dkv, classes in passes:
        static, f = _static_info(mask, (bq, bkv), is_dkv, s, len(specs), downcast_smem_data)
        fn = f if name == "forward" else fn
        data_next, mask_next, block_mask = jax.vmap(
            lambda c, static=static, is_dkv=is_dkv: _traced_mask_info(c, static, is_dkv=is_dkv,
                                                                      downcast=downcast_smem_data))(classes)
        blocks = _static_blocks(static)
        infos[name] = mi.MaskInfo(
            data_next=data_next, mask_next=mask_next, block_mask=block_mask,
            partial_mask_blocks=None if blocks is None else jnp.asarray(blocks),
            q_sequence=None if static.q_sequence is None else jnp.asarray(static.q_sequence))
    return SplashMetadata(infos["forward"], infos.get("dq"), infos.get("dkv"), fn)


def _info_axes(info):
    """vmap axes of a batched MaskInfo (either layout): per-row index arrays on axis 0, static leaves shared."""
    if info is None:
        return None
    shared = ("partial_mask_blocks", "q_sequence", "is_dynamic_mask")
    return type(info)(**{f: None if f in shared or getattr(info, f) is None else 0 for f in info._fields})


def _tokamax_traced_info(classes, static, blocks, *, is_dkv, dynamic_grid):
    """One row's tokamax MaskInfo from its tile classes [nq, nkv] and the static mask's.

    ``static``: the static mask's tokamax MaskInfo on the dense grid (``splash.tokamax_mask_info`` with
    ``return_dynamic_grid=False``); ``blocks``: its partial tiles with an all-ones tile appended (None when it
    has none). With ``dynamic_grid`` the visited tiles are listed in tokamax's order with
    ``jnp.nonzero(size=#tiles)``: the lists have a static length, ``num_active_blocks`` says how much of it the
    kernel's grid runs. Without it, ``block_mask`` and ``mask_next`` cover every tile of the (transposed for
    dK/dV) grid, as tokamax's dense grid has them.
    """
    from tokamax._src.ops.experimental.tpu.splash_attention import splash_attention_mask_info as tmi

    grid = (classes.T if is_dkv else classes).astype(jnp.int32)
    n = grid.size
    if dynamic_grid:
        visited = grid > 0
        if is_dkv:  # a kv-block no query sees is visited once, at column 0, so its zero gradient is written
            visited = visited.at[:, 0].set(visited[:, 0] | ~visited.any(axis=1))
        rows, cols = jnp.nonzero(visited, size=n, fill_value=-1)
        count = visited.sum(dtype=jnp.int32)
        live = jnp.arange(n, dtype=jnp.int32) < count
        r, c = jnp.where(live, rows, 0), jnp.where(live, cols, 0)
        block_mask = jnp.where(live, grid[r, c], 0)
    else:
        live = jnp.ones(n, bool)
        r, c = jnp.divmod(jnp.arange(n, dtype=jnp.int32), grid.shape[1])
        block_mask = grid.ravel()
    mask_next = None
    if blocks is not None:
        block_of = _partial_block_of(np.asarray(static.block_mask).reshape(grid.shape),
                                     np.asarray(static.mask_next).reshape(grid.shape), blocks.shape[0] - 1)
        mask_next = _next_active(live & (block_mask == 1), block_of[r, c]).astype(jnp.int32)
    lists = dict(active_rows=rows.astype(jnp.int32), active_cols=cols.astype(jnp.int32),
                 num_active_blocks=count[None]) if dynamic_grid else dict(active_rows=None, active_cols=None,
                                                                           num_active_blocks=None)
    return tmi.MaskInfo(mask_next=mask_next, block_mask=block_mask.astype(jnp.int8), partial_mask_blocks=None,
                        q_sequence=None, **lists)


def tokamax_mask_info(segment_ids, positions=None, *, mask=None, config=None):
    """tokamax's forward and dK/dV MaskInfos of packed documents (dynamic grid), from traced ids, under jit.

    As ``splash_mask_info`` (same ``segment_ids``, ``positions``, ``mask`` rules; one mask for every head), in
    tokamax's layout (docs/semantics/splash-and-flex.md §12): the forward pass on the active-tile grid (per row
    ``active_rows`` / ``active_cols`` list the tiles the documents reach, static length #tiles,
    ``num_active_blocks`` of them used; ``block_mask`` and ``mask_next`` per listed tile), the dK/dV pass on the
    dense grid unless ``config.dq_reduction_steps`` is 3 -- as tokamax's ``make_splash_mha`` builds them.
    ``config``: a tokamax ``SplashConfig`` (default: tokamax's). Returns a ``SplashMetadata`` with ``dq`` None.
    """
    from tokamax._src.ops.experimental.tpu.splash_attention import splash_attention_kernel as tk

    from .splash import tokamax_mask_info as static_info

    specs, _, mask = _splash_setup(mask, None, "tokamax_mask_info")
    if len(specs) != 1:
        raise ValueError(f"tokamax_mask_info: tokamax has one mask for every head, but {mask!r} has {len(specs)}")
    config = config or tk.SplashConfig.get_default()
    shapes = [("forward", (config.block_q, config.block_kv), False)]
    if config.has_backward_blocks:
        shapes.append(("dkv", (config.block_q_dkv, config.block_kv_dkv), True))
    s, passes = _pass_classes("tokamax_mask_info", segment_ids, positions, mask, shapes)
    infos, fn = {}, None
    for name, (bq, bkv), is_dkv, classes in passes:
        static, f = static_info(mask, (bq, bkv), is_dkv, q_len=s, kv_len=s, downcast_smem_data=False,
                                return_dynamic_grid=False)
        fn = f if name == "forward" else fn
        blocks = _static_blocks(static)
        classes = classes[:, 0]
        dynamic = not is_dkv or config.dq_reduction_steps == 3
        info = jax.vmap(lambda c, static=static, blocks=blocks, is_dkv=is_dkv, dynamic=dynamic: _tokamax_traced_info(
            c, static, blocks, is_dkv=is_dkv, dynamic_grid=dynamic))(classes)
        infos[name] = info._replace(
            partial_mask_blocks=None if blocks is None else jnp.asarray(blocks.astype(np.int8)),
            q_sequence=None if static.q_sequence is None else jnp.asarray(static.q_sequence))
    return SplashMetadata(infos["forward"], None, infos.get("dkv"), fn)


def splash_attention(q, k, v, segment_ids, positions=None, *, mask=None, block_sizes=None, sinks=None,
                     attn_logits_soft_cap=None, mask_value=None, downcast_smem_data=True, interpret=False,
                     metadata=None, implementation="jax"):
    """Splash attention over packed documents whose block metadata is built from traced ids, under jit.

    q [B, Hq, S, D], k and v [B, Hkv, S, D] (Hq a multiple of Hkv: GQA/MQA without copies), segment_ids int
    [B, S] (0 = padding), all traceable; ``mask`` the static mask inside each document (as
    ``splash_mask_info``); ``sinks`` [Hq] optional. Like Splash, q is not scaled: pass q * scale.

    Each row gets its own MaskInfo (``splash_mask_info``; pass ``metadata=`` to reuse one built earlier), so
    Splash skips the tiles between documents (no compute, no new DMA) while the segment ids, passed to Splash
    as its operand, mask the pairs inside the tiles that cross a document boundary. Rows of padding (id 0) give
    0 and pass no gradient (Splash alone lets them attend to the padding keys of the tiles it visits: their
    outputs are replaced, and their zero cotangent carries nothing into dQ, dK or dV). Runs on TPU, or in
    Pallas interpret mode with ``interpret=True``; ``jax.grad`` goes through Splash's dQ and dK/dV kernels with
    the same per-row metadata.

    ``implementation="tokamax"`` runs tokamax's Splash ("Splash 2.0") instead, on ``tokamax_mask_info``'s
    metadata (its forward grid runs over the listed tiles only); ``block_sizes`` is then a tokamax
    ``SplashConfig``, the mask one mask for every head.
    """
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk

    if implementation not in ("jax", "tokamax"):
        raise ValueError(f"splash_attention: implementation must be 'jax' or 'tokamax', got {implementation!r}")
    tokamax = implementation == "tokamax"
    user_config = block_sizes if tokamax else None
    _, block_sizes, mask = _splash_setup(mask, None if tokamax else block_sizes, "splash_attention")
    ids = _as_int32(segment_ids, "segment_ids", "splash_attention")
    shapes = {"q": _shape(q), "k": _shape(k), "v": _shape(v), "segment_ids": _shape(ids)}
    if len(shapes["q"]) != 4 or len(shapes["k"]) != 4 or len(shapes["v"]) != 4:
        raise ValueError(f"splash_attention: q, k and v must be [B, H, S, D], got {shapes}")
    b, hq, s, _ = shapes["q"]
    hkv = shapes["k"][1]
    if (shapes["k"][0] != b or shapes["v"][:3] != shapes["k"][:3] or shapes["k"][2] != s
            or shapes["k"][3] != shapes["q"][3] or ids.shape != (b, s)):
        raise ValueError(
            f"splash_attention: expected q [B, Hq, S, D], k [B, Hkv, S, D], v [B, Hkv, S, Dv] and segment_ids "
            f"[B, S] (self-attention), got {shapes}"
        )
    if hkv == 0 or hq % hkv:
        raise ValueError(f"splash_attention: q's {hq} heads must be a multiple of k's {hkv} heads ({shapes})")
    heads = len(_inner_specs(mask))
    if heads not in (1, hq):
        raise ValueError(f"splash_attention: mask={mask!r} has {heads} heads; q has {hq}")
    if tokamax:
        import dataclasses

        from tokamax._src.ops.experimental.tpu.splash_attention import base as tbase
        from tokamax._src.ops.experimental.tpu.splash_attention import splash_attention_kernel as tk

        config = dataclasses.replace(user_config or tk.SplashConfig.get_default(),
                                     interpret=interpret or (user_config is not None and user_config.interpret))
        if attn_logits_soft_cap is not None:
            config = dataclasses.replace(config, attn_logits_soft_cap=attn_logits_soft_cap)
        if metadata is None:
            metadata = tokamax_mask_info(ids, positions, mask=mask, config=config)

        def one_row(fwd, dq, dkv, q, k, v, ids):
            del dq
            kernel = tk.SplashAttentionKernel(
                fwd, dkv, config=config, is_mqa=False, save_residuals=False,
                mask_value=tbase.DEFAULT_MASK_VALUE if mask_value is None else mask_value,
                mask_function=metadata.mask_function, fwd_mask_sparsity=1.0, dkv_mask_sparsity=1.0)
            return kernel(q, k, v, segment_ids=tbase.SegmentIds(ids, ids), sinks=sinks)
    elif metadata is None:
        metadata = splash_mask_info(ids, positions, mask=mask, block_sizes=block_sizes,
                                    downcast_smem_data=downcast_smem_data)

    def splash_row(fwd, dq, dkv, q, k, v, ids):
        kernel = sk.SplashAttentionKernel(
            fwd, dq, dkv, block_sizes=block_sizes, is_mqa=False, save_residuals=False,
            mask_value=sk.DEFAULT_MASK_VALUE if mask_value is None else mask_value,
            attn_logits_soft_cap=attn_logits_soft_cap, residual_checkpoint_name=None,
            mask_function=metadata.mask_function, interpret=interpret)
        return kernel(q, k, v, segment_ids=sk.SegmentIds(ids, ids), sinks=sinks)

    out = jax.vmap(one_row if tokamax else splash_row, in_axes=(_info_axes(metadata.forward), _info_axes(metadata.dq),
                                     _info_axes(metadata.dkv), 0, 0, 0, 0))(
        metadata.forward, metadata.dq, metadata.dkv, q, k, v, ids)
    return jnp.where((ids != 0)[:, None, :, None], out, jnp.zeros((), out.dtype))


__all__ = ["SUPPORTED_INNER", "SplashMetadata", "block_classes", "multi_item_classes", "splash_attention",
           "splash_mask_info", "tokamax_mask_info"]
