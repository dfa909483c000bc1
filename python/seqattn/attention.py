"""Attention on seqattn's CPU engine (tiled online softmax, Highway SIMD, thread pool).

Layouts (``Hq`` a multiple of ``Hkv``: grouped-query attention):

* BSHD: q ``[B, Sq, Hq, Dk]``, k ``[B, Skv, Hkv, Dk]``, v ``[B, Skv, Hkv, Dv]``;
  out ``[B, Sq, Hq, Dv]``, lse ``[B, Hq, Sq]``.
* THD (packed varlen): q ``[Tq, Hq, Dk]``, k/v ``[Tkv, Hkv, D]`` plus the
  segments, as ``cu_seqlens`` (and ``cu_seqlens_kv``), a ``PackedSegments``
  or 1-D ``segment_ids`` (runs of equal nonzero ids); each segment is an
  independent sequence seen by the mask in local coordinates.
  out ``[Tq, Hq, Dv]``, lse ``[Hq, Tq]``; tokens of no segment get 0 / -inf.

Storage is float32 or bfloat16 (``ml_dtypes.bfloat16``); accumulation is fp32.
A row whose mask allows no key gets out 0 and lse -inf (where a softmax over
only masked logits would give the mean of v or NaN).
"""

import math

import numpy as np

from . import _core
from ._arrays import as_float, as_int32, check_threads
from ._core import Mask, PackedSegments


def _runs(ids):
    """(offsets, lengths) of the runs of equal nonzero ids of a 1-D array."""
    ids = np.asarray(ids)
    if ids.size == 0:
        return np.zeros(0, np.int32), np.zeros(0, np.int32)
    starts = np.flatnonzero(np.concatenate(([True], ids[1:] != ids[:-1])))
    ends = np.concatenate((starts[1:], [ids.size]))
    keep = ids[starts] != 0
    return starts[keep].astype(np.int32), (ends - starts)[keep].astype(np.int32)


