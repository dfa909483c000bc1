"""Attention on seqattn's CPU engine (tiled online softmax, Highway SIMD, thread pool).

Layouts (``Hq`` a multiple of ``Hkv``: grouped-query attention):

* BSHD: q ``[B, Sq, Hq, Dk]``, k ``[B, Skv, Hkv, Dk]``, v ``[B, Skv, Hkv, Dv]``;
  out ``[B, Sq, Hq, Dv]``, lse ``[B, Hq, Sq]``.
* THD (packed varlen): q ``[Tq, Hq, Dk]``, k/v ``[Tkv, Hkv, D]`` plus the
  segments, as ``cu_seqlens`` (and ``cu_seqlens_kv``), a ``PackedSegments``
  or ``segment_ids`` ``[T]`` or ``[rows, S]`` (rows packed back to back; in
  each row, a segment is the one run of its nonzero id, as for BSHD ids);
  each segment is an independent sequence seen by the mask in local
  coordinates.
  out ``[Tq, Hq, Dv]``, lse ``[Hq, Tq]``; tokens of no segment get 0 / -inf.

Planning (the mask's block structure and the split of the work over the
threads) depends only on the mask and the shapes: ``plan(q, k, v, mask)``
does it once, and ``attention(q, k, v, plan=p)`` runs it on any inputs of
those shapes. ``attention(q, k, v, mask)`` plans and runs in one call.

BSHD segment ids are an operand of a call, beside q, k and v:
``attention(q, k, v, plan=p, segment_ids=ids)`` runs the plan of the static
mask with this call's ids, which drop the tiles between documents and mask
the tiles that straddle one (no planning per call), wherever that is the
document mask of the ids: masks that depend on kv - q alone (full, causal,
sliding window and and / or / not of them) and self-attention ids. Other
masks (prefix-LM, chunked causal, ...) see a document's local positions, so
such a call plans the document mask of its ids. ``plan(..., segment_ids=ids)``
plans the document mask of fixed ids once.

Storage is float32 or bfloat16 (``ml_dtypes.bfloat16``); accumulation is fp32.
A row whose mask allows no key gets out 0 and lse -inf (where a softmax over
only masked logits would give the mean of v or NaN).
"""

import math

import numpy as np

from . import _core
from ._arrays import as_float, as_int32, check_threads
from ._core import Mask, PackedSegments


def _segments(q_shape, k_shape, segment_ids, kv_segment_ids, cu_seqlens, cu_seqlens_kv, segments, positions):
    """The THD segment table, or None for BSHD."""
    if len(q_shape) == 4:
        if cu_seqlens is not None or cu_seqlens_kv is not None or segments is not None:
            raise ValueError(
                f"attention: cu_seqlens / segments describe the THD layout, but q has the BSHD shape {q_shape}"
            )
        return None
    if len(q_shape) != 3:
        raise ValueError(
            f"attention: q must be [B, S, H, D] (BSHD) or [T, H, D] (THD), got shape {q_shape}"
        )
    given = [x is not None for x in (segment_ids, cu_seqlens, segments)]
    if sum(given) != 1:
        raise ValueError(
            f"attention: q of shape {q_shape} is THD: give exactly one of segment_ids, cu_seqlens or segments"
        )
    if positions is not None:
        raise ValueError("attention: positions apply to the BSHD layout; THD segments start at position 0")
    if segments is not None:
        if not isinstance(segments, PackedSegments):
            raise ValueError(f"attention: segments must be a seqattn.PackedSegments, got {type(segments).__name__}")
        n = segments.num_segments
        parts = [np.ascontiguousarray(a.reshape(-1)[:n]) for a in
                 (segments.q_offsets, segments.q_seqlens, segments.kv_offsets, segments.kv_seqlens)]
        return _core._Segments(*parts)
    if cu_seqlens is not None:
        cq = as_int32(cu_seqlens, "cu_seqlens").reshape(-1)
        ckv = cq if cu_seqlens_kv is None else as_int32(cu_seqlens_kv, "cu_seqlens_kv").reshape(-1)
        if cq.size == 0 or ckv.size != cq.size:
            raise ValueError(
                f"attention: cu_seqlens must hold num_segments + 1 entries for q and kv alike, got shapes "
                f"{cq.shape} and {ckv.shape}"
            )
        return _core._Segments(
            np.ascontiguousarray(cq[:-1]), np.ascontiguousarray(np.diff(cq).astype(np.int32)),
            np.ascontiguousarray(ckv[:-1]), np.ascontiguousarray(np.diff(ckv).astype(np.int32)),
        )
    ids = as_int32(segment_ids, "segment_ids")
    kv_ids = None if kv_segment_ids is None else as_int32(kv_segment_ids, "kv_segment_ids")
    return _core._Segments.from_ids(ids, kv_ids, q_shape[0], k_shape[0])


