"""seqattn's attention engines inside ``jax.jit``, through the XLA FFI.

``attention(q, k, v, mask=..., segment_ids=..., positions=...)`` takes BSHD
arrays ``[..., S, H, D]`` (any leading dims: batch, vmapped dims), float32 or
bfloat16, and runs the C++ engine as a CPU custom call. On a GPU (a jax with
the CUDA plugin, and seqattn built with its CUDA module, seqattn._cuda) the
same custom call runs ``backends::Cuda`` on XLA's stream, on bfloat16 arrays
(float32 runs on the CPU only and fails there at run time); segment ids are
then copied to the host for planning (the call waits for them). It is differentiable
(``jax.custom_vjp`` with the engine's deterministic backward pass; the
returned LSE is not differentiated) and batches under ``vmap``.

Differences from ``jax.nn.dot_product_attention``: a query row that may
attend to no key gets output 0 (not the mean of ``v`` / NaN); masks are
seqattn masks (any composition), not dense arrays; the layout names are
``[batch, seq, heads, dim]`` for both.

The mask is static (part of the compiled computation): each distinct mask
object is registered once and kept for the life of the process. Segment ids
and positions are traced arrays ``[..., S]`` (int32; 0 = padding); wider
integer arrays are range-checked, then converted, when they are concrete
(NumPy, or JAX arrays outside jit), and refused when traced.

Shapes, head ratios, scale, softcap, threads, the segment ids' shapes and
the mask against the lengths and heads are checked while tracing, with the
engine's checks: errors are ValueErrors with its message, and so are those of
segment ids known while tracing (NumPy arrays, JAX arrays outside jit).
Malformed traced ids can only be found while running and surface as the XLA
runtime error raised by JAX, with seqattn's message; so does, under jit or
vmap, a mask holding a batch of its own that is a multiple of the traced
batch but not the batch that runs (vmap folds its dims into the batch, which
tracing may not see). Called eagerly (concrete inputs) the batch is exact.
"""

import functools
import math
import os
import re

import numpy as np

import jax
import jax.numpy as jnp

from . import _core, _cuda_support
from ._arrays import as_int32, check_threads
from ._core import FullMask, Mask

try:
    import jax.ffi
except ImportError as e:  # jax.ffi became public in jax 0.5.0
    raise ImportError(
        f"seqattn.jax needs jax>=0.5.0 (the jax.ffi module), found jax {jax.__version__}; "
        "pip install -U 'jax>=0.5.0'"
    ) from e


def _runtime_ffi_api_version():
    """The XLA FFI API version (major, minor) of the installed jaxlib, or None where it cannot be read.

    jaxlib ships the C API header of the runtime it contains; jax offers no call that reports the version.
    """
    try:
        with open(os.path.join(jax.ffi.include_dir(), "xla", "ffi", "api", "c_api.h")) as f:
            text = f.read()
    except (OSError, RuntimeError):
        return None
    major = re.search(r"^#define XLA_FFI_API_MAJOR (\d+)", text, re.M)
    minor = re.search(r"^#define XLA_FFI_API_MINOR (\d+)", text, re.M)
    return (int(major.group(1)), int(minor.group(1))) if major and minor else None


def _check_ffi_api(built, runtime, built_jaxlib="unknown"):
    """Raises ImportError when a runtime implementing FFI API ``runtime`` cannot run handlers built for ``built``.

    XLA keeps older minor versions working, so a newer runtime is fine; an older minor (or another major)
    lacks what the handlers were compiled against.
    """
    if built is None or runtime is None:
        return
    built, runtime = tuple(built), tuple(runtime)
    where = (
        f"seqattn's XLA FFI handlers were compiled against FFI API {built[0]}.{built[1]} (jaxlib {built_jaxlib}), "
        f"the installed jax {jax.__version__} implements FFI API {runtime[0]}.{runtime[1]}"
    )
    if runtime[0] == built[0] and runtime[1] >= built[1]:
        return
    if runtime < built:
        raise ImportError(
            f"seqattn.jax: {where}, which is older; upgrade jax and jaxlib (pip install -U jax jaxlib), or build "
            "seqattn against this jax (pip install --no-build-isolation --force-reinstall --no-deps <seqattn source>)"
        )
    raise ImportError(
        f"seqattn.jax: {where}, an incompatible major version; build seqattn against this jax "
        "(pip install --no-build-isolation --force-reinstall --no-deps <seqattn source>)"
    )


if _core.has_xla_ffi:
    _check_ffi_api(_core.xla_ffi_api_version, _runtime_ffi_api_version(), _core.xla_ffi_jaxlib_version)

__all__ = ["attention", "registered_platforms"]

_FORWARD = "seqattn_attention_forward"
_BACKWARD = "seqattn_attention_backward"
_registered = False
_masks = {}  # id(mask) -> (mask, registry id); holding the mask keeps its id() unique
_FULL = FullMask()


