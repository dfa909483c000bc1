"""Splash attention (JAX, TPU) metadata from seqattn masks.

``mask_info`` computes what ``jax.experimental.pallas.ops.tpu.splash_attention``'s
``_process_mask`` computes (``data_next``, ``mask_next``, ``block_mask``,
``partial_mask_blocks``, ``q_sequence``, Splash's int8/int16/int32 choices,
head and q-sequence sharding, the forward and the dK/dV pass), in C++ from the
mask's structure instead of a Python loop over every tile, for any seqattn
mask: Splash's own kinds and the ones it lacks (document + window, multi-item,
prefix-LM, top-k, combinations). The rules: docs/semantics/splash-and-flex.md.

``make_splash_kernel`` builds a ``SplashAttentionKernel`` from those MaskInfos,
as ``make_splash_mha`` / ``make_splash_mqa`` would from a Splash mask. The
kernel itself runs on TPUs (or in Pallas interpret mode).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from . import _core
from ._core import BlockMask, Mask


class NumpyMaskInfo(NamedTuple):
    """Splash's MaskInfo fields as NumPy arrays (used when JAX is not installed)."""

    data_next: np.ndarray | None
    mask_next: np.ndarray | None
    block_mask: np.ndarray | None
    partial_mask_blocks: np.ndarray | None
    q_sequence: np.ndarray | None
    is_dynamic_mask: bool | None = None


def _mask_info_class():
    try:
        from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask_info as mi
    except Exception:  # JAX missing, or a version without Splash: the same fields in NumPy
        return NumpyMaskInfo
    return mi.MaskInfo


def _lengths_and_heads(mask, q_len, kv_len, heads):
    own = mask.lengths
    if own is not None:
        qs, kvs = own
        if len(qs) != 1:
            raise ValueError(
                f"mask: Splash has one mask for the whole batch, but {mask!r} holds {len(qs)} sequences; "
                "build a BlockMask and pass batch_index"
            )
        q_len = qs[0] if q_len is None else q_len
        kv_len = kvs[0] if kv_len is None else kv_len
    if q_len is None:
        raise ValueError(f"mask_info: q_len is required for {mask!r} (it holds no lengths of its own)")
    kv_len = q_len if kv_len is None else kv_len
    if heads is None:
        heads = mask.heads if mask.heads is not None else 1
    return int(q_len), int(kv_len), int(heads)


def _raw(mask, block_q, block_kv, q_len, kv_len, heads, is_dkv, head_shards, q_seq_shards, downcast_smem_data,
         shrink_grid, batch_index):
    if isinstance(mask, BlockMask):
        if heads is None:
            heads = mask.heads
        if tuple(mask.block_size) != (block_q, block_kv):
            raise ValueError(
                f"mask_info: the BlockMask has block_size {tuple(mask.block_size)} but block_q, block_kv = "
                f"({block_q}, {block_kv})"
            )
        return _core._splash_mask_info_from_block_mask(
            mask, int(heads), int(batch_index), bool(is_dkv), int(head_shards), int(q_seq_shards),
            bool(downcast_smem_data), bool(shrink_grid))
    if not isinstance(mask, Mask):
        raise ValueError(f"mask: expected a seqattn.Mask or seqattn.BlockMask, got {type(mask).__name__}")
    q_len, kv_len, heads = _lengths_and_heads(mask, q_len, kv_len, heads)
    return _core._splash_mask_info(mask, q_len, kv_len, heads, int(block_q), int(block_kv), bool(is_dkv),
                                   int(head_shards), int(q_seq_shards), bool(downcast_smem_data), bool(shrink_grid))


def _splash_mask_function(desc, q_len, kv_len):
    """The mask_function of the Splash mask that computes this mask in the kernel."""
    if desc is None:
        return None
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as ml

    shape = (q_len, kv_len)
    if desc["kind"] == "causal":
        return ml.CausalMask(shape, offset=desc["offset"]).mask_function
    if desc["kind"] == "local":
        return ml.LocalMask(shape, (desc["left"], desc["right"]), offset=desc["offset"]).mask_function
    return ml.ChunkedCausalMask(shape, chunk_size=desc["chunk"]).mask_function


