"""seqattn's own Pallas TPU attention: a flash kernel whose grid walks the blocks a BlockLayout lists.

``layout`` defines the metadata (``BlockLayout``) and its reference builder; ``kernel`` holds the kernels and
their entry point ``flash_attention``. The layout works from NumPy alone (with JAX installed it registers itself
as a pytree); ``flash_attention``, ``window`` and ``grid_steps`` load ``kernel`` (and Pallas) on first use.
"""

from .layout import BlockLayout, LayoutShape, dense_from_layout, layout_from_dense, validate

_KERNEL_NAMES = ("flash_attention", "grid_steps", "window")


def __getattr__(name):
    if name in _KERNEL_NAMES:
        from . import kernel

        return getattr(kernel, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["BlockLayout", "LayoutShape", "dense_from_layout", "layout_from_dense", "validate", *_KERNEL_NAMES]
