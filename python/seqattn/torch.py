"""seqattn for PyTorch: the CPU engine (and, for CUDA tensors, backends::Cuda) as a custom op, and flex_attention BlockMasks.

``attention(q, k, v, mask)`` runs seqattn's CPU engine on torch tensors in
flex_attention's layout (q ``[B, Hq, S, D]``, k / v ``[B, Hkv, S_kv, D]``) as
the custom ops ``seqattn::attention_forward`` / ``seqattn::attention_backward``:
differentiable (``torch.autograd``), traceable by ``torch.compile`` (fake
kernels; no graph break), with segment ids as traced tensors (new ids of the
same shape: no recompilation). Details in :func:`attention`.

``block_mask(mask, B, H, Q_LEN, KV_LEN, BLOCK_SIZE=128)`` returns a real
``torch.nn.attention.flex_attention.BlockMask`` whose block lists are exactly
those ``create_block_mask`` builds for the same pattern (partial and full
tiles, the key-side lists, int32, the same index order; short edge tiles are
partial), computed in C++ from the mask's structure without materialising the
Q x KV mask. Its ``mask_mod`` answers every element exactly from a tile table
(one id per tile plus the distinct partial tiles), so ``flex_attention`` runs
with it, compiled or not. The rules: docs/semantics/splash-and-flex.md §7-§9.
"""

from __future__ import annotations

import math
from typing import Optional

import numpy as np
import torch
from torch.nn.attention.flex_attention import BlockMask as FlexBlockMask

from . import _core, _cuda_support
from ._arrays import bf16_dtype, check_threads
from ._core import BlockMask, Mask
from .attention import Plan
from .attention import attention as _np_attention
from .attention import attention_backward as _np_attention_backward
from .attention import plan as _np_plan

_EMPTY_TILE = -1
_FULL_TILE = -2


def _as_tensor(a, device):
    return None if a is None else torch.from_numpy(a).to(device)


