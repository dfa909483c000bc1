"""A flex_attention BlockMask from a seqattn mask, without the dense Q x KV mask.

  python examples/python/flex_block_mask.py

Packs three documents (causal inside each) into 1000 tokens, builds the
torch BlockMask with seqattn.torch.block_mask, compares it with torch's
create_block_mask for the equivalent mask_mod, and runs flex_attention with
both.
"""

import time

import numpy as np
import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

import seqattn
from seqattn import torch as st


def main():
    n, heads, dim = 1000, 2, 32  # not a multiple of the 128 block: the last tiles are short
    ids = np.repeat(np.array([1, 2, 3], np.int32), [400, 350, 250])
    mask = seqattn.DocumentMask(ids[None, :], inner=seqattn.CausalMask())

    t = time.perf_counter()
    ours = st.block_mask(mask, 1, heads, n, n)
    t_ours = time.perf_counter() - t
    print(ours)

    doc = torch.from_numpy(ids)
    t = time.perf_counter()
    theirs = create_block_mask(lambda b, h, q, kv: (doc[q] == doc[kv]) & (kv <= q), 1, heads, n, n, device="cpu")
    t_theirs = time.perf_counter() - t
    same = all(
        torch.equal(getattr(ours, f), getattr(theirs, f))
        for f in ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices", "q_num_blocks",
                  "q_indices", "full_q_num_blocks", "full_q_indices")
    )
    print(f"seqattn {t_ours * 1e3:.2f} ms, create_block_mask {t_theirs * 1e3:.1f} ms; identical arrays: {same}")

    q, k, v = (torch.randn(1, heads, n, dim) for _ in range(3))
    a = flex_attention(q, k, v, block_mask=ours)
    b = flex_attention(q, k, v, block_mask=theirs)
    print("flex_attention outputs agree:", torch.allclose(a, b, atol=1e-5))


if __name__ == "__main__":
    main()