def mask_info(mask, block_q, block_kv, *, q_len=None, kv_len=None, heads=None, is_dkv=False, head_shards=1,
              q_seq_shards=1, downcast_smem_data=True, shrink_grid=True, batch_index=0):
    """Splash's MaskInfo for ``mask`` with blocks of (block_q, block_kv).

    ``mask``: a ``seqattn.Mask`` (``q_len`` / ``kv_len`` default to the mask's own lengths; ``heads`` to the
    mask's own head count or 1) or a ``seqattn.BlockMask`` (its block size must be (block_q, block_kv);
    ``batch_index`` picks the sequence). Returns JAX's ``MaskInfo`` (NumPy arrays, as ``_process_mask``
    returns them) or, without JAX, a ``NumpyMaskInfo`` with the same fields. Lengths must be multiples of
    the block sizes (Splash has no short tiles).
    """
    d = _raw(mask, block_q, block_kv, q_len, kv_len, heads, is_dkv, head_shards, q_seq_shards, downcast_smem_data,
             shrink_grid, batch_index)
    cls = _mask_info_class()
    return cls(data_next=d["data_next"], mask_next=d["mask_next"], block_mask=d["block_mask"],
               partial_mask_blocks=d["partial_mask_blocks"], q_sequence=d["q_sequence"])


def process_mask(mask, block_shape, is_dkv=False, *, q_len=None, kv_len=None, heads=None, downcast_smem_data=True,
                 head_shards=1, q_seq_shards=1, shrink_grid=True, batch_index=0):
    """The pair JAX's ``_process_mask`` returns: (MaskInfo, mask_function or None).

    mask_function is the Splash mask's own callable when Splash computes this mask in the kernel
    (causal, local window, top-left chunked causal); it needs JAX.
    """
    block_q, block_kv = block_shape
    d = _raw(mask, block_q, block_kv, q_len, kv_len, heads, is_dkv, head_shards, q_seq_shards, downcast_smem_data,
             shrink_grid, batch_index)
    cls = _mask_info_class()
    info = cls(data_next=d["data_next"], mask_next=d["mask_next"], block_mask=d["block_mask"],
               partial_mask_blocks=d["partial_mask_blocks"], q_sequence=d["q_sequence"])
    fn = None
    if d["mask_function"] is not None:
        ql = d["q_sequence"].shape[0]
        if isinstance(mask, BlockMask):
            kl = mask.lengths[1][batch_index]
        else:
            kl = _lengths_and_heads(mask, q_len, kv_len, heads)[1]
        fn = _splash_mask_function(d["mask_function"], ql, kl)
    return info, fn


def make_splash_kernel(mask, block_sizes=None, *, q_len=None, kv_len=None, heads=None, is_mqa=False,
                       save_residuals=False, mask_value=None, attn_logits_soft_cap=None, downcast_smem_data=True,
                       head_shards=1, q_seq_shards=1, residual_checkpoint_name=None, interpret=False):
    """A ``SplashAttentionKernel`` for ``mask`` whose MaskInfos come from seqattn.

    Mirrors ``make_splash_mha`` (``is_mqa=False``) / ``make_splash_mqa``: the forward MaskInfo, the dQ one
    (unless the fused backward kernel is used) and the dK/dV one (grid shrinking off with the fused
    backward kernel), each turned into jax arrays. Running the kernel needs a TPU (or ``interpret=True``).
    """
    import jax
    import jax.numpy as jnp
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk

    if block_sizes is None:
        block_sizes = sk.BlockSizes.get_default()
    if mask_value is None:
        mask_value = sk.DEFAULT_MASK_VALUE
    common = dict(q_len=q_len, kv_len=kv_len, heads=heads, downcast_smem_data=downcast_smem_data,
                  head_shards=head_shards, q_seq_shards=q_seq_shards)
    fwd, fn = process_mask(mask, (block_sizes.block_q, block_sizes.block_kv), **common)
    to_jax = lambda info: jax.tree_util.tree_map(jnp.array, info)  # noqa: E731
    fwd = to_jax(fwd)
    dq = dkv = None
    if block_sizes.has_backward_blocks:
        if not block_sizes.use_fused_bwd_kernel:
            dq, _ = process_mask(mask, (block_sizes.block_q_dq, block_sizes.block_kv_dq), **common)
            dq = to_jax(dq)
        dkv, _ = process_mask(mask, (block_sizes.block_q_dkv, block_sizes.block_kv_dkv), is_dkv=True,
                              shrink_grid=not block_sizes.use_fused_bwd_kernel, **common)
        dkv = to_jax(dkv)
    return sk.SplashAttentionKernel(
        fwd, dq, dkv, block_sizes=block_sizes, is_mqa=is_mqa, save_residuals=save_residuals, mask_value=mask_value,
        attn_logits_soft_cap=attn_logits_soft_cap, residual_checkpoint_name=residual_checkpoint_name,
        mask_function=fn, interpret=interpret)


