"""seqattn's own Pallas TPU attention: a flash kernel whose grid walks the blocks a BlockLayout lists.

``layout`` defines the metadata (``BlockLayout``) and its reference builder; ``static`` builds it for any
seqattn mask through the C++ TPU policy; ``builders`` builds it under ``jax.jit`` from segment ids and top-k
selections; ``kernel`` holds the kernels and their entry points ``flash_attention`` (BHSD) and ``attention``
(BSHD, ragged THD); ``traffic`` counts the work a layout makes a kernel do. The layout works from NumPy alone
(with JAX installed it registers itself as a pytree); the kernel and builder names load their modules (and JAX) on first use.
"""

from .layout import BlockLayout, LayoutShape, dense_from_layout, layout_from_dense, validate
from .static import page_table, static_layout

_LAZY = {
    "attention": "kernel",
    "flash_attention": "kernel",
    "grid_steps": "kernel",
    "window": "kernel",
    "LayoutBuild": "builders",
    "checked": "builders",
    "document_layout": "builders",
    "run_positions": "builders",
    "topk_tile_layout": "builders",
    "topk_token_layout": "builders",
}


def __getattr__(name):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f".{module}", __name__), name)


__all__ = ["BlockLayout", "LayoutShape", "dense_from_layout", "layout_from_dense", "page_table", "static_layout",
           "validate", *_LAZY]
