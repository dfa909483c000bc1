"""Masks: one description, every representation.

Every kind is a ``seqattn.Mask``; compose with ``&``, ``|``, ``~``. Each holds
one type-erased C++ description (``seqattn::AnyMask``), so a composed mask
runs in the attention engine as it is, without a dense array.

Representations take the lengths to build for: ``q_len`` (``kv_len`` defaults
to it, ``batch`` to 1) or ``lengths=(q_lens, kv_lens)`` for a ragged batch;
masks built from data (document, top-k, dense, multi-item) default to their
own. ``heads`` defaults to the mask's own (per-head, dense with a head dim) or 1.
"""

import numpy as np

from . import _core
from ._arrays import as_int32
from ._core import (  # noqa: F401  (re-exported)
    Alignment,
    BlockMask,
    CausalMask,
    ChunkedCausalMask,
    FullMask,
    Mask,
    PerHeadMask,
    SlidingWindowMask,
    TileClass,
)


def _opt_int32(x, name):
    return None if x is None else as_int32(x, name)


class DocumentMask(_core.DocumentMask):
    """Attention within segments: ``segment_ids`` (*E, B, T), 0 = padding.

    ``inner`` (any mask, default full) applies in segment-local coordinates:
    token t of a segment is at ``segment_pos[t]`` when positions are given,
    else at its offset in the segment. ``kv_segment_ids`` / ``kv_segment_pos``
    give the key side when it differs (cross attention, KV caches).
    """

    def __init__(self, segment_ids, segment_pos=None, inner=None, *, kv_segment_ids=None, kv_segment_pos=None):
        super().__init__(
            as_int32(segment_ids, "segment_ids"),
            _opt_int32(segment_pos, "segment_pos"),
            inner,
            kv_segment_ids=_opt_int32(kv_segment_ids, "kv_segment_ids"),
            kv_segment_pos=_opt_int32(kv_segment_pos, "kv_segment_pos"),
        )


class TopKMask(_core.TopKMask):
    """Each query row attends to its own keys: ``indices`` (*E, B, t, k), -1 = padding, among ``kv_len`` keys."""

    def __init__(self, indices, kv_len):
        super().__init__(as_int32(indices, "indices"), int(kv_len))


class DenseMask(_core.DenseMask):
    """An explicit array, nonzero = allowed: (Q, KV), (B, Q, KV) or (*E, B, H, Q, KV). Copied."""

    def __init__(self, values):
        a = np.asarray(values)
        if a.dtype != np.uint8:
            a = (a != 0).view(np.uint8)
        super().__init__(a)


class MultiItemMask(_core.MultiItemMask):
    """Multi-item scoring: each sequence is ``query ‖ d ‖ item_1 ‖ d ‖ … ‖ d`` with delimiter ``d``."""

    def __init__(self, tokens, delimiter):
        if isinstance(tokens, np.ndarray) and tokens.ndim == 1:
            tokens = [tokens]
        super().__init__([as_int32(t, f"tokens[{i}]") for i, t in enumerate(tokens)], int(delimiter))


class PrefixLMMask(_core.PrefixLMMask):
    """Bidirectional over the first ``prefix`` keys, causal after; one int or one length per sequence.

    Read-only properties: ``prefix`` (the int, or None when given one length per sequence),
    ``prefix_lengths`` (the lengths as a list, or None when given one int) and ``alignment``.
    """

    def __init__(self, prefix, alignment="top_left"):
        if not isinstance(prefix, (int, np.integer)):
            prefix = as_int32(prefix, "prefix")
        else:
            prefix = int(prefix)
        super().__init__(prefix, alignment)


def _check(mask):
    if not isinstance(mask, Mask):
        raise ValueError(f"mask: expected a seqattn.Mask, got {type(mask).__name__}")
    return mask


def to_dense(mask, q_len=None, kv_len=None, **kw):
    """bool [batch, heads, max q_len, max kv_len]."""
    return _check(mask).to_dense(q_len, kv_len, **kw)


def to_additive(mask, q_len=None, kv_len=None, **kw):
    """float32 [batch, heads, max q_len, max kv_len]: 0 allowed, mask_value (default -0.7 * float max) not."""
    return _check(mask).to_additive(q_len, kv_len, **kw)


def pack_bits(mask, q_len=None, kv_len=None, **kw):
    """FlashInfer's packed custom mask: (bits uint8, indptr int64)."""
    return _check(mask).pack_bits(q_len, kv_len, **kw)


def block_mask(mask, q_len=None, kv_len=None, **kw):
    """The BlockMask (tiles of ``block_size=(block_q, block_kv)``, default 128 x 128)."""
    return _check(mask).block_mask(q_len, kv_len, **kw)


def to_ascii(mask, q_len=None, kv_len=None, **kw):
    if isinstance(mask, BlockMask):
        return mask.to_ascii(**kw)
    return _check(mask).to_ascii(q_len, kv_len, **kw)


def to_svg(mask, q_len=None, kv_len=None, **kw):
    if isinstance(mask, BlockMask):
        return mask.to_svg(**kw)
    return _check(mask).to_svg(q_len, kv_len, **kw)
