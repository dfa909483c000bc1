"""seqattn's Pallas TPU flash attention: forward with LSE, dQ and dK/dV, each grid walking a BlockLayout's lists.

Semantics are the CPU engine's (``seqattn.attention``): logits ``softcap(scale * q k^T)`` (scale first, then
``cap * tanh(x / cap)``), masked pairs excluded, an optional per-head sink logit in every row's denominator (the
returned LSE includes it), a row that may attend to nothing gets out 0 and LSE -inf (the sink when there is one).

Every data-dependent index comes from scalar prefetch (the layout's lists and the page table, in SMEM); the kernels
read scalars from them and never index a ref with a vector, so the TPU lowering accepts them (see
test_pallas_kernel.py's export gate). Mask algebra is int32 (Mosaic truncates some boolean vector ops).

Hidden values are never read into a result (the engine's NaN policy, ``softmax_state.hpp``), as far as a matmul
allows: a probability of 0 still multiplies its value row in ``p @ v`` (0 * NaN = NaN). Garbage lives in rows the mask
hides -- padding, stale cache pages, other documents, and the rows past a sequence's end a ragged block reads (stale
VMEM; NaN in interpret mode). Full tiles see every pair, so only the partial path deals with it: it ANDs the in-range
condition into the mask, computes which operand rows at least one row of the tile may see (a small matmul of the
allow matrix with ones) and zeroes the others before each matmul that would multiply them by 0 -- V and K (dQ) rows
no query of the tile sees, q and dO rows (dK/dV) that see no key of the tile. Left as IEEE arithmetic: a non-finite
row that some row of the same tile does see reaches the tile's other rows through 0 * x (the engine selects per
pair); that needs a bad value in a visible row, i.e. a result that is NaN already.

Segment ids: id 0 is padding (as the engine's DocumentMask): a partial tile allows (i, j) only if q_id[i] ==
kv_id[j] != 0.

``scale`` and ``softcap`` are static Python floats (they specialise the kernels); a traced value is refused.
``positions`` default to token indices: the top-left alignment. Decode / extend (q_len < kv_len, queries at the end)
passes positions, e.g. ``(kv_len - q_len + arange(q_len), arange(kv_len))`` for bottom-right causal.

TPU risks not settled without a TPU: the int32 [bq, bkv] temporaries of the mask algebra are counted in the VMEM
budget (``_vmem_bytes``) but their live ranges are the compiler's; lse / delta blocks are [bq, 1] (lane-padded 128x
in VMEM; Splash broadcasts them to [bq, 128]); ``jax.export`` runs the Pallas-to-Mosaic lowering only, not Mosaic's
own passes, so a shape Mosaic rejects at compile time would first show on a TPU.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from .layout import _KV_FIELDS, _Q_FIELDS, FULL_TILE, PREDICATE_TILE, BlockLayout

_NT = (((1,), (1,)), ((), ()))  # a @ b.T without materialising the transpose
_NN = (((1,), (0,)), ((), ()))
_TN = (((0,), (0,)), ((), ()))  # a.T @ b (the TPU matmul takes a transposed left operand, as Splash's dK/dV does)
_STEP_TILE = (8, 128)  # one int32 vreg per row of the step counter: a TPU-legal block
_MIN_D, _MAX_D = 64, 256


def window(left, right):
    """The ``inner`` predicate allowing keys at positions ``[q_pos - left, q_pos + right]``."""
    return ("window", int(left), int(right))


class _Static(NamedTuple):
    """Everything the kernels specialise on (hashable: custom_vjp's nondiff argument)."""

    batch: int
    heads: int
    kv_heads: int
    mask_heads: int
    q_len: int
    kv_len: int
    block_q: int
    block_kv: int
    q_width: int
    kv_width: int
    pages_per_seq: int  # 0: K/V not paged
    scale: float
    softcap: float  # 0: off
    inner: tuple
    has_ids: bool
    has_pos: bool
    has_sinks: bool
    interpret: bool
    count_steps: bool = False

    @property
    def group(self):
        return self.heads // self.kv_heads

    @property
    def nq(self):
        return -(-self.q_len // self.block_q)

    @property
    def nk(self):
        return -(-self.kv_len // self.block_kv)


# ---------------------------------------------------------------------------------------------------------------
# Index arithmetic shared by index maps and kernel bodies (scalars read from SMEM only).


def _entry(start_ref, count_ref, row, j):
    """The entry grid step j of a row reads: steps past the row's count repeat its last entry (no new DMA)."""
    n = count_ref[row]
    return start_ref[row] + jnp.minimum(j, jnp.maximum(n - 1, 0)), n


def _q_row(st, b, h, qi):
    hm = h if st.mask_heads > 1 else 0
    return (b * st.mask_heads + hm) * st.nq + qi


def _kv_row(st, b, h, kb):
    hm = h if st.mask_heads > 1 else 0
    return (b * st.mask_heads + hm) * st.nk + kb


def _kv_head_step(st, hkv, j):
    """dK/dV grid step j of kv head hkv: the group's q head it serves and the step within that head's row."""
    # lax.div / rem, not // and %: jnp's floor division of signed ints lowers through sign(), which Mosaic
    # only lowers on a known TPU generation (j >= 0, so truncation is floor).
    return hkv * st.group + lax.div(j, st.kv_width), lax.rem(j, st.kv_width)


def _allowed(st, tile, bits, q_base, kv_base, q_ids, kv_ids, q_pos, kv_pos, shape, q_axis):
    """int32 [shape] mask of a partial tile: bits AND ids AND inner AND in-range (1 = attend).

    ``q_axis`` says which axis of ``shape`` runs over queries (0 forward/dQ, 1 dK/dV); ids and positions come
    already shaped to broadcast against it (a column for the sublane axis, a row for the lane axis)."""
    one = jnp.int32(1)
    # -2 tiles carry no bits: the fetched tile is some other tile's and must not count.
    allow = jnp.maximum(bits.astype(jnp.int32), jnp.where(tile == PREDICATE_TILE, one, jnp.int32(0)))
    q_idx = q_base + lax.broadcasted_iota(jnp.int32, shape, q_axis)
    kv_idx = kv_base + lax.broadcasted_iota(jnp.int32, shape, 1 - q_axis)
    if st.has_ids:
        # Id 0 is padding (the engine's DocumentMask): it matches nothing, itself included.
        allow = allow * jnp.where(q_ids == kv_ids, one, 0) * jnp.where(q_ids != 0, one, 0)
    if st.inner[0] != "full":
        qp = q_pos if st.has_pos else q_idx
        kp = kv_pos if st.has_pos else kv_idx
        if st.inner[0] == "causal":
            allow = allow * jnp.where(qp >= kp, one, 0)
        else:
            _, left, right = st.inner
            allow = allow * jnp.where(kp >= qp - left, one, 0) * jnp.where(kp <= qp + right, one, 0)
    if st.q_len % st.block_q:
        allow = allow * jnp.where(q_idx < st.q_len, one, 0)
    if st.kv_len % st.block_kv:
        allow = allow * jnp.where(kv_idx < st.kv_len, one, 0)
    return allow


def _seen_rows(allow):
    """[n, 1] bool for allow [m, n]: which of n operand rows at least one of the m rows may see.

    A matmul with ones (allow^T @ 1) puts the per-column count on sublanes, where the operand's rows are, without a
    vector transpose; 0/1 sums stay exact in fp32."""
    ones = jnp.ones((allow.shape[0], 128), jnp.float32)
    seen = lax.dot_general(allow.astype(jnp.float32), ones, _TN, preferred_element_type=jnp.float32)
    return seen[:, :1] > 0.0


def _keep_rows(x, seen):
    """x [n, D] with the rows no one sees set to 0 (a select: they may hold NaN, and 0 * NaN = NaN in a matmul)."""
    return jnp.where(seen, x, jnp.zeros_like(x))


def _logits(st, a, b):
    """softcap(scale * a b^T) in fp32, and tanh's value for the softcap gradient (None when off)."""
    s = lax.dot_general(a, b, _NT, preferred_element_type=jnp.float32) * st.scale
    if not st.softcap:
        return s, None
    t = jnp.tanh(s * (1.0 / st.softcap))
    return st.softcap * t, t


def _split(st, refs, names):
    """Names the kernel's refs: the five list arrays (and the page table) first, then ``names`` in order."""
    rest = refs[6 if st.pages_per_seq else 5:]
    assert len(rest) == len(names), (len(rest), names)
    return dict(zip(("start", "count", "ent", "tile", "fetch"), refs[:5])) | dict(zip(names, rest))


def _start_row(st, r, *scratch):
    """At a row's first grid step: the fp32 scratch ``scratch`` zeroed, and the step counter."""
    for name in scratch:
        r[name][...] = jnp.zeros(r[name].shape, jnp.float32)
    if st.count_steps:
        r["steps"][...] = jnp.zeros(r["steps"].shape, jnp.int32)


def _dispatch(st, r, live, tile, step):
    """Runs ``step(partial)`` at a live grid step: full tiles without mask work, the others with it; counts steps."""
    pl.when(live & (tile == FULL_TILE))(lambda: step(False))
    pl.when(live & (tile != FULL_TILE))(lambda: step(True))
    if st.count_steps:
        @pl.when(live)
        def _count():
            r["steps"][...] += 1


def _optional_names(st):
    names = []
    if st.has_ids:
        names += ["q_ids", "kv_ids"]
    if st.has_pos:
        names += ["q_pos", "kv_pos"]
    return names


def _predicate_values(r, q_col):
    """ids / positions shaped to broadcast over a tile: the sublane side's values as a column [n, 1] (lane 0 of its
    lane-dense [n, 128] block), the lane side's as a row [1, n] (sublane 0 of its [8, n] block). ``q_col``: the
    query side is the column (forward, dQ), else the key side (dK/dV)."""
    def get(name):
        if name not in r:
            return None
        col = name.startswith("q_") == q_col
        return r[name][:, 0:1] if col else r[name][0:1, :]

    return get("q_ids"), get("kv_ids"), get("q_pos"), get("kv_pos")


# ---------------------------------------------------------------------------------------------------------------
# Forward.
#
# Grid (B, H, NQ, q_width); step (b, h, qi, j) computes entry j of q block qi's row (nothing past its count).
# Blocks: q [bq, D] (b, h, qi); k, v [bkv, D] (b, h // group, kv block) or page (page_table[b, kv block], h // group);
# bits int8 [bq, bkv] (q_fetch of the entry); ids / positions lane-dense [bq, 128] and [8, bkv]; out [bq, D];
# lse [bq, 1].
# VMEM (bq = bkv = 512, D = 128, bf16): double-buffered q, k, v, out 1 MiB, bits 0.5 MiB, fp32 scratch acc
# 0.25 MiB and m, l 0.5 MiB (a [bq, 1] buffer pads to 128 lanes), plus the compiler's fp32 [bq, bkv] temporaries
# (s, p: 1 MiB each) and the int32 mask algebra of partial tiles: ``_vmem_bytes`` counts them all per
# configuration, and each pallas_call asks for that budget (``_params``).
# HBM: q and out once per q block; k, v once per listed entry (a repeated index re-uses the buffer); bits once
# per change of the fetch index, i.e. per listed partial tile at most; nothing for unlisted blocks.


def _fwd_kernel(st, *refs):
    names = ["q", "k", "v", "bits"] + _optional_names(st) + (["sinks"] if st.has_sinks else [])
    names += ["o", "lse"] + (["steps"] if st.count_steps else []) + ["m", "l", "acc"]
    r = _split(st, refs, names)
    b, h, qi, j = (pl.program_id(i) for i in range(4))
    e, n = _entry(r["start"], r["count"], _q_row(st, b, h, qi), j)
    tile, kb = r["tile"][e], r["ent"][e]

    @pl.when(j == 0)
    def _init():
        r["m"][...] = jnp.full(r["m"].shape, -jnp.inf, jnp.float32)
        _start_row(st, r, "l", "acc")

    def step(partial):
        v = r["v"][...]
        s, _ = _logits(st, r["q"][...], r["k"][...])
        if partial:
            allow = _allowed(st, tile, r["bits"][...], qi * st.block_q, kb * st.block_kv, *_predicate_values(r, True),
                             s.shape, 0)
            s = jnp.where(allow != 0, s, -jnp.inf)
            v = _keep_rows(v, _seen_rows(allow))  # keys no query here sees: p = 0 must not meet their garbage
        m_prev = r["m"][...]
        m_new = jnp.maximum(m_prev, jnp.max(s, axis=1, keepdims=True))
        # A row with nothing allowed yet keeps m = -inf; shifting by 0 instead keeps exp() free of inf - inf.
        m_safe = jnp.where(m_new == -jnp.inf, 0.0, m_new)
        alpha = jnp.exp(m_prev - m_safe)
        p = jnp.exp(s - m_safe)
        r["l"][...] = alpha * r["l"][...] + jnp.sum(p, axis=1, keepdims=True)
        r["acc"][...] = alpha * r["acc"][...] + lax.dot_general(p.astype(v.dtype), v, _NN,
                                                               preferred_element_type=jnp.float32)
        r["m"][...] = m_new

    _dispatch(st, r, j < n, tile, step)

    @pl.when(j == st.q_width - 1)
    def _finish():
        m, l, acc = r["m"][...], r["l"][...], r["acc"][...]
        if st.has_sinks:
            sink = r["sinks"][0, h]
            top = jnp.maximum(m, sink)
            corr = jnp.exp(m - top)  # 0 for a row that saw no key: only the sink is left
            total = l * corr + jnp.exp(sink - top)
            r["o"][...] = (acc * (corr / total)).astype(r["o"].dtype)
            r["lse"][...] = top + jnp.log(total)
        else:
            empty = l == 0.0
            safe = jnp.where(empty, 1.0, l)
            r["o"][...] = (acc / safe).astype(r["o"].dtype)
            r["lse"][...] = jnp.where(empty, -jnp.inf, m + jnp.log(safe))


# ---------------------------------------------------------------------------------------------------------------
# dQ.
#
# Grid (B, H, NQ, q_width) as the forward. Blocks: q, dO [bq, D], lse and delta [bq, 1], k, v [bkv, D], bits
# [bq, bkv]; out dq [bq, D]; fp32 scratch dq [bq, D]. VMEM (512 / 512 / 128, bf16): q, dO, k, v, dq 1.25 MiB,
# bits 0.5, lse / delta 1 (lane-padded), scratch 0.25, temporaries s, p, dp, ds 4: about 7 MiB.
# HBM: q, dO, lse, delta, dq once per q block; k, v once per listed entry.


def _dq_kernel(st, *refs):
    names = ["q", "k", "v", "bits"] + _optional_names(st) + ["lse", "delta", "do", "dq"]
    names += (["steps"] if st.count_steps else []) + ["acc"]
    r = _split(st, refs, names)
    b, h, qi, j = (pl.program_id(i) for i in range(4))
    e, n = _entry(r["start"], r["count"], _q_row(st, b, h, qi), j)
    tile, kb = r["tile"][e], r["ent"][e]

    @pl.when(j == 0)
    def _init():
        _start_row(st, r, "acc")

    def step(partial):
        k = r["k"][...]
        s, t = _logits(st, r["q"][...], k)
        p = jnp.exp(s - r["lse"][...])
        dp = lax.dot_general(r["do"][...], r["v"][...], _NT, preferred_element_type=jnp.float32)
        ds = p * (dp - r["delta"][...])
        if t is not None:
            ds = ds * (1.0 - t * t)
        if partial:
            allow = _allowed(st, tile, r["bits"][...], qi * st.block_q, kb * st.block_kv, *_predicate_values(r, True),
                             s.shape, 0)
            # Last, and a select: masked and out-of-range entries may be inf or NaN (stale keys, exp of -inf - lse).
            ds = jnp.where(allow != 0, ds, 0.0)
            k = _keep_rows(k, _seen_rows(allow))  # keys no query here sees: ds = 0 must not meet their garbage
        r["acc"][...] += lax.dot_general(ds.astype(k.dtype), k, _NN, preferred_element_type=jnp.float32)

    _dispatch(st, r, j < n, tile, step)

    @pl.when(j == st.q_width - 1)
    def _finish():
        r["dq"][...] = (r["acc"][...] * st.scale).astype(r["dq"].dtype)


# ---------------------------------------------------------------------------------------------------------------
# dK/dV.
#
# Grid (B, Hkv, NK, group * kv_width): kv block kb of kv head hkv walks, for each q head of its group in turn, the
# key-major row of (b, that head, kb); deterministic (one writer per dk/dv block, no atomics). Works transposed,
# keys on sublanes: s^T = k q^T [bkv, bq], so the key-major tiles [bkv, bq] and lse / delta rows [1, bq] apply
# without a transpose. Blocks: k, v [bkv, D]; q, dO [bq, D]; lse, delta [1, bq]; bits [bkv, bq]; ids /
# positions lane-dense [bkv, 128] and [8, bq]; out dk, dv [bkv, D] in the sequence layout (paged K/V: scattered
# to pages outside); fp32 scratch dk, dv [bkv, D]. VMEM (512 / 512 / 128, bf16): k, v, q, dO, dk, dv 1.5 MiB,
# bits 0.5, scratch 0.5, temporaries s, p, dp, ds 4 and the mask algebra's int32 tiles (``_vmem_bytes``). HBM: k, v, dk, dv once per kv block; q, dO, lse, delta once
# per listed entry (per q head of the group).


def _dkv_kernel(st, *refs):
    names = ["q", "k", "v", "bits"] + _optional_names(st) + ["lse", "delta", "do", "dk", "dv"]
    names += (["steps"] if st.count_steps else []) + ["dk_acc", "dv_acc"]
    r = _split(st, refs, names)
    b, hkv, kb, j = (pl.program_id(i) for i in range(4))
    h, jj = _kv_head_step(st, hkv, j)
    e, n = _entry(r["start"], r["count"], _kv_row(st, b, h, kb), jj)
    tile, qb = r["tile"][e], r["ent"][e]

    @pl.when(j == 0)
    def _init():
        _start_row(st, r, "dk_acc", "dv_acc")

    def step(partial):
        q, do = r["q"][...], r["do"][...]
        s, t = _logits(st, r["k"][...], q)
        p = jnp.exp(s - r["lse"][...])
        dp = lax.dot_general(r["v"][...], do, _NT, preferred_element_type=jnp.float32)
        ds = p * (dp - r["delta"][...])
        if t is not None:
            ds = ds * (1.0 - t * t)
        if partial:
            q_ids, kv_ids, q_pos, kv_pos = _predicate_values(r, False)
            allow = _allowed(st, tile, r["bits"][...], qb * st.block_q, kb * st.block_kv, q_ids, kv_ids, q_pos,
                             kv_pos, s.shape, 1)
            # Selects, last: masked and out-of-range entries may be inf or NaN.
            p = jnp.where(allow != 0, p, 0.0)
            ds = jnp.where(allow != 0, ds, 0.0)
            # Queries that see no key here (padding, other documents, past the end): their q / dO rows may hold
            # garbage that p = ds = 0 must not meet in the matmuls below.
            seen = _seen_rows(allow)
            q, do = _keep_rows(q, seen), _keep_rows(do, seen)
        r["dv_acc"][...] += lax.dot_general(p.astype(do.dtype), do, _NN, preferred_element_type=jnp.float32)
        r["dk_acc"][...] += lax.dot_general(ds.astype(q.dtype), q, _NN, preferred_element_type=jnp.float32)

    _dispatch(st, r, jj < n, tile, step)

    @pl.when(j == st.group * st.kv_width - 1)
    def _finish():
        r["dk"][...] = (r["dk_acc"][...] * st.scale).astype(r["dk"].dtype)
        r["dv"][...] = r["dv_acc"][...].astype(r["dv"].dtype)


# ---------------------------------------------------------------------------------------------------------------
# pallas_call wiring.


def _q_major_maps(st):
    """Index maps of the forward / dQ grid (b, h, qi, j, *prefetch)."""

    def entry(b, h, qi, j, start, count):
        return _entry(start, count, _q_row(st, b, h, qi), j)[0]

    def q_map(b, h, qi, j, *pf):
        return b, h, qi, 0

    def kv_map(b, h, qi, j, start, count, ent, tile, fetch, *pt):
        kb = ent[entry(b, h, qi, j, start, count)]
        if st.pages_per_seq:
            return pt[0][b * st.pages_per_seq + kb], lax.div(h, st.group), 0, 0
        return b, lax.div(h, st.group), kb, 0

    def bits_map(b, h, qi, j, start, count, ent, tile, fetch, *pt):
        return fetch[entry(b, h, qi, j, start, count)], 0, 0

    def col_map(b, h, qi, j, *pf):  # [B, Sq, 128] per-query values
        return b, qi, 0

    def row_map(b, h, qi, j, start, count, ent, *rest):  # [B, 8, Skv] per-key values
        return b, 0, ent[entry(b, h, qi, j, start, count)]

    def stat_map(b, h, qi, j, *pf):  # [B, H, Sq, 1] lse / delta
        return b, h, qi, 0

    return q_map, kv_map, bits_map, col_map, row_map, stat_map


def _kv_major_maps(st):
    """Index maps of the dK/dV grid (b, hkv, kb, j, *prefetch)."""

    def entry(b, hkv, kb, j, start, count):
        h, jj = _kv_head_step(st, hkv, j)
        return h, _entry(start, count, _kv_row(st, b, h, kb), jj)[0]

    def q_map(b, hkv, kb, j, start, count, ent, *rest):
        h, e = entry(b, hkv, kb, j, start, count)
        return b, h, ent[e], 0

    def kv_map(b, hkv, kb, j, *pf):
        if st.pages_per_seq:
            return pf[5][b * st.pages_per_seq + kb], hkv, 0, 0
        return b, hkv, kb, 0

    def kv_out_map(b, hkv, kb, j, *pf):
        return b, hkv, kb, 0

    def bits_map(b, hkv, kb, j, start, count, ent, tile, fetch, *pt):
        return fetch[entry(b, hkv, kb, j, start, count)[1]], 0, 0

    def col_map(b, hkv, kb, j, *pf):  # [B, Skv, 128] per-key values
        return b, kb, 0

    def row_map(b, hkv, kb, j, start, count, ent, *rest):  # [B, 8, Sq] per-query values
        return b, 0, ent[entry(b, hkv, kb, j, start, count)[1]]

    def stat_map(b, hkv, kb, j, start, count, ent, *rest):  # [B, H, 1, Sq] lse / delta
        h, e = entry(b, hkv, kb, j, start, count)
        return b, h, 0, ent[e]

    return q_map, kv_map, kv_out_map, bits_map, col_map, row_map, stat_map


_MiB = 1 << 20
# VMEM per TensorCore is 64 MiB on v7x (128 MiB on v5e / v6e); a pass whose estimate exceeds 48 MiB leaves too
# little for the compiler's own spills and is refused. Scoped limits default to 16 / 32 MiB, below what large
# blocks need, so every pallas_call asks for 1.5x its estimate (at least 32 MiB, at most 60 MiB).
_VMEM_REFUSE = 48 * _MiB
_VMEM_FLOOR, _VMEM_CEIL = 32 * _MiB, 60 * _MiB


def _vmem_bytes(st, d, itemsize, kind):
    """An upper estimate of one pass's VMEM: double-buffered blocks, scratch and the [bq, bkv] temporaries.

    A [n, 1] block pads to [n, 128] (lanes) and a [1, n] one to [8, n] (sublanes), 4 bytes each. Temporaries: the
    fp32 logits, probabilities (and dp, ds backward), tanh for softcap, and the int32 mask algebra (the allow
    matrix, two iotas, one compare result live at a time), each [bq, bkv] x 4 bytes."""
    bq, bkv = st.block_q, st.block_kv
    col, row = lambda n: n * 128 * 4, lambda n: 8 * n * 4  # noqa: E731
    n_pred = int(st.has_ids) + int(st.has_pos)
    tile = bq * bkv * 4
    if kind == "fwd":
        ins = (bq + 2 * bkv) * d * itemsize + bq * bkv + n_pred * (col(bq) + row(bkv))
        outs = bq * d * itemsize + col(bq)
        scratch = 2 * col(bq) + bq * d * 4
        temps = (2 + 4) * tile
    elif kind == "dq":
        ins = (2 * bq + 2 * bkv) * d * itemsize + bq * bkv + n_pred * (col(bq) + row(bkv)) + 2 * col(bq)
        outs = bq * d * itemsize
        scratch = bq * d * 4
        temps = (4 + 4) * tile
    else:
        ins = (2 * bq + 2 * bkv) * d * itemsize + bq * bkv + n_pred * (row(bq) + col(bkv)) + 2 * row(bq)
        outs = 2 * bkv * d * itemsize
        scratch = 2 * bkv * d * 4
        temps = (4 + 4) * tile
    temps += tile if st.softcap else 0
    return 2 * (ins + outs) + scratch + temps


def _check_vmem(st, d, dtype):
    for kind, name in (("fwd", "forward"), ("dq", "dQ"), ("dkv", "dK/dV")):
        need = _vmem_bytes(st, d, jnp.dtype(dtype).itemsize, kind)
        if need > _VMEM_REFUSE:
            raise ValueError(f"flash_attention: block_q={st.block_q}, block_kv={st.block_kv} with head dim {d} and "
                             f"{jnp.dtype(dtype).name} need about {need / _MiB:.1f} MiB of VMEM in the {name} pass, "
                             f"over the {_VMEM_REFUSE // _MiB} MiB this kernel allows: use smaller blocks")


def _params(st, d, dtype, kind):
    need = _vmem_bytes(st, d, jnp.dtype(dtype).itemsize, kind)
    limit = int(min(_VMEM_CEIL, max(_VMEM_FLOOR, 1.5 * need)))
    return pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "parallel", "arbitrary"),
                                vmem_limit_bytes=limit)


def _steps_shape(st, rows):
    return jax.ShapeDtypeStruct((st.batch, st.heads if rows == "q" else st.kv_heads,
                                 (st.nq if rows == "q" else st.nk) * _STEP_TILE[0], _STEP_TILE[1]), jnp.int32)


_LANES, _SUBLANES = 128, 8


def _col(x):
    """[B, S] -> [B, S, 128]: per-token values for the sublane axis, lane-dense (Splash's form). A [B, S, 1] array's
    [n, 1] block would pad to [n, 128] in VMEM anyway and copy one lane per row; this one copies whole tiles."""
    return jnp.broadcast_to(x[:, :, None], x.shape + (_LANES,))


def _row(x):
    """[B, S] -> [B, 8, S]: per-token values for the lane axis, one full sublane tile per block."""
    return jnp.broadcast_to(x[:, None, :], (x.shape[0], _SUBLANES, x.shape[1]))


def _predicate_operands(st, ids, pos, q_side_col):
    """ids / positions with the query side as columns and the key side as rows (q_side_col), or the reverse for
    dK/dV."""
    ops = []
    for pair in ((ids,) if st.has_ids else ()) + ((pos,) if st.has_pos else ()):
        qv, kv = pair
        ops += [_col(qv), _row(kv)] if q_side_col else [_row(qv), _col(kv)]
    return ops


_FIELDS = _Q_FIELDS + _KV_FIELDS  # the order of BlockLayout.arrays(), which the kernels' ``arrays`` tuple keeps


def _field(arrays, name):
    return arrays[_FIELDS.index(name)]


def _prefetch(arrays, page_table, q_major):
    """The scalar-prefetch operands: one direction's five lists (start, count, block, tile, fetch), the table."""
    names = _Q_FIELDS[:5] if q_major else _KV_FIELDS[:5]
    return [_field(arrays, n) for n in names] + ([page_table.reshape(-1)] if page_table is not None else [])


def _kv_block(st, d):
    return (None, None, st.block_kv, d)


def _q_major_inputs(st, q, k, v, ids, pos, arrays):
    """The forward's and dQ's shared inputs: q, k, v, the mask bits and the ids / positions, with their specs."""
    d = q.shape[-1]
    q_map, kv_map, bits_map, col_map, row_map, stat_map = _q_major_maps(st)
    in_specs = [pl.BlockSpec((None, None, st.block_q, d), q_map), pl.BlockSpec(_kv_block(st, d), kv_map),
                pl.BlockSpec(_kv_block(st, d), kv_map), pl.BlockSpec((None, st.block_q, st.block_kv), bits_map)]
    operands = [q, k, v, _field(arrays, "q_tiles")]
    for _ in range(int(st.has_ids) + int(st.has_pos)):
        in_specs += [pl.BlockSpec((None, st.block_q, _LANES), col_map),
                     pl.BlockSpec((None, _SUBLANES, st.block_kv), row_map)]
    operands += _predicate_operands(st, ids, pos, True)
    return in_specs, operands, q_map, stat_map


def _forward(st, q, k, v, sinks, ids, pos, page_table, arrays):
    d = q.shape[-1]
    in_specs, operands, q_map, stat_map = _q_major_inputs(st, q, k, v, ids, pos, arrays)
    if st.has_sinks:
        # SMEM: the kernel reads one scalar per head; 8 rows keep the array's shape TPU-legal.
        in_specs.append(pl.BlockSpec((8, st.heads), lambda *_: (0, 0), memory_space=pltpu.SMEM))
        operands.append(jnp.broadcast_to(sinks.astype(jnp.float32)[None], (8, st.heads)))
    out_specs = [pl.BlockSpec((None, None, st.block_q, d), q_map), pl.BlockSpec((None, None, st.block_q, 1), stat_map)]
    out_shape = [jax.ShapeDtypeStruct(q.shape, q.dtype),
                 jax.ShapeDtypeStruct((st.batch, st.heads, st.q_len, 1), jnp.float32)]
    if st.count_steps:
        out_specs.append(pl.BlockSpec((None, None) + _STEP_TILE, q_map))
        out_shape.append(_steps_shape(st, "q"))
    prefetch = _prefetch(arrays, page_table, True)
    outs = pl.pallas_call(
        functools.partial(_fwd_kernel, st),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=len(prefetch), grid=(st.batch, st.heads, st.nq, st.q_width), in_specs=in_specs,
            out_specs=out_specs,
            scratch_shapes=[pltpu.VMEM((st.block_q, 1), jnp.float32), pltpu.VMEM((st.block_q, 1), jnp.float32),
                            pltpu.VMEM((st.block_q, d), jnp.float32)]),
        out_shape=out_shape, compiler_params=_params(st, d, q.dtype, "fwd"), interpret=st.interpret,
        name="seqattn_flash_fwd",
    )(*prefetch, *operands)
    out, lse = outs[0], outs[1][..., 0]
    return (out, lse) + ((outs[2],) if st.count_steps else ())


