"""Array conversions at the boundary: exact dtypes, no silent narrowing."""

import numpy as np

from . import _core


def as_int32(x, name):
    """``x`` as an int32 NumPy array (a view when it already is one).

    Integer arrays of other widths are converted only when every value fits;
    anything else raises ValueError naming ``name``.
    """
    a = np.asarray(x)
    if a.dtype == np.int32:
        return a
    if a.dtype.kind not in "iub":
        raise ValueError(f"{name}: expected an integer array, got dtype {a.dtype} of shape {a.shape}")
    if a.size and a.dtype.kind in "iu":
        lo, hi = a.min(), a.max()
        info = np.iinfo(np.int32)
        if lo < info.min or hi > info.max:
            raise ValueError(
                f"{name}: values in [{lo}, {hi}] do not fit int32 (shape {a.shape}, dtype {a.dtype})"
            )
    return a.astype(np.int32)


def bf16_dtype():
    try:
        import ml_dtypes
    except ImportError:  # bf16 support is optional
        return None
    return np.dtype(ml_dtypes.bfloat16)


def as_float(x, name):
    """(array, kind) with kind "f32" or "bf16"; bf16 arrays are passed as their uint16 bits."""
    a = x if isinstance(x, np.ndarray) else np.asarray(x)
    if a.dtype == np.float32:
        return a, "f32"
    bf16 = bf16_dtype()
    if bf16 is not None and a.dtype == bf16:
        return a.view(np.uint16), "bf16"
    raise ValueError(
        f"{name}: expected float32 or bfloat16 (ml_dtypes) storage, got dtype {a.dtype} of shape {a.shape}"
    )


def check_threads(threads):
    """``threads`` (None: 0, every hardware thread) as an int in [0, limits::kMaxThreads].

    Checked before any narrowing, with the engine's messages: 2^32 + 1 must
    not become 1.
    """
    threads = 0 if threads is None else int(threads)
    if threads < 0:
        raise ValueError(f"attention: threads must be >= 0 (0 = all hardware threads), got {threads}")
    if threads > _core.MAX_THREADS:
        raise ValueError(
            f"attention: threads must be at most {_core.MAX_THREADS} (limits::kMaxThreads), got {threads}"
        )
    return threads
