"""Splash MaskInfo from seqattn masks, including kinds Splash has no class for.

  python examples/python/splash_mask_info.py

Builds the forward and dK/dV MaskInfo of a causal mask (which Splash computes
in the kernel: no stored tiles, q_sequence instead) and of packed documents
with a sliding window inside each (stored tiles, deduplicated), shows the
arrays, and when JAX is installed checks them against Splash's own
_process_mask on the NumpyMask of the same pattern.
"""

import numpy as np

import seqattn
from seqattn import splash


def show(name, info):
    print(f"== {name}")
    for field in ("data_next", "mask_next", "block_mask", "partial_mask_blocks", "q_sequence"):
        a = getattr(info, field)
        print(f"  {field:20s}", "None" if a is None else f"{a.dtype} {a.shape}")
    print("  block_mask[0] (0 empty, 1 partial, 2 full):")
    for row in info.block_mask[0]:
        print("   ", " ".join(str(int(x)) for x in row))


def main():
    n, block = 1024, 128
    causal = splash.mask_info(seqattn.CausalMask(), block, block, q_len=n, heads=8)
    show("causal, 8 heads (computed in the kernel)", causal)

    # Four documents of different lengths, a 100-token window inside each.
    ids = np.repeat(np.arange(1, 5, dtype=np.int32), [300, 200, 400, 124])[None, :]
    docs = seqattn.DocumentMask(ids, inner=seqattn.SlidingWindowMask(100, 0))
    fwd = splash.mask_info(docs, block, block, heads=8, head_shards=2)
    dkv = splash.mask_info(docs, block, block, heads=8, head_shards=2, is_dkv=True)
    show("documents + window, forward (grid shrunk to the non-empty columns)", fwd)
    show("documents + window, dK/dV", dkv)

    try:
        from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm
        from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask_info as smi
    except ImportError:
        print("(jax not installed: no comparison with Splash's own _process_mask)")
        return
    dense = docs.to_dense()[0, 0]
    want, _ = smi._process_mask(sm.MultiHeadMask((sm.NumpyMask(dense),) * 8), (block, block), False, head_shards=2)
    same = all(
        (getattr(fwd, f) is None and getattr(want, f) is None)
        or np.array_equal(getattr(fwd, f), getattr(want, f)) and getattr(fwd, f).dtype == getattr(want, f).dtype
        for f in ("data_next", "mask_next", "block_mask", "partial_mask_blocks", "q_sequence")
    )
    print("identical to jax's _process_mask(NumpyMask):", same)


if __name__ == "__main__":
    main()