def tile_mask_mod(tile_ids, tile_bits, block_size):
    """A flex mask_mod reading the tile table (``tile_ids`` [B', H', Qb, Kb], ``tile_bits`` [n, bq, bkv]).

    B' and H' of 1 broadcast over the batch and the heads.
    """
    bq, bkv = block_size
    if tile_bits.shape[0] == 0:  # no partial tile: keep the gather in bounds
        tile_bits = torch.zeros((1, bq, bkv), dtype=torch.bool, device=tile_ids.device)
    else:
        tile_bits = tile_bits.to(torch.bool)
    nb, nh = tile_ids.shape[0], tile_ids.shape[1]

    def mask_mod(b, h, q_idx, kv_idx):
        tid = tile_ids[b % nb, h % nh, q_idx // bq, kv_idx // bkv]
        bit = tile_bits[tid.clamp(min=0), q_idx % bq, kv_idx % bkv]
        return (tid == _FULL_TILE) | ((tid >= 0) & bit)

    return mask_mod


def _block_size(block_size):
    """(block_q, block_kv) from an int or a pair of ints, as create_block_mask's BLOCK_SIZE."""
    if isinstance(block_size, (int, np.integer)) and not isinstance(block_size, bool):
        return int(block_size), int(block_size)
    try:
        pair = tuple(block_size)
    except TypeError:
        pair = ()
    if isinstance(block_size, str) or len(pair) != 2 or not all(
        isinstance(b, (int, np.integer)) and not isinstance(b, bool) for b in pair
    ):
        raise ValueError(f"block_mask: BLOCK_SIZE must be an int or a pair (block_q, block_kv) of ints, "
                         f"got {block_size!r}")
    return int(pair[0]), int(pair[1])


def block_mask_arrays(mask, B, H, Q_LEN=None, KV_LEN=None, BLOCK_SIZE=128, *, separate_full_blocks=True,
                      compute_q_blocks=True):
    """The flex arrays (and the tile table) as a dict of NumPy int32 arrays."""
    B = 1 if B is None else int(B)
    H = 1 if H is None else int(H)
    bq, bkv = _block_size(BLOCK_SIZE)
    if isinstance(mask, BlockMask):
        if tuple(mask.block_size) != (bq, bkv):
            raise ValueError(f"block_mask: the BlockMask has block_size {tuple(mask.block_size)}, "
                             f"BLOCK_SIZE is ({bq}, {bkv})")
        return _core._flex_block_mask_arrays_from_block_mask(mask, B, H, separate_full_blocks, compute_q_blocks)
    if not isinstance(mask, Mask):
        raise ValueError(f"mask: expected a seqattn.Mask or seqattn.BlockMask, got {type(mask).__name__}")
    # Masks holding per-sequence data (documents, top-k, one prefix length per
    # sequence, ...) are built for their own rows; the export broadcasts 1 row to B.
    mask_batch = mask.batch or 1
    own = mask.lengths
    if own is not None:
        qs, kvs = own
        mask_batch = len(qs)
        Q_LEN = qs[0] if Q_LEN is None else Q_LEN
        KV_LEN = kvs[0] if KV_LEN is None else KV_LEN
    if Q_LEN is None:
        raise ValueError(f"block_mask: Q_LEN is required for {mask!r} (it holds no lengths of its own)")
    KV_LEN = Q_LEN if KV_LEN is None else KV_LEN
    return _core._flex_block_mask_arrays(mask, B, H, int(Q_LEN), int(KV_LEN), int(bq), int(bkv), mask_batch,
                                         separate_full_blocks, compute_q_blocks)


def block_mask(mask, B, H, Q_LEN=None, KV_LEN=None, BLOCK_SIZE=128, *, device="cpu", separate_full_blocks=True,
               compute_q_blocks=True):
    """A ``torch.nn.attention.flex_attention.BlockMask`` for a seqattn mask (or BlockMask).

    ``B`` / ``H`` may be None (1, broadcast), as in ``create_block_mask``; a mask that differs per batch row
    (documents, top-k, ...) must hold B rows or 1. ``Q_LEN`` / ``KV_LEN`` default to the mask's own lengths.
    """
    d = block_mask_arrays(mask, B, H, Q_LEN, KV_LEN, BLOCK_SIZE, separate_full_blocks=separate_full_blocks,
                          compute_q_blocks=compute_q_blocks)
    t = {k: _as_tensor(d[k], device) for k in ("kv_num_blocks", "kv_indices", "full_kv_num_blocks",
                                               "full_kv_indices", "q_num_blocks", "q_indices", "full_q_num_blocks",
                                               "full_q_indices", "tile_ids", "tile_bits")}
    block_size = tuple(d["block_size"])
    return FlexBlockMask(
        seq_lengths=tuple(d["seq_lengths"]),
        kv_num_blocks=t["kv_num_blocks"],
        kv_indices=t["kv_indices"],
        full_kv_num_blocks=t["full_kv_num_blocks"],
        full_kv_indices=t["full_kv_indices"],
        q_num_blocks=t["q_num_blocks"],
        q_indices=t["q_indices"],
        full_q_num_blocks=t["full_q_num_blocks"],
        full_q_indices=t["full_q_indices"],
        BLOCK_SIZE=block_size,
        mask_mod=tile_mask_mod(t["tile_ids"], t["tile_bits"], block_size),
    )


# ---- seqattn's CPU engine as a torch custom op ----
#
# Masks and plans cannot cross the op boundary: they are registered here and
# travel as an integer handle (as seqattn.jax passes its masks to the XLA
# handlers), kept for the life of the process. Segment ids are tensors, traced
# by torch.compile like q, k and v.

_objects = {}  # handle -> mask or Plan
_handles = {}  # _key(object) -> handle; holding the object keeps its id() unique
_plans = {}  # (handle, shapes, backward, threads) -> Plan of a mask's call shape
_MAX_CACHED_PLANS = 64


@torch.compiler.assume_constant_result
def _handle(obj):
    """The integer standing for a mask or a plan at the op boundary (0: none): a constant under torch.compile."""
    if obj is None:
        return 0
    key = _key(obj)
    h = _handles.get(key)
    if h is None:
        h = len(_objects) + 1
        _objects[h] = obj
        _handles[key] = h
    return h


def _key(obj):
    """What identifies a mask or plan in the registry.

    A mask that holds no data of its own (no batch, no lengths: causal, window, chunked, compositions of them)
    is described exactly by its repr, so ``attention(q, k, v, seqattn.CausalMask())`` called in a loop
    registers one mask, not one per call. Anything else (ids, indices, plans) is identified by the object.
    """
    if isinstance(obj, Mask) and obj.batch is None and obj.lengths is None:
        r = repr(obj)
        if "<" not in r:  # data is shown abbreviated, as <...>
            return ("mask", type(obj).__qualname__, r)
    return id(obj)


def _bshd(t):
    """A NumPy view of a CPU tensor [B, H, S, D] as BSHD [B, S, H, D]: strides only, no copy.

    bfloat16 tensors are viewed as ml_dtypes.bfloat16 (the same bits).
    """
    t = t.detach().transpose(1, 2)
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(bf16_dtype())
    return t.numpy()


def _from_engine(a):
    """A tensor sharing the memory of an array the engine returned (BSHD [B, S, H, D] -> [B, H, S, D] by strides)."""
    if a.dtype == np.float32:
        t = torch.from_numpy(a)
    else:  # ml_dtypes.bfloat16
        t = torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return t.transpose(1, 2)


def _ids(t):
    # int32 ids are viewed; other integer widths are range-checked and converted by seqattn ([B, S]: small).
    return None if t is None else t.detach().numpy()


def _threads(threads):
    return torch.get_num_threads() if threads < 0 else threads


def _call(q, k, v, ids, handle, backward, threads):
    """The keyword arguments that give seqattn.attention / attention_backward the mask or plan of a call."""
    obj = _objects.get(handle) if handle else None
    if isinstance(obj, Plan):
        return {"plan": obj}
    if isinstance(obj, CudaPlan):
        raise ValueError(f"seqattn.torch.attention: {obj!r} runs CUDA tensors; q, k, v are on the CPU (make the "
                         "plan with seqattn.torch.plan on CPU tensors or shapes)")
    # The mask planned once per call shape; segment ids go with each call, refining that plan (seqattn.attention).
    key = (handle, tuple(q.shape), tuple(k.shape), tuple(v.shape), backward, threads)
    p = _plans.get(key)
    if p is None:
        p = plan(q.shape, k.shape, v.shape, obj, backward=backward, threads=threads)
        if len(_plans) >= _MAX_CACHED_PLANS:
            _plans.pop(next(iter(_plans)))
        _plans[key] = p
    segment_ids, kv_segment_ids, positions, kv_positions = (_ids(t) for t in ids)
    if segment_ids is None:
        return {"plan": p}
    return {"plan": p, "segment_ids": segment_ids, "kv_segment_ids": kv_segment_ids, "positions": positions,
            "kv_positions": kv_positions}


@torch.library.custom_op("seqattn::attention_forward", mutates_args=(), device_types="cpu")
def _forward_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, segment_ids: Optional[torch.Tensor],
                kv_segment_ids: Optional[torch.Tensor], positions: Optional[torch.Tensor],
                kv_positions: Optional[torch.Tensor], sinks: Optional[torch.Tensor], handle: int,
                scale: Optional[float], softcap: Optional[float], threads: int) -> tuple[torch.Tensor, torch.Tensor]:
    threads = _threads(threads)
    call = _call(q, k, v, (segment_ids, kv_segment_ids, positions, kv_positions), handle, False, threads)
    s = None if sinks is None else sinks.detach().to(torch.float32).numpy()
    out, lse = _np_attention(_bshd(q), _bshd(k), _bshd(v), scale=scale, softcap=softcap, sinks=s, threads=threads,
                             **call)
    return _from_engine(out), torch.from_numpy(lse)


