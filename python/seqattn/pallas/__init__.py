"""seqattn's own Pallas TPU attention: a flash kernel whose grid walks the blocks a BlockLayout lists.

``layout`` defines the metadata (``BlockLayout``) and its reference builder; ``static`` builds it for any
seqattn mask through the C++ TPU policy. Importing this package does not import JAX unless a submodule needs it.
"""

from .layout import BlockLayout, LayoutShape, dense_from_layout, layout_from_dense, validate
from .static import page_table, static_layout

__all__ = ["BlockLayout", "LayoutShape", "dense_from_layout", "layout_from_dense", "page_table", "static_layout",
           "validate"]