def _shape(x, who, name):
    """The shape of an array (anything with ``.shape``) or a shape given as a sequence of ints."""
    dims = x.shape if hasattr(x, "shape") else x
    try:
        return tuple(int(d) for d in dims)
    except TypeError:
        raise ValueError(
            f"{who}: {name} must be an array or a shape (a sequence of ints), got {type(x).__name__}"
        ) from None


class Plan:
    """The engine's plan for one call shape: made by :func:`plan`, run by ``attention(..., plan=p)``.

    Holds the mask's block structure for those shapes (and, for THD, the
    segments), split over ``threads`` workers; immutable, so one plan serves
    any number of calls, layers and threads. ``backward`` says whether
    ``attention_backward`` can run it.
    """

    __slots__ = ("_plan", "_holds_ids")

    def __init__(self, core_plan, holds_ids=False):
        self._plan = core_plan
        self._holds_ids = holds_ids

    @property
    def backward(self):
        return self._plan.backward

    @property
    def threads(self):
        return self._plan.threads

    def __repr__(self):
        return repr(self._plan)


def _make_plan(who, q, k, v, mask, segment_ids, positions, kv_segment_ids, kv_positions, cu_seqlens, cu_seqlens_kv,
               segments, backward, threads):
    q_shape, k_shape, v_shape = _shape(q, who, "q"), _shape(k, who, "k"), _shape(v, who, "v")
    if mask is not None and not isinstance(mask, Mask):
        raise ValueError(f"{who}: mask must be a seqattn.Mask or None, got {type(mask).__name__}")
    table = _segments(q_shape, k_shape, segment_ids, kv_segment_ids, cu_seqlens, cu_seqlens_kv, segments, positions)
    if table is None and (segment_ids is not None or positions is not None):
        if segment_ids is None:
            raise ValueError(f"{who}: positions given without segment_ids")
        from .masks import DocumentMask

        mask = DocumentMask(segment_ids, positions, mask, kv_segment_ids=kv_segment_ids, kv_segment_pos=kv_positions)
        holds_ids = True
    else:
        holds_ids = False
    return Plan(_core._plan(q_shape, k_shape, v_shape, mask, table, bool(backward), check_threads(threads)), holds_ids)


def plan(q, k, v, mask=None, *, segment_ids=None, positions=None, kv_segment_ids=None, kv_positions=None,
         cu_seqlens=None, cu_seqlens_kv=None, segments=None, backward=False, threads=None):
    """Plans attention of arrays shaped like ``q``, ``k``, ``v`` under ``mask``; returns a :class:`Plan`.

    ``q``, ``k``, ``v`` are arrays or their shapes; the other arguments mean
    what they mean for :func:`attention`. ``backward=True`` plans the
    backward pass as well. ``threads`` (None or 0: every hardware thread) is
    what the work is split for and what runs it unless a call says otherwise.
    """
    return _make_plan("plan", q, k, v, mask, segment_ids, positions, kv_segment_ids, kv_positions, cu_seqlens,
                      cu_seqlens_kv, segments, backward, threads)


_ID_NAMES = ("segment_ids", "positions", "kv_segment_ids", "kv_positions")


def _planned(who, q, k, v, mask, described, plan, backward, threads):
    """The plan of a call and its BSHD segment-id operand (a dict of int32 arrays, empty without ids).

    The plan given (then nothing else may describe the mask, and ids only if it holds none), or a new one; BSHD
    ids go with the call (see the module's doc), THD ones describe the segments and are planned.
    """
    ids = dict(zip(_ID_NAMES, described[:4]))
    operand = {}
    if np.ndim(q) == 4 and ids["segment_ids"] is not None:
        operand = {name: None if x is None else as_int32(x, name) for name, x in ids.items()}
        described = (None,) * 4 + tuple(described[4:])
    elif np.ndim(q) == 4 and any(x is not None for x in ids.values()):
        raise ValueError(f"{who}: positions given without segment_ids")
    if plan is None:
        return _make_plan(who, q, k, v, mask, *described, backward=backward, threads=threads), operand
    if not isinstance(plan, Plan):
        raise ValueError(f"{who}: plan must be a seqattn.Plan (from seqattn.plan), got {type(plan).__name__}")
    names = _ID_NAMES + ("cu_seqlens", "cu_seqlens_kv", "segments")
    given = [n for n, x in zip(("mask",) + names, (mask,) + tuple(described)) if x is not None]
    if given:
        raise ValueError(f"{who}: the plan already holds the mask and the segments; got {', '.join(given)} as well")
    if operand and plan._holds_ids:
        raise ValueError(f"{who}: the plan already holds segment ids (seqattn.plan(..., segment_ids=)); "
                         "plan the mask alone to give ids per call")
    return plan, operand


