"""TransformerEngine descriptors from JAX arrays, then attention over the packed segments.

    python examples/python/descriptors_jax.py
"""

import jax.numpy as jnp
import numpy as np

import seqattn

# Two rows of 8 tokens, packed THD style: row 0 holds segments of 3 and 4
# tokens and one padding token, row 1 one segment of 2 then one of 6.
segment_ids = jnp.array([[1, 1, 1, 2, 2, 2, 2, 0], [1, 1, 2, 2, 2, 2, 2, 2]], jnp.int32)
segment_pos = jnp.array([[0, 1, 2, 0, 1, 2, 3, 0], [0, 1, 0, 1, 2, 3, 4, 5]], jnp.int32)

desc = seqattn.SequenceDescriptor.from_segment_ids_and_pos(np.asarray(segment_ids), np.asarray(segment_pos))
q_seqlens, kv_seqlens, q_offsets, kv_offsets = desc.get_seqlens_and_offsets(
    seqattn.AttnMaskType.padding_causal, seqattn.QKVLayout.THD_THD_THD, window_size=None, max_segments_per_seq=2
)
print("q_seqlens\n", q_seqlens, "\nq_offsets\n", q_offsets)

# vmapped ids: an extra leading dim on the ids, positions shared (broadcast).
stacked = np.stack([np.asarray(segment_ids), np.asarray(segment_ids)])
vm = seqattn.get_seqlens_and_offsets(stacked, np.asarray(segment_pos), "padding_causal", "thd", max_segments_per_seq=2)
print("vmapped q_seqlens shape", vm.q_seqlens.shape)

# Packing: global offsets and cu_seqlens on the flat (B * S) token axis ...
packed = seqattn.pack_segments(desc.get_seqlens_and_offsets("padding_causal", "thd", max_segments_per_seq=2))
print("cu_seqlens", packed.q_cu_seqlens[: packed.num_segments + 1], "segments", packed.num_segments)

# ... which the THD attention consumes directly.
rng = np.random.default_rng(0)
q = rng.standard_normal((16, 4, 64), np.float32)  # [tokens, heads, dim]
k = rng.standard_normal((16, 2, 64), np.float32)  # GQA: 2 kv heads
v = rng.standard_normal((16, 2, 64), np.float32)
out, lse = seqattn.attention(q, k, v, seqattn.CausalMask(), segments=packed)
print("out", out.shape, "lse", lse.shape, "padding token output is zero:", bool(np.all(out[7] == 0)))