@_forward_op.register_fake
def _forward_fake(q, k, v, segment_ids, kv_segment_ids, positions, kv_positions, sinks, handle, scale, softcap,
                  threads):
    b, h, s, _ = q.shape
    out = q.new_empty((b, s, h, v.shape[-1])).transpose(1, 2)
    return out, q.new_empty((b, h, s), dtype=torch.float32)


@torch.library.custom_op("seqattn::attention_backward", mutates_args=(), device_types="cpu")
def _backward_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                 dout: torch.Tensor, segment_ids: Optional[torch.Tensor], kv_segment_ids: Optional[torch.Tensor],
                 positions: Optional[torch.Tensor], kv_positions: Optional[torch.Tensor],
                 sinks: Optional[torch.Tensor], handle: int, scale: Optional[float], softcap: Optional[float],
                 threads: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    threads = _threads(threads)
    call = _call(q, k, v, (segment_ids, kv_segment_ids, positions, kv_positions), handle, True, threads)
    dq, dk, dv = _np_attention_backward(_bshd(q), _bshd(k), _bshd(v), _bshd(out), lse.detach().numpy(), _bshd(dout),
                                        scale=scale, softcap=softcap, threads=threads, **call)
    return _from_engine(dq), _from_engine(dk), _from_engine(dv), _sinks_grad(out, lse, dout, sinks)


