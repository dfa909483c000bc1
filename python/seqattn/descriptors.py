"""TransformerEngine's sequence descriptors on NumPy / JAX arrays.

``SequenceDescriptor`` mirrors ``transformer_engine.jax.attention.SequenceDescriptor``:
the same constructors and ``get_seqlens_and_offsets(attn_mask_type, qkv_layout,
window_size, max_segments_per_seq)``, with TE's reference (mask-defined)
semantics, and validation instead of silently wrong results (see
docs/semantics/sequence-descriptors.md). Every field is a ``(q, kv)`` pair; a
single array is used for both. Segment ids may carry extra leading (vmapped)
dims, broadcast against the positions.
"""

import enum

from . import _core
from ._arrays import as_int32
from ._core import AttnMaskType, PackedSegments, SeqLayout, SeqlensAndOffsets


class QKVFormat(enum.IntEnum):
    """TE's QKVFormat (SBHD is not supported by TE's fused attention either)."""

    SBHD = 0
    BSHD = 1
    THD = 2


class QKVLayout(enum.IntEnum):
    """TE-JAX's QKVLayout with the NVTE codes."""

    BS3HD = 5
    BSHD_BS2HD = 7
    BSHD_BSHD_BSHD = 9
    T3HD = 10
    THD_T2HD = 12
    THD_THD_THD = 14

    def is_thd(self):
        return self in (QKVLayout.T3HD, QKVLayout.THD_T2HD, QKVLayout.THD_THD_THD)

    def is_qkvpacked(self):
        return self in (QKVLayout.BS3HD, QKVLayout.T3HD)

    def is_kvpacked(self):
        return self in (QKVLayout.BSHD_BS2HD, QKVLayout.THD_T2HD)

    def is_separate(self):
        return self in (QKVLayout.BSHD_BSHD_BSHD, QKVLayout.THD_THD_THD)

    def get_qkv_format(self):
        return QKVFormat.THD if self.is_thd() else QKVFormat.BSHD


def _mask_type(attn_mask_type):
    if isinstance(attn_mask_type, AttnMaskType):
        return attn_mask_type
    if isinstance(attn_mask_type, str):
        return _core.parse_attn_mask_type(attn_mask_type)
    # TE's own enum (or anything with TE's names): AttnMaskType.PADDING_CAUSAL_MASK -> padding_causal.
    name = getattr(attn_mask_type, "name", None)
    if isinstance(name, str):
        return _core.parse_attn_mask_type(name.lower().removesuffix("_mask"))
    raise ValueError(
        f"attn_mask_type: expected seqattn.AttnMaskType, a TE mask type or its name, got {attn_mask_type!r}"
    )


def _layout(qkv_layout):
    if isinstance(qkv_layout, SeqLayout):
        return qkv_layout
    if isinstance(qkv_layout, QKVLayout):
        return SeqLayout.thd if qkv_layout.is_thd() else SeqLayout.bshd
    if isinstance(qkv_layout, QKVFormat):
        if qkv_layout == QKVFormat.SBHD:
            raise ValueError("qkv_layout: SBHD is not supported (TE's fused attention rejects it too)")
        return SeqLayout.thd if qkv_layout == QKVFormat.THD else SeqLayout.bshd
    if isinstance(qkv_layout, str):
        s = qkv_layout.lower()
        if s.startswith("thd") or s.startswith("t3hd"):
            return SeqLayout.thd
        if s.startswith("bshd") or s.startswith("bs3hd"):
            return SeqLayout.bshd
    is_thd = getattr(qkv_layout, "is_thd", None)
    if callable(is_thd):  # TE's QKVLayout
        return SeqLayout.thd if is_thd() else SeqLayout.bshd
    raise ValueError(f"qkv_layout: expected seqattn.SeqLayout, QKVLayout, QKVFormat or a name, got {qkv_layout!r}")


def _window(window_size):
    if window_size is None:
        return None
    left, right = window_size
    return int(left), int(right)