def _backward_dq(st, q, k, v, ids, pos, page_table, arrays, lse, delta, do):
    d = q.shape[-1]
    in_specs, operands, q_map, stat_map = _q_major_inputs(st, q, k, v, ids, pos, arrays)
    in_specs += [pl.BlockSpec((None, None, st.block_q, 1), stat_map)] * 2
    in_specs.append(pl.BlockSpec((None, None, st.block_q, d), q_map))
    operands += [lse[..., None], delta[..., None], do]
    out_specs = [pl.BlockSpec((None, None, st.block_q, d), q_map)]
    out_shape = [jax.ShapeDtypeStruct(q.shape, q.dtype)]
    if st.count_steps:
        out_specs.append(pl.BlockSpec((None, None) + _STEP_TILE, q_map))
        out_shape.append(_steps_shape(st, "q"))
    prefetch = _prefetch(arrays, page_table, True)
    return pl.pallas_call(
        functools.partial(_dq_kernel, st),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=len(prefetch), grid=(st.batch, st.heads, st.nq, st.q_width), in_specs=in_specs,
            out_specs=out_specs, scratch_shapes=[pltpu.VMEM((st.block_q, d), jnp.float32)]),
        out_shape=out_shape, compiler_params=_params(st, d, q.dtype, "dq"), interpret=st.interpret,
        name="seqattn_flash_dq",
    )(*prefetch, *operands)