def _sinks_grad(out, lse, dout, sinks):
    """d loss / d sink_h = -sum over rows of p_sink * rowsum(dout * out), p_sink = exp(sink_h - lse) ([0]: no sinks).

    The engine's LSE includes the sink, so its dq, dk, dv are those of the call with sinks.
    """
    if sinks is None:
        return lse.new_empty((0,))
    delta = (dout.to(torch.float32) * out.to(torch.float32)).sum(-1)  # [B, H, S]
    p_sink = torch.exp(sinks.detach().to(torch.float32)[None, :, None] - lse)
    return (-(p_sink * delta).sum((0, 2))).to(sinks.dtype)


@_backward_op.register_fake
def _backward_fake(q, k, v, out, lse, dout, segment_ids, kv_segment_ids, positions, kv_positions, sinks, handle,
                   scale, softcap, threads):
    def like(t):
        b, h, s, d = t.shape
        return t.new_empty((b, s, h, d)).transpose(1, 2)

    dsinks = lse.new_empty((0,)) if sinks is None else sinks.new_empty(sinks.shape)
    return like(q), like(k), like(v), dsinks


def _setup_context(ctx, inputs, output):
    q, k, v, segment_ids, kv_segment_ids, positions, kv_positions, sinks, handle, scale, softcap, threads = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, segment_ids, kv_segment_ids, positions, kv_positions, sinks)
    ctx.options = (handle, scale, softcap, threads)


def _autograd_backward(ctx, dout, dlse):
    q, k, v, out, lse, segment_ids, kv_segment_ids, positions, kv_positions, sinks = ctx.saved_tensors
    dq, dk, dv, dsinks = _backward_op(q, k, v, out, lse, dout, segment_ids, kv_segment_ids, positions, kv_positions,
                                      sinks, *ctx.options)
    return dq, dk, dv, None, None, None, None, None if sinks is None else dsinks, None, None, None, None


_forward_op.register_autograd(_autograd_backward, setup_context=_setup_context)


# ---- the same ops on CUDA tensors: backends::Cuda through seqattn._cuda ----
#
# Zero-copy: the module gets each tensor's data pointer and its strides in the
# BSHD order the engine reads ([B, H, S, D] viewed as [B, S, H, D]), and the
# current torch stream of the tensors' device. Layouts the kernels cannot read
# (head dim not contiguous, rows not 16-byte aligned) raise ValueError: nothing
# is copied to fix them. Planning (the mask's BlockMask, uploaded once per
# plan) runs on the host: segment ids on the GPU are copied to the host for it
# (the call then waits for them).

class CudaPlan:
    """A plan of seqattn's CUDA backend for one call shape on one device (:func:`plan` on CUDA tensors)."""

    __slots__ = ("_plan", "_device")

    def __init__(self, cuda_plan, device):
        self._plan = cuda_plan
        self._device = device

    @property
    def backward(self):
        return self._plan.backward

    @property
    def device(self):
        return self._device

    def __repr__(self):
        return repr(self._plan)


_CUDA_DTYPES = {torch.bfloat16: "bfloat16", torch.float16: "float16"}

if torch.version.cuda is not None:
    # Loaded now, not on the first CUDA call: torch.compile traces the checks of that call, and an import
    # there would break the graph. Loading needs no CUDA library (the runtime is linked in statically, the
    # driver is opened on the first CUDA call).
    _cuda_support.module()


def _bshd_desc(t):
    """(data pointer, BSHD shape, BSHD strides in elements) of a tensor [B, H, S, D]: no copy."""
    b, h, s, d = t.shape
    sb, sh, ss, sd = t.stride()
    return t.data_ptr(), [b, s, h, d], [sb, ss, sh, sd]