# --- tokamax "Splash 2.0" -------------------------------------------------------------------------------------


class TokamaxMaskInfo(NamedTuple):
    """tokamax's MaskInfo fields (``tokamax/_src/ops/experimental/tpu/splash_attention``) as NumPy arrays."""

    mask_next: np.ndarray | None
    active_rows: np.ndarray | None
    active_cols: np.ndarray | None
    block_mask: np.ndarray | None
    num_active_blocks: np.ndarray | None
    partial_mask_blocks: np.ndarray | None
    q_sequence: np.ndarray | None


def _smallest_int(a):
    """tokamax's downcast of scalar-memory arrays: the narrowest of int8 / int16 / int32 holding the values."""
    a = np.asarray(a, np.int32)
    top = int(a.max()) if a.size else 0
    return a.astype(np.int8 if top <= np.iinfo(np.int8).max else np.int16 if top <= np.iinfo(np.int16).max
                    else np.int32)


def _next_partial(partial_ids, visited):
    """Per visited step (in order), the partial-block id of the first partial step at or after it, wrapping."""
    n = partial_ids.size
    step = np.where(partial_ids >= 0, np.arange(n), n)
    nxt = np.minimum.accumulate(step[::-1])[::-1]
    first = nxt[0] if n else n
    nxt = np.where(nxt == n, first, nxt)
    return partial_ids[np.minimum(nxt, n - 1)][visited]


def tokamax_mask_info(mask, block_shape, is_dkv=False, *, q_len=None, kv_len=None, downcast_smem_data=True,
                      partial_mask_blocks_dtype=np.int8, return_dynamic_grid=True):
    """tokamax's MaskInfo and mask_function for ``mask``, as its ``_process_mask`` returns them.

    tokamax ("Splash 2.0", what MaxText runs with ``use_tokamax_splash``) keeps one mask for all heads and lists
    the active blocks instead of a dense grid: ``active_rows`` / ``active_cols`` of each visited block in
    visiting order (q-block-major; kv-block-major for the dK/dV pass, which also visits column 0 of a kv-block
    no query sees, so its gradient is written), their ``block_mask`` (1 partial, 2 full), ``mask_next`` (the
    partial block of the first partial step at or after each step, wrapping), ``num_active_blocks``, and the
    deduplicated ``partial_mask_blocks`` numbered in order of first appearance (transposed for dK/dV).
    ``return_dynamic_grid=False`` gives the dense grid instead (no active lists; tokamax's dK/dV default). A mask
    that is full everywhere gives all None, and a mask Splash computes in the kernel (causal, local window,
    chunked causal) gives its ``q_sequence`` and mask_function with no partial blocks -- as in tokamax.

    ``mask``: a seqattn.Mask with one mask for every head (or a one-sequence BlockMask of one head); tiles come
    from the C++ block mask in O(#tiles), not from a loop over blocks. Sequence sharding is not supported
    (tokamax's ``q_seq_shards`` = ``kv_seq_shards`` = 1).
    """
    heads = mask.heads if isinstance(mask, BlockMask) else (mask.heads if mask.heads is not None else 1)
    if heads != 1:
        raise ValueError(f"tokamax_mask_info: tokamax has one mask for every head, but {mask!r} has {heads} heads")
    block_q, block_kv = block_shape
    d = _raw(mask, block_q, block_kv, q_len, kv_len, 1, False, 1, 1, False, False, 0)
    classes = np.asarray(d["block_mask"], np.int32)[0]  # [nq, nkv]
    own = np.asarray(d["mask_next"], np.int32)[0] if d["mask_next"] is not None else np.zeros_like(classes)
    q_sequence = d["q_sequence"]
    fn = None
    if d["mask_function"] is not None:
        ql = np.shape(q_sequence)[0]
        kl = mask.lengths[1][0] if isinstance(mask, BlockMask) else _lengths_and_heads(mask, q_len, kv_len, 1)[1]
        fn = _splash_mask_function(d["mask_function"], ql, kl)
    if np.all(classes == 2):
        return TokamaxMaskInfo(None, None, None, None, None, None, q_sequence), None

    # Partial blocks renumbered by first appearance in q-block-major order, as tokamax's deduplication numbers
    # them (seqattn's C++ deduplicates the same tiles).
    partial = classes == 1
    blocks = None
    partial_ids = np.full(classes.shape, -1, np.int32)
    if partial.any() and d["partial_mask_blocks"] is not None:
        seen = own[partial]
        order, first = np.unique(seen, return_index=True)
        renumber = np.empty(int(order.max()) + 1, np.int32)
        renumber[order[np.argsort(first)]] = np.arange(len(order), dtype=np.int32)
        partial_ids[partial] = renumber[seen]
        stored = np.asarray(d["partial_mask_blocks"])[order[np.argsort(first)]]
        blocks = stored.astype(partial_mask_blocks_dtype)
        if is_dkv:
            blocks = np.swapaxes(blocks, -1, -2)

    grid_classes, grid_ids = (classes.T, partial_ids.T) if is_dkv else (classes, partial_ids)
    if return_dynamic_grid:
        visited = grid_classes > 0
        if is_dkv:  # a kv-block no query sees is still visited once, at column 0, to write its zero gradient
            visited[:, 0] |= ~visited.any(axis=1)
        rows, cols = np.nonzero(visited)
        active_rows, active_cols = rows.astype(np.int32), cols.astype(np.int32)
        block_mask = grid_classes[visited]
        num_active = np.array([rows.size], np.int32)
    else:
        visited = np.ones(grid_classes.shape, bool)
        active_rows = active_cols = num_active = None
        block_mask = grid_classes.ravel()
    mask_next = _next_partial(grid_ids.ravel(), visited.ravel()) if blocks is not None else None
    block_mask = block_mask.astype(np.int32)
    if downcast_smem_data:
        block_mask = _smallest_int(block_mask)
        mask_next = None if mask_next is None else _smallest_int(mask_next)
        if return_dynamic_grid:
            active_rows, active_cols = _smallest_int(active_rows), _smallest_int(active_cols)
    if fn is not None:
        mask_next = blocks = None
    return TokamaxMaskInfo(mask_next, active_rows, active_cols, block_mask, num_active, blocks, q_sequence), fn


