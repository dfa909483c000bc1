"""atheris fuzz target over the package's entry points.

Random shapes, dtypes and values (finite, NaN, inf, huge and negative sizes)
into seqattn.attention / attention_backward, the mask classes and their
compositions (&, |, ~), to_dense / to_additive / pack_bits / block_mask /
classes / to_ascii, the Splash MaskInfo export, the Pallas BlockLayout and
page table (seqattn.pallas), the flex export
(seqattn.torch), seqattn.jax.attention (without jit) and the descriptors.
The only acceptable errors are ValueError, TypeError and MemoryError with a
message; any other exception, or a crash of the process, is a finding.

    python fuzz_entry_points.py -max_total_time=60 -rss_limit_mb=4096 [corpus]
(scripts/test-python.sh runs it for SEQATTN_FUZZ_SECONDS after pytest.)
"""

import os
import sys
import warnings

import atheris

with atheris.instrument_imports():
    import numpy as np
    import seqattn
    import seqattn.pallas
    import seqattn.splash

try:
    import seqattn.torch as seqattn_torch
except ImportError:  # torch is optional for the package
    seqattn_torch = None
try:
    import jax

    jax.config.update("jax_platforms", "cpu")
    import seqattn.jax as seqattn_jax
except ImportError:
    seqattn_jax = None
try:
    import ml_dtypes

    BF16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:
    BF16 = None

ACCEPTABLE = (ValueError, TypeError, MemoryError)
# Exception type names to let through while exploring past a known finding
# (comma separated, e.g. SEQATTN_FUZZ_TOLERATE=JaxRuntimeError); empty in CI.
TOLERATE = {n for n in os.environ.get("SEQATTN_FUZZ_TOLERATE", "").split(",") if n}
# Sizes past the documented limits (or negative): each must be rejected before
# anything is allocated. Sizes within the limits but too big for this machine
# are left out: they would allocate (and fill) gigabytes first.
HOSTILE_SIZES = [-1, 0, 2**41, 2**62, 2**63 - 1]
ALIGNMENTS = ["top_left", "bottom_right"]


class Src:
    def __init__(self, data):
        self.fdp = atheris.FuzzedDataProvider(data)

    def int(self, lo, hi):
        return self.fdp.ConsumeIntInRange(lo, hi)

    def bool(self):
        return self.fdp.ConsumeBool()

    def pick(self, options):
        return options[self.int(0, len(options) - 1)]

    def size(self, lo, hi):
        """A small size, rarely a hostile one."""
        if self.int(0, 31) == 0:
            return self.pick(HOSTILE_SIZES)
        return self.int(lo, hi)

    def dtype(self):
        if self.int(0, 7) != 0:
            return np.float32
        return self.pick([np.float64, np.float16, np.int32, np.bool_, BF16 or np.float32])

    def array(self, shape, dtype=np.float32, nonfinite=False):
        n = int(np.prod(shape)) if len(shape) else 1
        raw = self.fdp.ConsumeBytes(min(n, 4096))
        base = np.frombuffer(raw + bytes(max(0, min(n, 4096) - len(raw))), dtype=np.uint8)
        vals = (np.resize(base, n).astype(np.float32) - 128.0) / 32.0
        if nonfinite and n:
            for _ in range(self.int(1, 3)):
                vals[self.int(0, n - 1)] = self.pick([np.nan, np.inf, -np.inf])
        return vals.reshape(shape).astype(dtype)

    def ints(self, shape, lo, hi):
        n = int(np.prod(shape)) if len(shape) else 1
        return np.array([self.int(lo, hi) for _ in range(min(n, 512))] + [0] * max(0, n - 512),
                        dtype=self.pick([np.int32, np.int32, np.int64, np.int16])).reshape(shape)