def _lse_desc(t):
    """(data pointer, shape, strides) of an LSE [B, H, S] (the engine's BSHD LSE layout)."""
    return t.data_ptr(), list(t.shape), list(t.stride())


def _cuda_rows_ok(t):
    """Whether backends::Cuda reads ``t`` [B, H, S, D] in place: head dim contiguous, 16-byte rows."""
    _, sh, ss, sd = t.stride()
    return sd == 1 and ss % 8 == 0 and sh % 8 == 0 and (t.storage_offset() * t.element_size()) % 16 == 0


def _check_cuda_rows(t, name, who):
    """The row layout backends::Cuda reads (16-byte row copies) and writes, checked before any CUDA call."""
    sb, sh, ss, sd = t.stride()
    offset_bytes = t.storage_offset() * t.element_size()
    if sd != 1:
        raise ValueError(f"{who}: {name} must be contiguous in the head dim (stride 1) on CUDA, got shape "
                         f"{tuple(t.shape)} with strides {tuple(t.stride())}; tensors are not copied to fix "
                         "this: pass .contiguous()")
    if ss % 8 or sh % 8 or offset_bytes % 16:
        raise ValueError(f"{who}: {name} rows must be 16-byte aligned on CUDA (sequence and head strides multiples "
                         f"of 8 elements, a 16-byte aligned start), got shape {tuple(t.shape)} with strides "
                         f"{tuple(t.stride())} and storage offset {t.storage_offset()}")


def _cuda_stream(device):
    """The current torch stream of ``device``, as the cudaStream_t value the CUDA module takes."""
    return torch.cuda.current_stream(device).cuda_stream


def _device_index(t):
    return t.device.index if t.device.index is not None else torch.cuda.current_device()


def _host_ids(t):
    # Copied to the host as they are: DocumentMask range-checks wider integers, never truncates them.
    return None if t is None else t.detach().cpu().numpy()


_cuda_plans = {}  # (handle, shapes, backward, device) -> CudaPlan of a static mask


def _cuda_call_plan(cuda, q, k, v, ids, handle, backward, who):
    """The CudaPlan of a call: the one given, the cached plan of a static mask, or one over this call's ids."""
    device = _device_index(q)
    obj = _objects.get(handle) if handle else None
    if isinstance(obj, CudaPlan):
        if obj.device != device:
            raise ValueError(f"{who}: {obj!r} was made on cuda:{obj.device}, q is on cuda:{device}")
        return obj._plan
    if isinstance(obj, Plan):
        raise ValueError(f"{who}: {obj!r} is a CPU plan; q, k, v are CUDA tensors (make the plan with "
                         "seqattn.torch.plan on CUDA tensors, or pass device=)")
    shapes = [_bshd_desc_shape(t) for t in (q, k, v)]
    if ids[0] is not None:  # a document mask over this call's ids: planned per call
        from .masks import DocumentMask

        segment_ids, kv_segment_ids, positions, kv_positions = (_host_ids(t) for t in ids)
        mask = DocumentMask(segment_ids, positions, obj, kv_segment_ids=kv_segment_ids, kv_segment_pos=kv_positions)
        return cuda._plan(*shapes, mask, backward, device)
    key = (handle, tuple(map(tuple, shapes)), backward, device)
    p = _cuda_plans.get(key)
    if p is None:
        p = cuda._plan(*shapes, obj, backward, device)
        if len(_cuda_plans) >= _MAX_CACHED_PLANS:
            _cuda_plans.pop(next(iter(_cuda_plans)))
        _cuda_plans[key] = p
    return p


def _bshd_desc_shape(t):
    b, h, s, d = t.shape
    return [b, s, h, d]


def _check_cuda_tensors(q, k, v, extra, who):
    """Devices, dtypes and layouts of a CUDA call, before any CUDA call (ValueError naming the argument)."""
    cuda = _cuda_support.require(who)
    for name, t in (("q", q), ("k", k), ("v", v)) + tuple(extra):
        if t is not None and t.device != q.device:
            raise ValueError(f"{who}: {name} is on {t.device} but q is on {q.device}: all tensors of a call must be "
                             "on one device")
    if q.dtype not in _CUDA_DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"{who}: on CUDA, q, k and v must all be bfloat16 or all float16 (backends::Cuda's "
                         f"storage, fp32 accumulation), got {q.dtype}, {k.dtype}, {v.dtype}")
    for name, t in (("q", q), ("k", k), ("v", v)) + tuple(extra):
        if t is not None and t.dim() == 4:
            _check_cuda_rows(t, name, who)
    return cuda