_platforms = []  # the platforms the handlers were registered for


def _jax_has_cuda():
    """Whether this jax has a CUDA backend (the jax-cuda plugin, and a device it initialised)."""
    try:
        return len(jax.devices("cuda")) > 0
    except RuntimeError:  # no CUDA plugin, or it found no GPU
        return False


def _cuda_handlers():
    """seqattn._cuda's XLA handlers for platform CUDA, or None (no CUDA module, or one built without jaxlib)."""
    cuda = _cuda_support.module()
    if cuda is None or not cuda.has_xla_ffi:
        return None
    return cuda.ffi_handlers()


def _register_targets():
    """Registers the handlers: for the CPU always, for CUDA where this jax has a CUDA backend and seqattn a CUDA
    module. The names are the same, so one traced computation runs on either platform.

    Skipped for CUDA (and jit on a GPU then reports the target as missing) where either is absent.
    """
    global _registered
    if _registered:
        return
    if not _core.has_xla_ffi:
        raise RuntimeError(
            "seqattn.jax: this build of seqattn has no XLA FFI handlers (jaxlib was not in its build "
            "environment); reinstall it with build isolation (pip install --force-reinstall <seqattn source>), "
            "which installs jaxlib to build against"
        )
    for name, capsule in _core.ffi_handlers().items():
        jax.ffi.register_ffi_target(name, capsule, platform="cpu")
    _platforms.append("cpu")
    if _jax_has_cuda():
        handlers = _cuda_handlers()
        if handlers is not None:
            for name, capsule in handlers.items():
                jax.ffi.register_ffi_target(name, capsule, platform="CUDA")
            _platforms.append("cuda")
    _registered = True


def registered_platforms():
    """The platforms seqattn's XLA handlers are registered for: ``["cpu"]``, or ``["cpu", "cuda"]`` where
    this jax has a CUDA backend and this build of seqattn its CUDA module (after the first call)."""
    _register_targets()
    return list(_platforms)


def _mask_id(mask):
    if mask is None:
        mask = _FULL
    if not isinstance(mask, Mask):
        raise ValueError(f"seqattn.jax.attention: mask must be a seqattn.Mask or None, got {type(mask).__name__}")
    entry = _masks.get(id(mask))
    if entry is None:
        entry = (mask, _core.register_ffi_mask(mask))
        _masks[id(mask)] = entry
    return entry[1]


def _none_ids():
    return jnp.zeros((0,), jnp.int32)


def _attrs(mask_id, scale, softcap, threads):
    return dict(
        mask_id=np.int64(mask_id), scale=np.float32(scale), softcap=np.float32(softcap), threads=np.int64(threads)
    )


def _forward_call(q, k, v, ids, mask_id, scale, softcap, threads):
    out_type = jax.ShapeDtypeStruct(q.shape[:-1] + v.shape[-1:], q.dtype)
    lse_type = jax.ShapeDtypeStruct(q.shape[:-3] + (q.shape[-2], q.shape[-3]), jnp.float32)
    call = jax.ffi.ffi_call(_FORWARD, (out_type, lse_type), vmap_method="broadcast_all")
    return call(q, k, v, *ids, **_attrs(mask_id, scale, softcap, threads))


def _backward_call(q, k, v, out, lse, dout, ids, mask_id, scale, softcap, threads):
    types = tuple(jax.ShapeDtypeStruct(x.shape, x.dtype) for x in (q, k, v))
    call = jax.ffi.ffi_call(_BACKWARD, types, vmap_method="broadcast_all")
    return call(q, k, v, out, lse, dout, *ids, **_attrs(mask_id, scale, softcap, threads))


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6, 7))
def _attention(q, k, v, ids, mask_id, scale, softcap, threads):
    return _forward_call(q, k, v, ids, mask_id, scale, softcap, threads)


def _attention_fwd(q, k, v, ids, mask_id, scale, softcap, threads):
    out, lse = _forward_call(q, k, v, ids, mask_id, scale, softcap, threads)
    return (out, lse), (q, k, v, ids, out, lse)


def _attention_bwd(mask_id, scale, softcap, threads, residuals, cotangents):
    q, k, v, ids, out, lse = residuals
    dout, _ = cotangents  # the LSE is returned under stop_gradient
    dq, dk, dv = _backward_call(q, k, v, out, lse, dout.astype(q.dtype), ids, mask_id, scale, softcap, threads)
    return dq, dk, dv, tuple(None for _ in ids)


_attention.defvjp(_attention_fwd, _attention_bwd)


def _fits_int32(dtype):
    info = jnp.iinfo(dtype)
    return info.min >= np.iinfo(np.int32).min and info.max <= np.iinfo(np.int32).max


