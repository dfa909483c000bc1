"""Array conversions at the boundary: exact dtypes, no silent narrowing."""

import numpy as np


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