def make_mask(src, q_len, kv_len, batch, heads, depth=0):
    kind = src.int(0, 14 if depth < 2 else 10)
    if kind == 0:
        return seqattn.FullMask()
    if kind == 1:
        return seqattn.CausalMask(src.pick(ALIGNMENTS))
    if kind == 2:
        return seqattn.SlidingWindowMask(src.int(-3, 40), src.int(-3, 40), src.pick(ALIGNMENTS))
    if kind == 3:
        return seqattn.ChunkedCausalMask(src.int(-1, 40), src.pick(ALIGNMENTS))
    if kind == 4:
        prefix = src.int(-2, 80) if src.bool() else src.ints((src.pick([batch, batch, 1, batch + 1]),), -1, 80)
        return seqattn.PrefixLMMask(prefix, src.pick(ALIGNMENTS))
    if kind == 5:
        ids = src.ints((batch, q_len), 0, 3)
        inner = make_mask(src, q_len, kv_len, batch, heads, depth + 1) if src.bool() else None
        pos = src.ints((batch, q_len), -1, 10) if src.int(0, 3) == 0 else None
        return seqattn.DocumentMask(ids, pos, inner)
    if kind == 6:
        idx = src.ints((batch, q_len, src.int(1, 4)), -1, max(kv_len, 1))
        return seqattn.TopKMask(idx, src.size(0, 64) if src.int(0, 7) == 0 else kv_len)
    if kind == 7:
        shape = src.pick([(q_len, kv_len), (batch, q_len, kv_len), (batch, heads, q_len, kv_len)])
        values = src.array(shape) > 0
        return seqattn.DenseMask(values if src.bool() else values.astype(src.pick([np.uint8, np.int32, np.float32])))
    if kind == 8:
        tokens = src.ints((q_len,), 0, 2)
        return seqattn.MultiItemMask(tokens, src.int(0, 2))
    if kind == 9:
        return seqattn.PerHeadMask([make_mask(src, q_len, kv_len, batch, heads, 2)
                                    for _ in range(src.pick([heads, heads, heads + 1, 0]))])
    if kind == 10:
        return seqattn.CausalMask() & seqattn.SlidingWindowMask(src.int(0, 20), 0)
    a = make_mask(src, q_len, kv_len, batch, heads, depth + 1)
    if kind == 11:
        return ~a
    b = make_mask(src, q_len, kv_len, batch, heads, depth + 1)
    return (a & b) if kind == 12 else (a | b) if kind == 13 else ~(a | ~b)


def qkv(src, batch, sq, skv, heads, kv_heads, dk, dv, dtype, nonfinite, thd=False):
    if thd:
        shapes = [(sq, heads, dk), (skv, kv_heads, dk), (skv, kv_heads, dv)]
    else:
        shapes = [(batch, sq, heads, dk), (batch, skv, kv_heads, dk), (batch, skv, kv_heads, dv)]
    if src.int(0, 15) == 0:  # a wrong rank or a mismatched dim
        shapes[src.int(0, 2)] = src.pick([(sq, dk), (batch, sq + 1, heads, dk), (batch, skv, heads + 1, dv + 1)])
    return [src.array(s, dtype, nonfinite) for s in shapes]


def fuzz_attention(src):
    batch, sq, skv = src.int(1, 2), src.int(1, 24), src.int(1, 24)
    kv_heads = src.int(1, 2)
    heads = kv_heads * src.int(1, 3)
    dk, dv = src.pick([1, 3, 8, 16, 17, 32]), src.pick([1, 3, 8, 16])
    dtype = src.dtype()
    nonfinite = src.int(0, 7) == 0
    thd = src.int(0, 3) == 0
    q, k, v = qkv(src, batch, sq, skv, heads, kv_heads, dk, dv, dtype, nonfinite, thd)
    kw = {}
    if thd:
        cuts = sorted(src.int(0, sq) for _ in range(src.int(0, 3)))
        kw["cu_seqlens"] = np.array([0] + cuts + [sq if src.int(0, 7) else sq + 1], dtype=np.int32)
        if skv != sq or src.bool():
            kw["cu_seqlens_kv"] = np.array([0] + [min(c, skv) for c in cuts] + [skv], dtype=np.int32)
        mask_batch = len(kw["cu_seqlens"]) - 1
    else:
        mask_batch = batch
        if src.int(0, 3) == 0:
            kw["segment_ids"] = src.ints((batch, sq), 0, 3)
            if skv != sq or src.bool():
                kw["kv_segment_ids"] = src.ints((batch, skv), 0, 3)
            if src.bool():
                kw["positions"] = src.ints((batch, sq), -1, 20)
    mask = make_mask(src, sq, skv, mask_batch, heads) if src.int(0, 3) else None
    if src.bool():
        kw["scale"] = src.pick([0.5, 0.125, 2.0, 0.0, -1.0, float("nan"), float("inf")])
    if src.bool():
        kw["softcap"] = src.pick([0.0, 5.0, 30.0, -1.0, float("inf"), float("nan")])
    if src.int(0, 3) == 0:
        sinks = src.array((src.pick([heads, heads, heads + 1, 1]),), np.float32, src.int(0, 3) == 0)
        kw["sinks"] = sinks
    if src.bool():
        kw["threads"] = src.pick([1, 2, 0, None, -1, 2**32 + 1, 2**63 - 1])
    out, lse = seqattn.attention(q, k, v, mask, **kw)
    assert out.shape[:-1] == q.shape[:-1] and out.shape[-1] == v.shape[-1], (out.shape, q.shape, v.shape)
    if not nonfinite and "sinks" not in kw and kw.get("scale", 1.0) == kw.get("scale", 1.0):
        # Finite inputs, finite scale / softcap: a finite result.
        if all(np.isfinite(x) for x in [kw.get("scale", 1.0), kw.get("softcap", 0.0)]):
            assert np.all(np.isfinite(np.asarray(out, dtype=np.float32))), "NaN/inf out from finite inputs"
    if src.bool():
        kw.pop("sinks", None)
        dout = src.array(out.shape, out.dtype, nonfinite)
        dq, dk_, dv_ = seqattn.attention_backward(q, k, v, out, lse, dout, mask, **kw)
        assert dq.shape == q.shape and dk_.shape == k.shape and dv_.shape == v.shape