def _backward_dkv(st, q, k, v, ids, pos, page_table, arrays, lse, delta, do):
    d = q.shape[-1]
    q_map, kv_map, kv_out_map, bits_map, col_map, row_map, stat_map = _kv_major_maps(st)
    in_specs = [pl.BlockSpec((None, None, st.block_q, d), q_map), pl.BlockSpec(_kv_block(st, d), kv_map),
                pl.BlockSpec(_kv_block(st, d), kv_map), pl.BlockSpec((None, st.block_kv, st.block_q), bits_map)]
    operands = [q, k, v, _field(arrays, "kv_tiles")]
    for _ in range(int(st.has_ids) + int(st.has_pos)):
        in_specs += [pl.BlockSpec((None, _SUBLANES, st.block_q), row_map),
                     pl.BlockSpec((None, st.block_kv, _LANES), col_map)]
    operands += _predicate_operands(st, ids, pos, False)
    in_specs += [pl.BlockSpec((None, None, 1, st.block_q), stat_map)] * 2
    in_specs.append(pl.BlockSpec((None, None, st.block_q, d), q_map))
    operands += [lse[:, :, None, :], delta[:, :, None, :], do]
    # dK/dV come out in the sequence layout [B, Hkv, NK * bkv, D]; paged K/V scatter them to pages afterwards.
    seq_kv = (st.batch, st.kv_heads, st.nk * st.block_kv if st.pages_per_seq else st.kv_len, d)
    out_specs = [pl.BlockSpec((None, None, st.block_kv, d), kv_out_map)] * 2
    out_shape = [jax.ShapeDtypeStruct(seq_kv, k.dtype), jax.ShapeDtypeStruct(seq_kv, v.dtype)]
    if st.count_steps:
        out_specs.append(pl.BlockSpec((None, None) + _STEP_TILE, kv_out_map))
        out_shape.append(_steps_shape(st, "kv"))
    prefetch = _prefetch(arrays, page_table, False)
    return pl.pallas_call(
        functools.partial(_dkv_kernel, st),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=len(prefetch), grid=(st.batch, st.kv_heads, st.nk, st.group * st.kv_width),
            in_specs=in_specs, out_specs=out_specs,
            scratch_shapes=[pltpu.VMEM((st.block_kv, d), jnp.float32), pltpu.VMEM((st.block_kv, d), jnp.float32)]),
        out_shape=out_shape, compiler_params=_params(st, d, q.dtype, "dkv"), interpret=st.interpret,
        name="seqattn_flash_dkv",
    )(*prefetch, *operands)