def _ids(x, like, name):
    if x is None:
        return _none_ids()
    traced = isinstance(x, jax.core.Tracer)
    dtype = x.dtype if hasattr(x, "dtype") else np.asarray(x).dtype
    if not jnp.issubdtype(dtype, jnp.integer):
        raise ValueError(f"seqattn.jax.attention: {name} must be an integer array, got {dtype}")
    if traced:
        # Inside jit the values are unknown: only a lossless conversion is safe.
        if not _fits_int32(dtype):
            raise ValueError(
                f"seqattn.jax.attention: {name}: {dtype} ids inside jit cannot be range-checked against int32; "
                "pass int32 ids (or a concrete array, which is checked)"
            )
        x = x.astype(jnp.int32)
    elif dtype == np.int32:
        x = jnp.asarray(x)
    else:
        # Range-checked on the host before JAX sees it: jnp.asarray would
        # truncate int64 to int32 silently when x64 is off.
        x = jnp.asarray(as_int32(np.asarray(x), name))
    if x.shape != like.shape[:-2]:
        raise ValueError(
            f"seqattn.jax.attention: {name} must have shape {like.shape[:-2]} ([..., S] of an array of shape "
            f"{like.shape}), got {x.shape}"
        )
    return x


def attention(q, k, v, mask=None, *, segment_ids=None, positions=None, kv_segment_ids=None, kv_positions=None,
              scale=None, softcap=None, threads=None, return_lse=False):
    """softmax(mask(softcap(scale * q k^T))) v on seqattn's CPU engine, as a JAX custom call.

    q ``[..., Sq, Hq, Dk]``, k ``[..., Skv, Hkv, Dk]``, v ``[..., Skv, Hkv, Dv]``
    (Hq a multiple of Hkv); returns out ``[..., Sq, Hq, Dv]`` and, with
    ``return_lse``, the LSE ``[..., Hq, Sq]`` (not differentiated).
    ``segment_ids`` / ``positions`` ``[..., S]`` add a document mask (``mask``
    then applies at the positions within each segment); ``kv_*`` give the key
    side when it differs. ``scale`` defaults to 1/sqrt(Dk).
    """
    _register_targets()
    q, k, v = jnp.asarray(q), jnp.asarray(k), jnp.asarray(v)
    if q.dtype not in (jnp.float32, jnp.bfloat16) or k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(
            f"seqattn.jax.attention: q, k and v must all be float32 or all bfloat16, got {q.dtype}, {k.dtype}, "
            f"{v.dtype}"
        )
    if q.ndim < 4 or k.ndim != q.ndim or v.ndim != q.ndim:
        raise ValueError(
            f"seqattn.jax.attention: q, k, v must be [..., S, H, D] with at least one batch dim and the same rank, "
            f"got {q.shape}, {k.shape}, {v.shape}"
        )
    if q.shape[:-3] != k.shape[:-3] or k.shape[:-3] != v.shape[:-3]:
        # The engine sees the batch dims folded into one: it could not tell (2, 3) from (3, 2).
        raise ValueError(
            f"seqattn.jax.attention: q, k and v must have the same batch dims [...], got q {q.shape}, k {k.shape}, "
            f"v {v.shape}"
        )
    if positions is not None and segment_ids is None:
        raise ValueError("seqattn.jax.attention: positions given without segment_ids")
    if (kv_segment_ids is not None or kv_positions is not None) and segment_ids is None:
        raise ValueError("seqattn.jax.attention: kv_segment_ids / kv_positions given without segment_ids")
    ids = (
        _ids(segment_ids, q, "segment_ids"),
        _ids(kv_segment_ids, k, "kv_segment_ids"),
        _ids(positions, q, "positions"),
        _ids(kv_positions, k, "kv_positions"),
    )
    scale = math.nan if scale is None else float(scale)
    softcap = 0.0 if softcap is None else float(softcap)
    threads = check_threads(threads)
    mask_id = _mask_id(mask)
    # The engine's own checks, now rather than as a runtime error of the compiled call.
    _core._check_attention(
        q.shape, k.shape, v.shape, mask, segment_ids is not None, scale, softcap, threads,
        kv_segment_ids=kv_segment_ids is not None, positions=positions is not None,
        kv_positions=kv_positions is not None,
        # Concrete inputs: an eager call, no vmap can enlarge the batch that runs.
        exact_batch=not any(isinstance(x, jax.core.Tracer) for x in (q, k, v)),
    )
    given = {"segment_ids": segment_ids, "kv_segment_ids": kv_segment_ids, "positions": positions,
             "kv_positions": kv_positions}
    if segment_ids is not None and not any(isinstance(x, jax.core.Tracer) for x in given.values()):
        # Ids known now are checked now: only traced ones can fail while running.
        _core._check_segment_ids(*(None if x is None else as_int32(x, name) for name, x in given.items()))
    out, lse = _attention(q, k, v, ids, mask_id, scale, softcap, threads)
    if return_lse:
        return out, jax.lax.stop_gradient(lse)
    return out