def _arrays(who, q, k, v):
    q, kind = as_float(q, "q")
    k, kind_k = as_float(k, "k")
    v, kind_v = as_float(v, "v")
    if not kind == kind_k == kind_v:
        raise ValueError(f"{who}: q, k and v must share a dtype, got {kind}, {kind_k} and {kind_v}")
    return q, k, v, kind


def _scalars(scale, softcap, threads):
    scale = math.nan if scale is None else float(scale)
    softcap = 0.0 if softcap is None else float(softcap)
    return scale, softcap, None if threads is None else check_threads(threads)


def _to_dtype(a, kind):
    return a.view(np.dtype(_bf16())) if kind == "bf16" else a


def _bf16():
    import ml_dtypes

    return ml_dtypes.bfloat16


def attention(q, k, v, mask=None, *, segment_ids=None, positions=None, kv_segment_ids=None, kv_positions=None,
              cu_seqlens=None, cu_seqlens_kv=None, segments=None, scale=None, softcap=None, sinks=None,
              threads=None, plan=None):
    """softmax(mask(softcap(scale * q k^T))) v; returns ``(out, lse)`` (lse: natural log, fp32).

    ``mask``: any seqattn.Mask (default: full). With BSHD, ``segment_ids``
    ``[B, S]`` (0 = padding) and ``positions`` add a document mask: tokens
    attend within their segment, ``mask`` applies at the positions.
    ``scale`` defaults to 1/sqrt(Dk); ``softcap`` 0/None disables;
    ``sinks``: one logit per query head (gpt-oss). ``threads``: None or 0 for
    every hardware thread (with a plan: None runs on the plan's threads).
    ``plan``: a :class:`Plan` from :func:`plan` for these shapes, which then
    holds the mask (and THD segments); BSHD ``segment_ids`` / ``positions``
    may still go with each call (the module's doc says how they refine the
    plan). The GIL is released while the engine runs.
    """
    described = (segment_ids, positions, kv_segment_ids, kv_positions, cu_seqlens, cu_seqlens_kv, segments)
    q, k, v, kind = _arrays("attention", q, k, v)
    p, ids = _planned("attention", q, k, v, mask, described, plan, False, threads)
    scale, softcap, threads = _scalars(scale, softcap, threads)
    if sinks is not None:
        sinks = np.ascontiguousarray(np.asarray(sinks, dtype=np.float32))
    fn = _core.attention_forward_bf16 if kind == "bf16" else _core.attention_forward_f32
    out, lse = fn(q, k, v, p._plan, scale, softcap, sinks, threads, **ids)
    return _to_dtype(out, kind), lse


def attention_backward(q, k, v, out, lse, dout, mask=None, *, segment_ids=None, positions=None,
                       kv_segment_ids=None, kv_positions=None, cu_seqlens=None, cu_seqlens_kv=None, segments=None,
                       scale=None, softcap=None, threads=None, plan=None):
    """Gradients ``(dq, dk, dv)`` of ``attention(...)`` given ``dout``; ``out`` and ``lse`` are what it returned.

    ``plan``: one made with ``seqattn.plan(..., backward=True)``.
    Deterministic: bitwise identical for any thread count.
    """
    described = (segment_ids, positions, kv_segment_ids, kv_positions, cu_seqlens, cu_seqlens_kv, segments)
    q, k, v, kind = _arrays("attention_backward", q, k, v)
    out, kind_o = as_float(out, "out")
    dout, kind_d = as_float(dout, "dout")
    if not kind == kind_o == kind_d:
        raise ValueError(f"attention_backward: q, out and dout must share a dtype, got {kind}, {kind_o}, {kind_d}")
    lse = np.asarray(lse)
    if lse.dtype != np.float32:
        raise ValueError(f"attention_backward: lse must be float32, got {lse.dtype}")
    p, ids = _planned("attention_backward", q, k, v, mask, described, plan, True, threads)
    scale, softcap, threads = _scalars(scale, softcap, threads)
    fn = _core.attention_backward_bf16 if kind == "bf16" else _core.attention_backward_f32
    dq, dk, dv = fn(q, k, v, out, lse, dout, p._plan, scale, softcap, threads, **ids)
    return _to_dtype(dq, kind), _to_dtype(dk, kind), _to_dtype(dv, kind)