def _to_pages(st, dseq, page_table, pages_shape):
    """Sums per-sequence dK or dV [B, Hkv, NK * bkv, D] into the pages [P, Hkv, page, D] the table names (a page
    shared by sequences gets their sum; unreferenced pages 0)."""
    b, hkv, _, d = dseq.shape
    per_page = dseq.reshape(b, hkv, st.nk, st.block_kv, d).transpose(0, 2, 1, 3, 4)
    per_page = per_page.reshape(b * st.nk, hkv, st.block_kv, d).astype(jnp.float32)
    # Only the first NK pages of a sequence hold keys the layout can list; the table's others get nothing.
    pages = jnp.zeros(pages_shape, jnp.float32).at[page_table[:, : st.nk].reshape(-1)].add(per_page)
    return pages.astype(dseq.dtype)


# ---------------------------------------------------------------------------------------------------------------
# custom_vjp: gradients for q, k, v and sinks.


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _attend(st, q, k, v, sinks, ids, pos, page_table, arrays):
    return _forward(st, q, k, v, sinks, ids, pos, page_table, arrays)[:2]


def _attend_fwd(st, q, k, v, sinks, ids, pos, page_table, arrays):
    out, lse = _forward(st, q, k, v, sinks, ids, pos, page_table, arrays)[:2]
    return (out, lse), (q, k, v, sinks, ids, pos, page_table, arrays, out, lse)