def _sinks_list(sinks):
    return None if sinks is None else sinks.detach().to("cpu", torch.float32).tolist()


@_forward_op.register_kernel("cuda")
def _forward_cuda(q, k, v, segment_ids, kv_segment_ids, positions, kv_positions, sinks, handle, scale, softcap,
                  threads):
    who = "seqattn.torch.attention"
    cuda = _check_cuda_tensors(q, k, v, (), who)
    p = _cuda_call_plan(cuda, q, k, v, (segment_ids, kv_segment_ids, positions, kv_positions), handle, False, who)
    b, h, s, _ = q.shape
    out = torch.empty((b, s, h, v.shape[-1]), dtype=q.dtype, device=q.device).transpose(1, 2)
    lse = torch.empty((b, h, s), dtype=torch.float32, device=q.device)
    cuda._forward(_CUDA_DTYPES[q.dtype], p, _bshd_desc(q), _bshd_desc(k), _bshd_desc(v), _bshd_desc(out),
                  _lse_desc(lse), math.nan if scale is None else scale, 0.0 if softcap is None else softcap,
                  _sinks_list(sinks), _cuda_stream(q.device))
    return out, lse


@_backward_op.register_kernel("cuda")
def _backward_cuda(q, k, v, out, lse, dout, segment_ids, kv_segment_ids, positions, kv_positions, sinks, handle,
                   scale, softcap, threads):
    who = "seqattn.torch.attention (backward)"
    if not _cuda_rows_ok(dout):
        # dout is autograd's, not the caller's (an expanded ones for out.sum(), ...): copied into the BSHD
        # layout the kernels read. q, k, v and out are never copied.
        dout = dout.transpose(1, 2).contiguous().transpose(1, 2)
    cuda = _check_cuda_tensors(q, k, v, (("out", out), ("lse", lse), ("dout", dout)), who)
    p = _cuda_call_plan(cuda, q, k, v, (segment_ids, kv_segment_ids, positions, kv_positions), handle, True, who)

    def grad(t):  # zeroed, as on the CPU
        b, h, s, d = t.shape
        return torch.zeros((b, s, h, d), dtype=t.dtype, device=t.device).transpose(1, 2)

    dq, dk, dv = grad(q), grad(k), grad(v)
    cuda._backward(_CUDA_DTYPES[q.dtype], p, _bshd_desc(q), _bshd_desc(k), _bshd_desc(v), _bshd_desc(out),
                   _lse_desc(lse), _bshd_desc(dout), _bshd_desc(dq), _bshd_desc(dk), _bshd_desc(dv),
                   math.nan if scale is None else scale, 0.0 if softcap is None else softcap, _sinks_list(sinks),
                   _cuda_stream(q.device))
    return dq, dk, dv, _sinks_grad(out, lse, dout, sinks)


def _check_ids(t, name, b, s, who, device):
    if t is None:
        return
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{who}: {name} must be an integer torch.Tensor [B, S], got {type(t).__name__}")
    if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool or tuple(t.shape) != (b, s):
        raise ValueError(f"{who}: {name} must be an integer tensor of shape ({b}, {s}), got {t.dtype} of shape "
                         f"{tuple(t.shape)}")
    if t.device.type != "cpu" and t.device != device:
        raise ValueError(f"{who}: {name} must be on the CPU or on q's device {device}, got device {t.device}")


