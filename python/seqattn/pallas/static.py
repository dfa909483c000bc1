"""BlockLayouts of static masks, built by the C++ TPU policy (``backends::Tpu`` in ``backends/tpu.hpp``).

``static_layout`` is the host builder for any seqattn mask: it goes through the mask's BlockMask in
O(#blocks) (plus the partial tiles' elements), never through a dense q x kv array, so a 32k causal mask or a
packed batch of documents costs milliseconds. ``layout_from_dense`` stays the O(q_len * kv_len) reference the
tests compare it with. ``page_table`` checks a paged K/V block table and returns the table the kernel reads.
"""

from __future__ import annotations

import operator

import numpy as np

from .. import _core
from .._arrays import as_int32
from .._core import Mask
from .layout import BlockLayout, LayoutShape


def _int(value, name, minimum, who="static_layout"):
    try:
        v = operator.index(value)
    except TypeError:
        raise ValueError(f"{who}: {name} must be an int, got {type(value).__name__}") from None
    if v < minimum:
        raise ValueError(f"{who}: {name} must be >= {minimum}, got {v}")
    return v


def _int_list(values, name):
    if values is None:
        return []
    a = as_int32(values, name)
    if a.ndim != 1:
        raise ValueError(f"static_layout: {name} must be one-dimensional, got shape {a.shape}")
    return [int(v) for v in a]


def static_layout(mask, q_len, kv_len=None, *, batch=None, heads=None, block_q=128, block_kv=128, q_lens=None,
                  kv_lens=None, cu_seqlens=None, cu_seqlens_kv=None):
    """The BlockLayout (NumPy arrays) of ``mask`` for the kernel's arrays of ``q_len`` x ``kv_len`` tokens.

    BSHD (default): ``batch`` rows of padded length ``q_len`` / ``kv_len`` (``kv_len`` defaults to
    ``q_len``); sequence b holds its first ``q_lens[b]`` / ``kv_lens[b]`` tokens (default all; ``kv_lens``
    defaults to ``q_lens``; ``batch`` defaults to ``len(q_lens)`` or 1). THD: ``cu_seqlens`` ([n + 1] offsets,
    starting at 0) packs n sequences into one stream of ``q_len`` tokens (keys: ``cu_seqlens_kv``, default the
    same); the layout has batch 1 and nothing crosses sequences. Either way the mask sees each sequence in its
    own coordinates, as the CPU engine does. ``heads`` defaults to the mask's own (per-head masks) or 1; a
    head-invariant mask's layout stores one head.
    """
    if not isinstance(mask, Mask):
        raise ValueError(f"static_layout: mask must be a seqattn.Mask, got {type(mask).__name__}")
    q_len = _int(q_len, "q_len", 1)
    kv_len = q_len if kv_len is None else _int(kv_len, "kv_len", 1)
    heads = _int(heads if heads is not None else (mask.heads or 1), "heads", 1)
    block_q, block_kv = _int(block_q, "block_q", 1), _int(block_kv, "block_kv", 1)
    q_lens = _int_list(q_lens, "q_lens")
    kv_lens = _int_list(kv_lens, "kv_lens") if kv_lens is not None else list(q_lens)
    cu_q = _int_list(cu_seqlens, "cu_seqlens")
    cu_kv = _int_list(cu_seqlens_kv, "cu_seqlens_kv") if cu_seqlens_kv is not None else list(cu_q)
    if batch is None:
        batch = len(q_lens) if q_lens else 1
    batch = _int(batch, "batch", 1)
    raw = _core._tpu_layout(mask, q_len, kv_len, batch, heads, block_q, block_kv, q_lens, kv_lens, cu_q, cu_kv)
    shape = LayoutShape(batch, int(raw["mask_heads"]), q_len, kv_len, block_q, block_kv, int(raw["q_width"]),
                        int(raw["kv_width"]))
    return BlockLayout(raw["q_start"], raw["q_count"], raw["q_kv"], raw["q_tile"], raw["q_fetch"], raw["q_tiles"],
                       raw["kv_start"], raw["kv_count"], raw["kv_q"], raw["kv_tile"], raw["kv_fetch"],
                       raw["kv_tiles"], shape)


def page_table(block_table, kv_lens, *, num_pages, block_kv, page_size=None):
    """int32 [batch, pages] page table of a paged K/V cache whose pages hold ``block_kv`` keys each.

    ``block_table`` [batch, pages]: sequence b's key j lives in page ``block_table[b, j // page_size]``;
    ``kv_lens`` [batch]. Only each sequence's first ``ceil(kv_lens[b] / page_size)`` entries are read (and must
    name pages in ``[0, num_pages)``); the rest become page 0. The layout for it is the BSHD one with
    ``kv_len = pages * block_kv`` and these ``kv_lens``.
    """
    page_size = block_kv if page_size is None else page_size
    sizes = [_int(v, name, 1, "page_table") for v, name in
             ((num_pages, "num_pages"), (page_size, "page_size"), (block_kv, "block_kv"))]
    return _core._tpu_page_table(np.ascontiguousarray(as_int32(block_table, "block_table")),
                                 np.ascontiguousarray(as_int32(kv_lens, "kv_lens")), *sizes)