def _backward_stats(out, lse, do, dlse):
    """The kernels' lse (finite) and delta = rowsum(dO * O) - dlse, fp32 [B, H, Sq]."""
    delta = jnp.sum(do.astype(jnp.float32) * out.astype(jnp.float32), axis=-1)
    if dlse is not None:
        # d lse / d s = p (and d lse / d sink = p_sink): an LSE cotangent folds into delta, ds = p (dp - delta + dlse),
        # so the kernels and the sink gradient stay as they are.
        delta = delta - dlse.astype(jnp.float32)
    # Rows that attend to nothing have lse -inf (no sink): their p is 0, so any finite stand-in keeps 0 * x = 0.
    return jnp.where(jnp.isfinite(lse), lse, 0.0), delta


def _attend_bwd(st, residuals, cotangents):
    q, k, v, sinks, ids, pos, page_table, arrays, out, lse = residuals
    do, dlse = cotangents
    lse_k, delta = _backward_stats(out, lse, do, dlse)
    dq = _backward_dq(st, q, k, v, ids, pos, page_table, arrays, lse_k, delta, do)[0]
    dk, dv = _backward_dkv(st, q, k, v, ids, pos, page_table, arrays, lse_k, delta, do)[:2]
    if st.pages_per_seq:
        dk, dv = _to_pages(st, dk, page_table, k.shape), _to_pages(st, dv, page_table, v.shape)
    dsinks = None
    if st.has_sinks:
        # The sink holds probability exp(sink - lse) and no value: d out / d sink = -p_sink * out per row.
        p_sink = jnp.exp(sinks.astype(jnp.float32)[None, :, None] - lse)
        dsinks = (-jnp.sum(p_sink * delta, axis=(0, 2))).astype(sinks.dtype)
    return dq, dk, dv, dsinks, None, None, None, None