def _check_qkv(q, k, v, enable_gqa, who):
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise ValueError(f"{who}: {name} must be a 4-D torch.Tensor [B, H, S, D], got "
                             f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}")
        if t.device.type not in ("cpu", "cuda"):
            raise ValueError(f"{who}: {name} must be a CPU tensor (seqattn's CPU engine) or a CUDA tensor "
                             f"(backends::Cuda), got device {t.device}")
        if t.device != q.device:
            raise ValueError(f"{who}: q, k and v must be on one device, got q on {q.device} and {name} on "
                             f"{t.device} (shapes q {tuple(q.shape)}, {name} {tuple(t.shape)})")
    if q.device.type == "cuda":
        _check_cuda_tensors(q, k, v, (), who)  # the CUDA module, dtypes and row layouts
    elif q.dtype not in (torch.float32, torch.bfloat16) or k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"{who}: q, k and v must all be float32 or all bfloat16 (the engine's storage types; "
                         f"convert float16 with .float() or .bfloat16()), got {q.dtype}, {k.dtype}, {v.dtype}")
    shapes = f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
    if not q.shape[0] == k.shape[0] == v.shape[0] or k.shape[1] != v.shape[1] or k.shape[2] != v.shape[2]:
        raise ValueError(f"{who}: q [B, Hq, S, D], k [B, Hkv, S_kv, D], v [B, Hkv, S_kv, Dv] must agree in B, and "
                         f"k and v in Hkv and S_kv; got {shapes}")
    if q.shape[3] != k.shape[3]:
        raise ValueError(f"{who}: q and k must have the same head dim D, got {shapes}")
    hq, hkv = q.shape[1], k.shape[1]
    if hq != hkv and not enable_gqa:
        raise ValueError(f"{who}: q has {hq} heads and k / v {hkv}: pass enable_gqa=True for grouped-query "
                         f"attention; got {shapes}")
    if hkv == 0 or hq % hkv != 0:
        raise ValueError(f"{who}: the query heads ({hq}) must be a multiple of the key/value heads ({hkv}); "
                         f"got {shapes}")


def plan(q, k, v, mask=None, *, backward=True, threads=None, device=None):
    """A seqattn :class:`~seqattn.Plan` for :func:`attention` on tensors (or shapes) ``[B, H, S, D]``.

    ``backward=True`` (the default) plans the backward pass too; ``threads`` (None: ``torch.get_num_threads()``)
    is what the work is split for. On CUDA (``device`` a CUDA device, or None and ``q`` a CUDA tensor) it is
    a :class:`CudaPlan` of backends::Cuda on that device, which uploads the mask once.
    """
    shapes = [tuple(int(d) for d in (x.shape if hasattr(x, "shape") else x)) for x in (q, k, v)]
    for name, s in zip("qkv", shapes):
        if len(s) != 4:
            raise ValueError(f"seqattn.torch.plan: {name} must be [B, H, S, D], got shape {s}")
    bshd = [(s[0], s[2], s[1], s[3]) for s in shapes]
    if device is None and isinstance(q, torch.Tensor):
        device = q.device
    device = None if device is None else torch.device(device)
    if device is not None and device.type == "cuda":
        if mask is not None and not isinstance(mask, Mask):
            raise ValueError(f"seqattn.torch.plan: mask must be a seqattn.Mask or None, got {type(mask).__name__}")
        cuda = _cuda_support.require("seqattn.torch.plan")
        index = device.index if device.index is not None else torch.cuda.current_device()
        return CudaPlan(cuda._plan(*bshd, mask, bool(backward), index), index)
    threads = torch.get_num_threads() if threads is None else threads
    return _np_plan(*bshd, mask, backward=backward, threads=threads)