def lengths(src):
    return src.size(0, 48), src.size(0, 48)


def fuzz_mask_representations(src):
    batch, heads = src.int(1, 2), src.int(1, 3)
    q_len, kv_len = src.int(0, 40), src.int(0, 40)
    mask = make_mask(src, q_len, kv_len, batch, heads)
    which = src.int(0, 7)
    ql, kl = (q_len, kv_len) if src.int(0, 7) else lengths(src)
    kw = {}
    if src.bool():
        kw["batch"] = src.pick([batch, 1, 0, -1, batch + 1])
    if src.bool():
        kw["heads"] = src.pick([heads, 1, 0, -1, 2**17])
    if which == 0:
        dense = seqattn.to_dense(mask, ql, kl, **kw)
        assert dense.dtype == np.bool_
        if ql and kl and dense.size:
            b, h = src.int(0, dense.shape[0] - 1), src.int(0, dense.shape[1] - 1)
            q, kv = src.int(0, min(ql, dense.shape[2]) - 1), src.int(0, min(kl, dense.shape[3]) - 1)
            assert bool(dense[b, h, q, kv]) == bool(mask.allowed(q, kv, q_len=ql, kv_len=kl, batch=b, head=h))
    elif which == 1:
        seqattn.to_additive(mask, ql, kl, **kw)
    elif which == 2:
        seqattn.pack_bits(mask, ql, kl, **kw)
    elif which == 3:
        block = (src.pick([1, 7, 16, 64, 128, 0, -1]), src.pick([1, 9, 16, 64, 128, 0, 2**17]))
        bm = seqattn.block_mask(mask, ql, kl, block_size=block, store_tile_bits=src.bool(), **kw)
        classes = bm.classes()
        assert classes.ndim == 4
        if src.bool():
            seqattn.to_ascii(bm)
    elif which == 4:
        seqattn.to_ascii(mask, min(ql, 64) if ql >= 0 else ql, min(kl, 64) if kl >= 0 else kl)
    elif which == 5:
        block = src.pick([(8, 8), (16, 16), (4, 8), (16, 32), (0, 8)])
        bm = None
        if src.bool():
            bm = seqattn.block_mask(mask, ql, kl, block_size=block, heads=heads)
        seqattn.splash.mask_info(bm if bm is not None else mask, block[0], block[1],
                                 q_len=None if bm is not None else ql, kv_len=None if bm is not None else kl,
                                 heads=heads if src.bool() else None, is_dkv=src.bool(),
                                 head_shards=src.pick([1, 1, heads, 2, 0]), q_seq_shards=src.pick([1, 1, 2, 0]),
                                 shrink_grid=src.bool(), downcast_smem_data=src.bool())
    elif which == 7:
        fuzz_pallas_layout(src, mask, q_len, kv_len, batch, heads)
    elif seqattn_torch is not None:
        block = src.pick([16, 32, 128, (16, 32), (128,), (0, 16)])
        B, H = src.pick([batch, None, 1, 2**16, 0]), src.pick([heads, None, 1, 2**17, 0])
        arrays = seqattn_torch.block_mask_arrays(mask, B, H, ql, kl, block,
                                                 separate_full_blocks=src.bool(), compute_q_blocks=src.bool())
        assert isinstance(arrays, dict)