_attend.defvjp(_attend_fwd, _attend_bwd)


# ---------------------------------------------------------------------------------------------------------------
# Public entry point.


def _inner(inner):
    if inner in ("full", "causal"):
        return (inner,)
    if isinstance(inner, tuple) and len(inner) == 3 and inner[0] == "window":
        _, left, right = inner
        if isinstance(left, (int, np.integer)) and isinstance(right, (int, np.integer)) and left >= 0 and right >= 0:
            return ("window", int(left), int(right))
    raise ValueError(f"flash_attention: inner must be 'full', 'causal' or window(left, right) with left, right >= 0, "
                     f"got {inner!r}")


def _pair(x, name, shapes):
    if x is None:
        return None
    if not isinstance(x, (tuple, list)) or len(x) != 2:
        raise ValueError(f"flash_attention: {name} must be a pair (for queries {shapes[0]}, for keys {shapes[1]})")
    a, b = (jnp.asarray(v) for v in x)
    if a.shape != shapes[0] or b.shape != shapes[1] or not jnp.issubdtype(a.dtype, jnp.integer) or \
            not jnp.issubdtype(b.dtype, jnp.integer):
        raise ValueError(f"flash_attention: {name} must be integer arrays of shapes {shapes[0]} and {shapes[1]}, got "
                         f"{a.dtype}{a.shape} and {b.dtype}{b.shape}")
    return a.astype(jnp.int32), b.astype(jnp.int32)


def _check_layout_arrays(layout):
    """The layout arrays' shapes and dtypes against its LayoutShape (static: works on traced arrays too). Their
    values are the builder's promise (``validate`` checks a host layout); a wrong shape would fail deep in Pallas."""
    s = layout.shape
    for prefix, rows, tile_shape in (("q", s.num_q_blocks, (s.block_q, s.block_kv)),
                                     ("kv", s.num_kv_blocks, (s.block_kv, s.block_q))):
        n_rows = s.batch * s.mask_heads * rows
        entries = jnp.shape(getattr(layout, f"{prefix}_tile"))
        other = "kv" if prefix == "q" else "q"
        for field, want in (("start", (n_rows,)), ("count", (n_rows,)), (other, entries), ("tile", entries),
                            ("fetch", entries)):
            a = getattr(layout, f"{prefix}_{field}")
            if jnp.shape(a) != want or len(want) != 1 or want[0] < 1 or not jnp.issubdtype(a.dtype, jnp.integer):
                raise ValueError(f"flash_attention: layout.{prefix}_{field} must be an integer array of shape {want} "
                                 f"(non-empty) for {s}, got {a.dtype}{jnp.shape(a)}")
        tiles = getattr(layout, f"{prefix}_tiles")
        if len(jnp.shape(tiles)) != 3 or jnp.shape(tiles)[1:] != tile_shape or jnp.shape(tiles)[0] < 1:
            raise ValueError(f"flash_attention: layout.{prefix}_tiles must be [>=1, {tile_shape[0]}, {tile_shape[1]}], "
                             f"got {jnp.shape(tiles)}")