def _segments(q, k, segment_ids, kv_segment_ids, cu_seqlens, cu_seqlens_kv, segments, positions):
    """The THD segment table, or None for BSHD."""
    if q.ndim == 4:
        if cu_seqlens is not None or cu_seqlens_kv is not None or segments is not None:
            raise ValueError(
                f"attention: cu_seqlens / segments describe the THD layout, but q has the BSHD shape {q.shape}"
            )
        return None
    if q.ndim != 3:
        raise ValueError(
            f"attention: q must be [B, S, H, D] (BSHD) or [T, H, D] (THD), got shape {q.shape}"
        )
    given = [x is not None for x in (segment_ids, cu_seqlens, segments)]
    if sum(given) != 1:
        raise ValueError(
            f"attention: q of shape {q.shape} is THD: give exactly one of segment_ids, cu_seqlens or segments"
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
    kv_ids = ids if kv_segment_ids is None else as_int32(kv_segment_ids, "kv_segment_ids")
    if ids.ndim != 1 or kv_ids.ndim != 1 or ids.shape[0] != q.shape[0] or kv_ids.shape[0] != k.shape[0]:
        raise ValueError(
            f"attention: THD segment_ids must be 1-D with one id per token, got {ids.shape} for q {q.shape} "
            f"and {kv_ids.shape} for k {k.shape}"
        )
    qo, ql = _runs(ids)
    ko, kl = _runs(kv_ids)
    if not np.array_equal(ids[qo], kv_ids[ko]):
        raise ValueError(
            "attention: q and kv segment_ids must list the same segments in the same order, got "
            f"{ids[qo].tolist()} and {kv_ids[ko].tolist()}"
        )
    return _core._Segments(qo, ql, ko, kl)


def _prepare(q, k, v, mask, segment_ids, positions, kv_segment_ids, kv_positions, cu_seqlens, cu_seqlens_kv,
             segments):
    q, kind = as_float(q, "q")
    k, kind_k = as_float(k, "k")
    v, kind_v = as_float(v, "v")
    if not kind == kind_k == kind_v:
        raise ValueError(f"attention: q, k and v must share a dtype, got {kind}, {kind_k} and {kind_v}")
    if mask is not None and not isinstance(mask, Mask):
        raise ValueError(f"attention: mask must be a seqattn.Mask or None, got {type(mask).__name__}")
    table = _segments(q, k, segment_ids, kv_segment_ids, cu_seqlens, cu_seqlens_kv, segments, positions)
    if table is None and (segment_ids is not None or positions is not None):
        if segment_ids is None:
            raise ValueError("attention: positions given without segment_ids")
        from .masks import DocumentMask

        mask = DocumentMask(segment_ids, positions, mask, kv_segment_ids=kv_segment_ids, kv_segment_pos=kv_positions)
    return q, k, v, kind, mask, table


def _scalars(scale, softcap, threads):
    scale = math.nan if scale is None else float(scale)
    softcap = 0.0 if softcap is None else float(softcap)
    return scale, softcap, check_threads(threads)


def _to_dtype(a, kind):
    return a.view(np.dtype(_bf16())) if kind == "bf16" else a


def _bf16():
    import ml_dtypes

    return ml_dtypes.bfloat16


def attention(q, k, v, mask=None, *, segment_ids=None, positions=None, kv_segment_ids=None, kv_positions=None,
              cu_seqlens=None, cu_seqlens_kv=None, segments=None, scale=None, softcap=None, sinks=None,
              threads=None):
    """softmax(mask(softcap(scale * q k^T))) v; returns ``(out, lse)`` (lse: natural log, fp32).

    ``mask``: any seqattn.Mask (default: full). With BSHD, ``segment_ids``
    ``[B, S]`` (0 = padding) and ``positions`` add a document mask: tokens
    attend within their segment, ``mask`` applies at the positions.
    ``scale`` defaults to 1/sqrt(Dk); ``softcap`` 0/None disables;
    ``sinks``: one logit per query head (gpt-oss). ``threads``: None or 0 for
    every hardware thread. The GIL is released while the engine runs.
    """
    q, k, v, kind, mask, table = _prepare(q, k, v, mask, segment_ids, positions, kv_segment_ids, kv_positions,
                                          cu_seqlens, cu_seqlens_kv, segments)
    scale, softcap, threads = _scalars(scale, softcap, threads)
    if sinks is not None:
        sinks = np.ascontiguousarray(np.asarray(sinks, dtype=np.float32))
    fn = _core.attention_forward_bf16 if kind == "bf16" else _core.attention_forward_f32
    out, lse = fn(q, k, v, mask, table, scale, softcap, sinks, threads)
    return _to_dtype(out, kind), lse


def attention_backward(q, k, v, out, lse, dout, mask=None, *, segment_ids=None, positions=None,
                       kv_segment_ids=None, kv_positions=None, cu_seqlens=None, cu_seqlens_kv=None, segments=None,
                       scale=None, softcap=None, threads=None):
    """Gradients ``(dq, dk, dv)`` of ``attention(...)`` given ``dout``; ``out`` and ``lse`` are what it returned.

    Deterministic: bitwise identical for any thread count.
    """
    q, k, v, kind, mask, table = _prepare(q, k, v, mask, segment_ids, positions, kv_segment_ids, kv_positions,
                                          cu_seqlens, cu_seqlens_kv, segments)
    out, kind_o = as_float(out, "out")
    dout, kind_d = as_float(dout, "dout")
    if not kind == kind_o == kind_d:
        raise ValueError(f"attention_backward: q, out and dout must share a dtype, got {kind}, {kind_o}, {kind_d}")
    lse = np.asarray(lse)
    if lse.dtype != np.float32:
        raise ValueError(f"attention_backward: lse must be float32, got {lse.dtype}")
    scale, softcap, threads = _scalars(scale, softcap, threads)
    fn = _core.attention_backward_bf16 if kind == "bf16" else _core.attention_backward_f32
    dq, dk, dv = fn(q, k, v, out, lse, dout, mask, table, scale, softcap, threads)
    return _to_dtype(dq, kind), _to_dtype(dk, kind), _to_dtype(dv, kind)