def make_tokamax_kernel(mask, config=None, *, q_len=None, kv_len=None, is_mqa=False, save_residuals=False,
                        mask_value=None, downcast_smem_data=True, partial_mask_blocks_dtype=np.int8):
    """tokamax's ``SplashAttentionKernel`` for ``mask`` with MaskInfos from ``tokamax_mask_info``.

    Mirrors tokamax's ``make_splash_mha`` / ``make_splash_mqa`` (``is_mqa``) with one q-sequence shard: the
    forward MaskInfo with the active-block grid, the dK/dV one with the dense grid unless ``config``'s
    ``dq_reduction_steps`` is 3. Needs tokamax; runs on TPUs or with ``config.interpret``.
    """
    import jax
    import jax.numpy as jnp
    from tokamax._src.ops.experimental.tpu.splash_attention import base
    from tokamax._src.ops.experimental.tpu.splash_attention import splash_attention_kernel as tk
    from tokamax._src.ops.experimental.tpu.splash_attention import splash_attention_mask_info as tmi

    if config is None:
        config = tk.SplashConfig.get_default()
    if mask_value is None:
        mask_value = base.DEFAULT_MASK_VALUE
    common = dict(q_len=q_len, kv_len=kv_len, downcast_smem_data=downcast_smem_data,
                  partial_mask_blocks_dtype=partial_mask_blocks_dtype)
    as_jax = lambda info: jax.tree_util.tree_map(jnp.array, tmi.MaskInfo(*info))  # noqa: E731
    fwd, fn = tokamax_mask_info(mask, (config.block_q, config.block_kv), **common)
    sparsity = lambda info: 1.0 if info.block_mask is None else float(np.mean(info.block_mask != 0))  # noqa: E731
    fwd_sparsity, dkv_sparsity, dkv = sparsity(fwd), 1.0, None
    if config.has_backward_blocks:
        dkv, _ = tokamax_mask_info(mask, (config.block_q_dkv, config.block_kv_dkv), True,
                                   return_dynamic_grid=config.dq_reduction_steps == 3, **common)
        dkv_sparsity = sparsity(dkv)
        dkv = as_jax(dkv)
    return tk.SplashAttentionKernel(as_jax(fwd), dkv, config=config, is_mqa=is_mqa, save_residuals=save_residuals,
                                    mask_value=mask_value, mask_function=fn, fwd_mask_sparsity=fwd_sparsity,
                                    dkv_mask_sparsity=dkv_sparsity)


__all__ = ["NumpyMaskInfo", "TokamaxMaskInfo", "make_splash_kernel", "make_tokamax_kernel", "mask_info",
           "process_mask", "tokamax_mask_info"]