def _static(q, k, v, layout, scale, softcap, sinks, segment_ids, positions, inner, page_table, interpret):
    if not isinstance(layout, BlockLayout):
        raise ValueError(f"flash_attention: layout must be a seqattn.pallas.BlockLayout, got {type(layout).__name__}")
    if q.ndim != 4 or k.ndim != 4 or v.shape != k.shape:
        raise ValueError(f"flash_attention: q must be [B, H, Sq, D] and k, v alike [B, Hkv, Skv, D] (paged: "
                         f"[pages, Hkv, page, D]), got q {q.shape}, k {k.shape}, v {v.shape}")
    if not (q.dtype == k.dtype == v.dtype) or q.dtype not in (jnp.float32, jnp.bfloat16):
        raise ValueError(f"flash_attention: q, k, v must share float32 or bfloat16, got {q.dtype}, {k.dtype}, "
                         f"{v.dtype}")
    b_, h, sq, d = q.shape
    hkv = k.shape[1]
    if k.shape[3] != d or not _MIN_D <= d <= _MAX_D:
        raise ValueError(f"flash_attention: q and k must share a head dim in [{_MIN_D}, {_MAX_D}], got q {q.shape}, "
                         f"k {k.shape}")
    if hkv < 1 or h % hkv:
        raise ValueError(f"flash_attention: q heads ({h}, q {q.shape}) must be a multiple of kv heads ({hkv}, k "
                         f"{k.shape})")
    s = layout.shape
    if s.batch != b_ or s.q_len != sq or s.mask_heads not in (1, h):
        raise ValueError(f"flash_attention: layout (batch {s.batch}, mask heads {s.mask_heads}, q_len {s.q_len}) "
                         f"does not fit q {q.shape} (mask heads must be 1 or {h})")
    _check_layout_arrays(layout)
    for name, blk in (("block_q", s.block_q), ("block_kv", s.block_kv)):
        if blk % 128:
            # Both blocks are lane dims somewhere: bits [bq, bkv] forward and [bkv, bq] in dK/dV, lse rows [1, bq].
            raise ValueError(f"flash_attention: the layout's {name} must be a multiple of 128 (TPU lanes), got {blk}")
    pages = 0
    if page_table is None:
        if k.shape[0] != b_ or k.shape[2] != s.kv_len:
            raise ValueError(f"flash_attention: k {k.shape} must be [batch {b_}, Hkv, kv_len {s.kv_len}, D] for the "
                             f"layout")
    else:
        pt = jnp.asarray(page_table)
        if pt.ndim != 2 or pt.shape[0] != b_ or pt.dtype != jnp.int32:
            raise ValueError(f"flash_attention: page_table must be int32 [batch {b_}, pages_per_seq], got "
                             f"{pt.dtype}{pt.shape}")
        if k.shape[2] != s.block_kv or pt.shape[1] * s.block_kv < s.kv_len:
            raise ValueError(f"flash_attention: paged k {k.shape} needs page size == the layout's block_kv "
                             f"({s.block_kv}) and page_table {pt.shape} covering kv_len {s.kv_len}")
        pages = pt.shape[1]
    if sinks is not None and (jnp.shape(sinks) != (h,)):
        raise ValueError(f"flash_attention: sinks must be [{h}] (one logit per q head), got {jnp.shape(sinks)}")
    for name, x in (("scale", scale), ("softcap", softcap)):
        # They specialise the kernels (custom_vjp's static argument): a traced value cannot.
        if x is not None and (isinstance(x, jax.core.Tracer) or not isinstance(x, (int, float, np.integer,
                                                                                    np.floating))):
            raise ValueError(f"flash_attention: {name} must be a static Python float (it specialises the kernels), "
                             f"got {type(x).__name__}")
    if scale is None:
        scale = 1.0 / math.sqrt(d)
    softcap = 0.0 if softcap is None else float(softcap)
    if not math.isfinite(float(scale)) or not math.isfinite(softcap) or softcap < 0:
        raise ValueError(f"flash_attention: scale must be finite and softcap finite and >= 0, got {scale}, {softcap}")
    return _Static(b_, h, hkv, s.mask_heads, sq, s.kv_len, s.block_q, s.block_kv, s.q_width, s.kv_width, pages,
                   float(scale), softcap, _inner(inner), segment_ids is not None, positions is not None,
                   sinks is not None, bool(interpret))


def _prepare(q, k, v, layout, *, scale=None, softcap=None, sinks=None, segment_ids=None, positions=None, inner="full",
             page_table=None, interpret=False, count_steps=False):
    """Checks every argument (ValueError before any work); the static config and the kernels' array operands."""
    st = _static(q, k, v, layout, scale, softcap, sinks, segment_ids, positions, inner, page_table, interpret)
    _check_vmem(st, q.shape[-1], q.dtype)
    ids = _pair(segment_ids, "segment_ids", ((st.batch, st.q_len), (st.batch, st.kv_len)))
    pos = _pair(positions, "positions", ((st.batch, st.q_len), (st.batch, st.kv_len)))
    arrays = tuple(jnp.asarray(a, jnp.int8 if name.endswith("_tiles") else jnp.int32)
                   for name, a in zip(_FIELDS, layout.arrays()))
    sinks = None if sinks is None else jnp.asarray(sinks, jnp.float32)
    pt = None if page_table is None else jnp.asarray(page_table)
    return st._replace(count_steps=bool(count_steps)), (sinks, ids, pos, pt, arrays)


def flash_attention(q, k, v, layout, *, scale=None, softcap=None, sinks=None, segment_ids=None, positions=None,
                    inner="full", page_table=None, return_lse=False, interpret=False):
    """Flash attention over the blocks ``layout`` lists; differentiable (q, k, v, sinks) through jax.custom_vjp.

    q ``[B, H, Sq, D]``; k, v ``[B, Hkv, Skv, D]`` (H a multiple of Hkv; q head h reads kv head h // (H / Hkv),
    nothing is repeated), or paged ``[pages, Hkv, page, D]`` with ``page_table`` int32 ``[B, pages_per_seq]`` and
    page == the layout's block_kv. float32 or bfloat16, D in [64, 256]; fp32 accumulation.
    ``segment_ids`` / ``positions``: pairs (queries ``[B, Sq]``, keys ``[B, Skv]``) int32; with them (or an
    ``inner`` other than "full") a partial tile's mask is its bits AND ids equal AND ``inner(q_pos, kv_pos)``:
    "full", "causal" (q_pos >= kv_pos) or ``window(left, right)``. Segment id 0 is padding and matches nothing.
    Positions default to token indices, i.e. top-left alignment; decode / extend callers (q_len < kv_len, queries
    at the end of the keys) pass positions, e.g. ``(kv_len - q_len + arange(q_len), arange(kv_len))``. Full tiles
    are never masked. ``scale`` / ``softcap``: static Python floats (a traced value raises ValueError).
    ``sinks`` ``[H]``: one logit per q head in every row's denominator.
    Returns out ``[B, H, Sq, D]`` (and lse ``[B, H, Sq]`` fp32, natural log, sink included, with return_lse).
    ``interpret=True`` runs the kernels' program on CPU (tests); False lowers them with Mosaic for TPU.
    """
    st, (sinks, ids, pos, pt, arrays) = _prepare(q, k, v, layout, scale=scale, softcap=softcap, sinks=sinks,
                                                 segment_ids=segment_ids, positions=positions, inner=inner,
                                                 page_table=page_table, interpret=interpret)
    out, lse = _attend(st, q, k, v, sinks, ids, pos, pt, arrays)
    return (out, lse) if return_lse else out


