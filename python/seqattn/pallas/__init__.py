"""seqattn's own Pallas TPU attention: a flash kernel whose grid walks the blocks a BlockLayout lists.

``layout`` defines the metadata (``BlockLayout``) and its reference builder; ``kernel`` holds the kernels and
their entry point ``flash_attention`` (``from seqattn.pallas.kernel import flash_attention``). Importing this
package does not import JAX; importing ``kernel`` does.
"""

from .layout import BlockLayout, LayoutShape, dense_from_layout, layout_from_dense, validate

__all__ = ["BlockLayout", "LayoutShape", "dense_from_layout", "layout_from_dense", "validate"]
