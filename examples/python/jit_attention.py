"""seqattn's CPU attention engine inside jax.jit, with vmap and gradients.

    python examples/python/jit_attention.py
"""

import jax
import jax.numpy as jnp
import numpy as np

import seqattn
import seqattn.jax as sj

rng = np.random.default_rng(0)
B, S, H, HKV, D = 2, 256, 8, 2, 64
q = jnp.asarray(rng.standard_normal((B, S, H, D)), jnp.float32)
k = jnp.asarray(rng.standard_normal((B, S, HKV, D)), jnp.float32)
v = jnp.asarray(rng.standard_normal((B, S, HKV, D)), jnp.float32)

# Documents packed in each row, causal within each, and a 64-token window.
ids = jnp.asarray(np.repeat(np.arange(1, 5), S // 4)[None].repeat(B, 0), jnp.int32)
pos = jnp.asarray(np.tile(np.arange(S // 4), 4)[None].repeat(B, 0), jnp.int32)
mask = seqattn.CausalMask() & seqattn.SlidingWindowMask(64, 0)


@jax.jit
def layer(q, k, v, ids, pos):
    return sj.attention(q, k, v, mask, segment_ids=ids, positions=pos)


out = layer(q, k, v, ids, pos)
print("out", out.shape, out.dtype)

# Same result as jax.nn.dot_product_attention with the dense mask (rows that
# see no key aside: seqattn returns 0 there).
dense = seqattn.DocumentMask(np.asarray(ids), np.asarray(pos), mask).to_dense()
ref = jax.nn.dot_product_attention(q, k, v, mask=jnp.asarray(dense))
print("max |out - reference|:", float(jnp.max(jnp.abs(out - ref))))

# Gradients through the C++ backward pass (jax.custom_vjp).
loss = lambda q, k, v: jnp.sum(layer(q, k, v, ids, pos) ** 2)  # noqa: E731
dq, dk, dv = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v)
print("grad shapes", dq.shape, dk.shape, dv.shape)

# vmap over an extra leading dim.
many = jax.vmap(lambda q: sj.attention(q, k, v, mask))(jnp.stack([q, q]))
print("vmapped", many.shape)