def grid_steps(q, k, v, layout, do=None, **kwargs):
    """Test aid: the grid steps that computed, per pass: ``{"forward", "dq", "dkv"}`` int32 arrays ``[B, H, NQ]``,
    ``[B, H, NQ]`` and ``[B, Hkv, NK]``. Takes flash_attention's keyword arguments (not return_lse); ``do``: the
    output cotangent (ones by default)."""
    st, (sinks, ids, pos, pt, arrays) = _prepare(q, k, v, layout, count_steps=True, **kwargs)
    out, lse, fwd = _forward(st, q, k, v, sinks, ids, pos, pt, arrays)
    do = jnp.ones_like(out) if do is None else jnp.asarray(do, out.dtype)
    lse, delta = _backward_stats(out, lse, do, None)
    dq = _backward_dq(st, q, k, v, ids, pos, pt, arrays, lse, delta, do)[1]
    dkv = _backward_dkv(st, q, k, v, ids, pos, pt, arrays, lse, delta, do)[2]
    return {name: x[:, :, :: _STEP_TILE[0], 0] for name, x in (("forward", fwd), ("dq", dq), ("dkv", dkv))}


# ---------------------------------------------------------------------------------------------------------------
# BSHD and ragged THD entry point.


def _packed_ids(cu, total, name):
    """Segment ids (sequence s -> s + 1, tokens past cu[-1] -> 0: padding) and in-sequence positions of a packed
    stream of ``total`` tokens; works on traced offsets (a compare-and-count, no gather from a vector index)."""
    cu = jnp.asarray(cu)
    if cu.ndim != 1 or cu.shape[0] < 2 or not jnp.issubdtype(cu.dtype, jnp.integer):
        raise ValueError(f"attention: {name} must be integer offsets [sequences + 1] starting at 0, got "
                         f"{cu.dtype}{cu.shape}")
    cu = cu.astype(jnp.int32)
    t = jnp.arange(total, dtype=jnp.int32)
    seq = jnp.sum(t[:, None] >= cu[None, 1:], axis=1, dtype=jnp.int32)  # sequences that end at or before t
    n = cu.shape[0] - 1
    ids = jnp.where((seq < n) & (t >= cu[0]), seq + 1, 0)
    pos = t - cu[jnp.minimum(seq, n - 1)]
    return ids[None], pos[None]


def attention(q, k, v, layout, *, qkv_layout="bshd", cu_seqlens=None, cu_seqlens_kv=None, return_lse=False, **kwargs):
    """flash_attention for the engine's layouts: BSHD ``[B, S, H, D]`` or ragged THD ``[T, H, D]`` + ``cu_seqlens``.

    The kernel's blocks are head-major ([B, H, S, D]); this wrapper transposes q, k, v in and out with one explicit
    ``jnp.transpose`` each (an XLA copy; nothing else is copied). ``qkv_layout="bhsd"`` passes through.

    THD: one packed stream (batch 1) of ``T`` query tokens (keys: ``Tk`` tokens, ``cu_seqlens_kv``, default
    ``cu_seqlens``), sequence s at ``cu_seqlens[s] .. cu_seqlens[s + 1] - 1``, tokens past the last offset are
    padding. The layout must be the packed stream's with each sequence a document (``static_layout(mask, T,
    cu_seqlens=...)``); the kernel's segment-id predicate then keeps sequences apart on partial tiles: ids are
    derived here (sequence s -> s + 1, padding 0) and, for an ``inner`` other than "full", positions restart at 0
    in each sequence (top-left in each, as the engine). Returns out ``[T, H, D]`` and lse ``[H, T]`` (the engine's
    THD shapes); BSHD: out ``[B, S, H, D]``, lse ``[B, H, S]``. Other arguments: flash_attention's.
    """
    if qkv_layout not in ("bshd", "thd", "bhsd"):
        raise ValueError(f"attention: qkv_layout must be 'bshd', 'thd' or 'bhsd', got {qkv_layout!r}")
    if qkv_layout != "thd" and (cu_seqlens is not None or cu_seqlens_kv is not None):
        raise ValueError(f"attention: cu_seqlens / cu_seqlens_kv describe the THD layout, not {qkv_layout!r}")
    if qkv_layout == "bhsd":
        return flash_attention(q, k, v, layout, return_lse=return_lse, **kwargs)
    if qkv_layout == "bshd":
        if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
            raise ValueError(f"attention: BSHD q, k, v must be [B, S, H, D], got {q.shape}, {k.shape}, {v.shape}")
        heads_major = lambda x: jnp.transpose(x, (0, 2, 1, 3))  # noqa: E731
        out, lse = flash_attention(heads_major(q), heads_major(k), heads_major(v), layout, return_lse=True, **kwargs)
        out = heads_major(out)
        return (out, lse) if return_lse else out
    if cu_seqlens is None:
        raise ValueError("attention: qkv_layout='thd' needs cu_seqlens")
    if q.ndim != 3 or k.ndim != 3 or v.ndim != 3:
        raise ValueError(f"attention: THD q, k, v must be [T, H, D], got {q.shape}, {k.shape}, {v.shape}")
    if kwargs.get("segment_ids") is not None or kwargs.get("positions") is not None:
        raise ValueError("attention: THD derives segment_ids and positions from cu_seqlens; do not pass them")
    if kwargs.get("page_table") is not None:
        raise ValueError("attention: paged K/V goes through the BSHD / BHSD layouts, not THD")
    cu_kv = cu_seqlens if cu_seqlens_kv is None else cu_seqlens_kv
    if jnp.shape(cu_seqlens) != jnp.shape(cu_kv):
        raise ValueError(f"attention: cu_seqlens {jnp.shape(cu_seqlens)} and cu_seqlens_kv {jnp.shape(cu_kv)} must "
                         f"name the same number of sequences")
    q_ids, q_pos = _packed_ids(cu_seqlens, q.shape[0], "cu_seqlens")
    kv_ids, kv_pos = _packed_ids(cu_kv, k.shape[0], "cu_seqlens_kv")
    kwargs["segment_ids"] = (q_ids, kv_ids)
    if kwargs.get("inner", "full") != "full":
        kwargs["positions"] = (q_pos, kv_pos)
    batched = lambda x: jnp.transpose(x, (1, 0, 2))[None]  # noqa: E731  [T, H, D] -> [1, H, T, D]
    out, lse = flash_attention(batched(q), batched(k), batched(v), layout, return_lse=True, **kwargs)
    out = jnp.transpose(out[0], (1, 0, 2))
    return (out, lse[0]) if return_lse else out
