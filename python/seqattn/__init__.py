"""seqattn: packed and ragged attention.

Descriptors (TransformerEngine semantics), masks compiled into every
representation, and a tiled online-softmax attention engine on the CPU, from
NumPy (or anything DLPack / array-like). ``seqattn.jax`` runs the same engine
inside ``jax.jit`` through the XLA FFI.

Errors in the inputs raise ``ValueError`` naming the argument and the shapes.
"""

from . import _cpu

_missing = _cpu.missing_features()
if _missing:
    raise ImportError(
        "seqattn needs an x86-64-v3 CPU (Intel Haswell, AMD Excavator or newer): this CPU lacks "
        + ", ".join(_missing)
    )

from . import _core  # only after the CPU check: loading it needs the features
from ._core import (
    Alignment,
    AttnMaskType,
    BlockMask,
    ChunkedCausalMask,
    CausalMask,
    DEFAULT_MASK_VALUE,
    DenseMask as _DenseMask,
    DocumentMask as _DocumentMask,
    FullMask,
    Mask,
    MultiItemMask as _MultiItemMask,
    PackedSegments,
    PerHeadMask,
    PrefixLMMask as _PrefixLMMask,
    SeqLayout,
    SeqlensAndOffsets,
    SlidingWindowMask,
    TileClass,
    TopKMask as _TopKMask,
)
from .attention import Plan, attention, attention_backward, plan
from .descriptors import (
    QKVFormat,
    QKVLayout,
    SequenceDescriptor,
    get_seqlens_and_offsets,
    pack_segments,
)
from .masks import (
    DenseMask,
    DocumentMask,
    MultiItemMask,
    PrefixLMMask,
    TopKMask,
    block_mask,
    pack_bits,
    to_additive,
    to_ascii,
    to_dense,
    to_svg,
)

simd_target = _core.simd_target
bf16_dot_instruction = _core.bf16_dot_instruction
__version__ = "0.1.0"

__all__ = [
    "Alignment",
    "AttnMaskType",
    "BlockMask",
    "CausalMask",
    "ChunkedCausalMask",
    "DEFAULT_MASK_VALUE",
    "DenseMask",
    "DocumentMask",
    "FullMask",
    "Mask",
    "MultiItemMask",
    "PackedSegments",
    "PerHeadMask",
    "Plan",
    "PrefixLMMask",
    "QKVFormat",
    "QKVLayout",
    "SeqLayout",
    "SeqlensAndOffsets",
    "SequenceDescriptor",
    "SlidingWindowMask",
    "TileClass",
    "TopKMask",
    "attention",
    "attention_backward",
    "bf16_dot_instruction",
    "block_mask",
    "get_seqlens_and_offsets",
    "pack_bits",
    "pack_segments",
    "plan",
    "simd_target",
    "to_additive",
    "to_ascii",
    "to_dense",
    "to_svg",
]