def fuzz_pallas_layout(src, mask, q_len, kv_len, batch, heads):
    # Valid choices first and more often, so that most inputs get past the argument checks.
    block = src.pick([8, 16, 64, 8, 16, 128, 0, -1, 2**17])
    kw = {"heads": src.pick([heads, heads, None, 0, 2**17]), "block_q": block, "block_kv": src.pick([block, 8, 32])}
    shape = src.int(0, 2)
    if shape == 1:  # ragged BSHD: lengths of the mask's own batch, sometimes past the padded ones
        kw["q_lens"] = [src.pick([q_len, q_len // 2, 0, q_len + 1, -1]) for _ in range(batch)]
        kw["kv_lens"] = [src.pick([kv_len, kv_len // 3, 0, kv_len + 1]) for _ in range(batch)]
    elif shape == 2:  # packed THD: offsets that may decrease or run past the stream
        cu = [0]
        for _ in range(batch):
            cu.append(cu[-1] + src.pick([q_len, q_len, 0, 1, -1]))
        kw["cu_seqlens"] = cu
    padded_q = src.pick([max(1, q_len) * batch, max(1, q_len) * batch + 5, q_len, 0, -1, HOSTILE_SIZES[2]])
    padded_kv = src.pick([None, max(1, kv_len) * batch, max(1, kv_len) * batch + 3, kv_len])
    layout = seqattn.pallas.static_layout(mask, padded_q, padded_kv, **kw)
    seqattn.pallas.validate(layout)
    table = src.ints((batch, src.int(0, 3)), -1, 5)
    seqattn.pallas.page_table(table, src.ints((src.pick([batch, batch, batch + 1]),), -1, 300),
                              num_pages=src.pick([5, 5, 0, 2**40]), block_kv=src.pick([128, 128, 0]),
                              page_size=src.pick([None, None, 128, 64]))


def fuzz_jax(src):
    if seqattn_jax is None:
        return
    batch, sq, skv = src.int(1, 2), src.int(1, 16), src.int(1, 16)
    kv_heads = src.int(1, 2)
    heads = kv_heads * src.int(1, 2)
    dk, dv = src.pick([1, 8, 16]), src.pick([1, 8])
    dtype = src.pick([np.float32, np.float32, BF16 or np.float32, np.float16])
    q, k, v = qkv(src, batch, sq, skv, heads, kv_heads, dk, dv, dtype, src.int(0, 7) == 0)
    kw = {}
    if src.int(0, 3) == 0:
        kw["segment_ids"] = src.pick([src.ints((batch, sq), 0, 3), np.array([[1] * sq] * batch, np.int64) * (2**32 + 1)])
    if src.bool():
        kw["threads"] = src.pick([1, 2, 2**32 + 1, -1])
    if src.bool():
        kw["softcap"] = src.pick([0.0, 5.0, -1.0, float("nan")])
    mask = make_mask(src, sq, skv, batch, heads, 2) if src.bool() else None
    out = seqattn_jax.attention(q, k, v, mask, return_lse=src.bool(), **kw)
    jax.block_until_ready(out)


def fuzz_descriptors(src):
    batch, seq = src.int(1, 3), src.int(1, 32)
    ids = src.ints((batch, seq), -1, 4)
    pos = src.ints((batch, seq), -1, 20) if src.bool() else None
    desc = seqattn.SequenceDescriptor.from_segment_ids_and_pos(ids, pos)
    mask_type = src.pick(["padding", "causal", "padding_causal", "causal_bottom_right", "no_mask", "bogus"])
    layout = src.pick(["bshd", "thd", "sbhd", "t3hd", "nope"])
    result = desc.get_seqlens_and_offsets(mask_type, layout, max_segments_per_seq=src.pick([1, 2, 4, 0, -1]))
    if src.bool():
        seqattn.pack_segments(result, seq_len=src.pick([None, seq, 1, 0, -1]))


TARGETS = [fuzz_attention, fuzz_attention, fuzz_mask_representations, fuzz_mask_representations, fuzz_jax,
           fuzz_descriptors]


def TestOneInput(data):
    src = Src(data)
    target = TARGETS[src.int(0, len(TARGETS) - 1)]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            target(src)
    except ACCEPTABLE as e:
        if not str(e):
            raise AssertionError(f"{type(e).__name__} without a message from {target.__name__}") from e
    except Exception as e:  # noqa: BLE001 - anything else is a finding unless tolerated
        if type(e).__name__ not in TOLERATE:
            raise


def main():
    atheris.Setup(sys.argv, TestOneInput)
    atheris.Fuzz()


if __name__ == "__main__":
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    main()