def _pair(x, name):
    if isinstance(x, tuple):
        if len(x) != 2:
            raise ValueError(f"{name}: a tuple must have exactly 2 elements (q, kv), got {len(x)}")
        return as_int32(x[0], "q_" + name), as_int32(x[1], "kv_" + name)
    a = as_int32(x, name)
    return a, None


class SequenceDescriptor:
    """TE's SequenceDescriptor (owning copies of its inputs)."""

    def __init__(self, core):
        self._core = core

    @classmethod
    def from_seqlens(cls, seqlens):
        q, kv = _pair(seqlens, "seqlens")
        return cls(_core.SequenceDescriptor.from_seqlens(q, kv))

    @classmethod
    def from_seqlens_and_offsets(cls, seqlens, seq_offsets):
        ql, kvl = _pair(seqlens, "seqlens")
        qo, kvo = _pair(seq_offsets, "seq_offsets")
        return cls(_core.SequenceDescriptor.from_seqlens_and_offsets(ql, qo, kvl, kvo))

    @classmethod
    def from_segment_ids_and_pos(cls, segment_ids, segment_pos=None):
        if segment_pos is None:
            # As TE since PR #2823: no automatic positions.
            raise ValueError(
                "from_segment_ids_and_pos: segment_pos is required (automatic generation was removed in TE; "
                "positions count 0, 1, ... within each segment)"
            )
        qi, kvi = _pair(segment_ids, "segment_ids")
        qp, kvp = _pair(segment_pos, "segment_pos")
        if (kvi is None) != (kvp is None):
            kvi = qi if kvi is None else kvi
            kvp = qp if kvp is None else kvp
        return cls(_core.SequenceDescriptor.from_segment_ids_and_pos(qi, qp, kvi, kvp))

    def get_seqlens_and_offsets(self, attn_mask_type, qkv_layout, window_size=None, max_segments_per_seq=1):
        """Per-row seqlens and offsets; unpacks as (q_seqlens, kv_seqlens, q_offsets, kv_offsets)."""
        return self._core.get_seqlens_and_offsets(
            _mask_type(attn_mask_type), _layout(qkv_layout), _window(window_size), int(max_segments_per_seq)
        )


def get_seqlens_and_offsets(
    segment_ids, segment_pos, attn_mask_type, qkv_layout, window_size=None, max_segments_per_seq=1
):
    """``SequenceDescriptor.from_segment_ids_and_pos(...).get_seqlens_and_offsets(...)`` in one call."""
    return SequenceDescriptor.from_segment_ids_and_pos(segment_ids, segment_pos).get_seqlens_and_offsets(
        attn_mask_type, qkv_layout, window_size, max_segments_per_seq
    )


def pack_segments(seqlens_and_offsets, seq_len=None):
    """Global offsets, seqlens and cu_seqlens on the flat (rows * S) token axis.

    ``seq_len`` (tokens per row S, an int or a (q, kv) pair) defaults to the
    descriptor's own, known when it was derived from segment ids.
    """
    if not isinstance(seqlens_and_offsets, SeqlensAndOffsets):
        raise ValueError(
            "pack_segments: expected the result of get_seqlens_and_offsets, got "
            f"{type(seqlens_and_offsets).__name__}"
        )
    if seq_len is None:
        q, kv = -1, -1
    elif isinstance(seq_len, tuple):
        q, kv = (int(s) for s in seq_len)
    else:
        q = kv = int(seq_len)
    return _core.pack_segments(seqlens_and_offsets, q, kv)


def _unpack(self):
    return iter((self.q_seqlens, self.kv_seqlens, self.q_offsets, self.kv_offsets))


# TE returns a 4-tuple; ours unpacks the same way.
SeqlensAndOffsets.__iter__ = _unpack
SeqlensAndOffsets.__len__ = lambda self: 4
SeqlensAndOffsets.__getitem__ = lambda self, i: tuple(_unpack(self))[i]

__all__ = [
    "AttnMaskType",
    "PackedSegments",
    "QKVFormat",
    "QKVLayout",
    "SeqLayout",
    "SeqlensAndOffsets",
    "SequenceDescriptor",
    "get_seqlens_and_offsets",
    "pack_segments",
]