def attention(q, k, v, mask=None, *, segment_ids=None, kv_segment_ids=None, positions=None, kv_positions=None,
              plan=None, scale=None, softcap=None, sinks=None, enable_gqa=False, return_lse=False, threads=None):
    """softmax(mask(softcap(scale * q k^T))) v on seqattn's CPU engine, as a torch custom op.

    q ``[B, Hq, S, D]``, k ``[B, Hkv, S_kv, D]``, v ``[B, Hkv, S_kv, Dv]`` (flex_attention's layout; Hq a
    multiple of Hkv with ``enable_gqa=True``), float32 or bfloat16 CPU tensors, any strides (the engine reads
    them in place). Returns out ``[B, Hq, S, Dv]`` (a view of the engine's BSHD result: strides
    ``[S*Hq*Dv, Dv, Hq*Dv, 1]``) and, with ``return_lse``, the natural-log LSE ``[B, Hq, S]`` (fp32, detached:
    not differentiated). Gradients reach q, k, v and ``sinks`` through the engine's deterministic backward.

    ``mask``: any seqattn.Mask (default full); ``segment_ids`` ``[B, S]`` (integer tensor, 0 = padding; and
    ``kv_segment_ids`` ``[B, S_kv]``, ``positions``, ``kv_positions``) add a document mask around it: the
    mask is planned once per call shape and cached, and each call's ids refine that plan (seqattn.attention's
    segment-id operand; masks that know where a sequence starts, such as prefix-LM, plan the document mask of
    each call's ids instead). Ids are tensors, so ``torch.compile`` traces them and new ids of the same shape
    run the same graph. ``plan``: a plan from :func:`plan` (or ``seqattn.plan`` on BSHD shapes), holding the
    mask. Masks and plans reach the op as
    integer handles: each distinct object is registered once and kept for the life of the process (as in
    seqattn.jax; masks without data of their own, such as causal or a window, by their description), so make
    masks that hold data once, outside the step (torch.compile cannot construct one while tracing), and pass
    per-batch documents as ``segment_ids``. ``scale`` defaults to 1/sqrt(D);
    ``softcap`` None/0 disables; ``sinks``: a float tensor ``[Hq]`` of sink logits (gpt-oss).
    ``threads``: None runs on ``torch.get_num_threads()`` threads (read when the op runs); 0 on every
    hardware thread. A row no key may attend to gets 0 (flex_attention and SDPA give NaN or the mean of v).

    CUDA tensors (bfloat16 or float16, all on one device) run seqattn's CUDA backend (seqattn._cuda) on the
    current torch stream, zero-copy: the head dim must be contiguous and rows 16-byte aligned (ValueError
    otherwise; nothing is copied). A build without the CUDA module raises ValueError saying so.
    """
    who = "seqattn.torch.attention"
    _check_qkv(q, k, v, enable_gqa, who)
    b, s, s_kv = q.shape[0], q.shape[2], k.shape[2]
    if mask is not None and not isinstance(mask, Mask):
        raise ValueError(f"{who}: mask must be a seqattn.Mask or None, got {type(mask).__name__}")
    if plan is not None:
        if not isinstance(plan, (Plan, CudaPlan)):
            raise ValueError(f"{who}: plan must be a seqattn.Plan or CudaPlan (from seqattn.torch.plan), got "
                             f"{type(plan).__name__}")
        if isinstance(plan, CudaPlan) != (q.device.type == "cuda"):
            raise ValueError(f"{who}: {plan!r} does not run tensors on {q.device}; make the plan with "
                             "seqattn.torch.plan on tensors of this device")
        if mask is not None or segment_ids is not None:
            raise ValueError(f"{who}: the plan already holds the mask; give mask / segment_ids or a plan, not both")
    ids = {"segment_ids": (segment_ids, s), "kv_segment_ids": (kv_segment_ids, s_kv), "positions": (positions, s),
           "kv_positions": (kv_positions, s_kv)}
    for name, (t, n) in ids.items():
        _check_ids(t, name, b, n, who, q.device)
    if segment_ids is None and any(t is not None for t, _ in ids.values()):
        raise ValueError(f"{who}: kv_segment_ids / positions / kv_positions given without segment_ids")
    if isinstance(sinks, torch.Tensor) and sinks.device.type != "cpu" and sinks.device != q.device:
        raise ValueError(f"{who}: sinks must be on the CPU or on q's device {q.device}, got device {sinks.device}")
    if sinks is not None and (not isinstance(sinks, torch.Tensor) or not sinks.dtype.is_floating_point
                              or tuple(sinks.shape) != (q.shape[1],)):
        raise ValueError(f"{who}: sinks must be a float tensor of one logit per query head, shape ({q.shape[1]},), "
                         f"got {tuple(sinks.shape) if isinstance(sinks, torch.Tensor) else type(sinks).__name__}")
    threads = -1 if threads is None else check_threads(threads)
    scale = None if scale is None else float(scale)
    softcap = None if softcap is None or softcap == 0 else float(softcap)
    if scale is not None and not math.isfinite(scale):
        raise ValueError(f"{who}: scale must be finite, got {scale}")
    out, lse = _forward_op(q, k, v, segment_ids, kv_segment_ids, positions, kv_positions, sinks,
                           _handle(plan if plan is not None else mask), scale, softcap, threads)
    return (out, lse.detach()) if return_lse else out


__all__ = ["CudaPlan", "attention", "block_mask", "block_mask_arrays", "plan", "tile_mask_mod"]
