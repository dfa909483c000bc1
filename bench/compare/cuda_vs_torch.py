#!/usr/bin/env python3
"""PyTorch's GPU attention kernels on the shapes seqattn's CUDA benchmarks use.

Measures, per shape, SDPA pinned to one backend at a time (flash, cuDNN,
memory-efficient) and torch.compile'd flex_attention with a block mask, plus the
GPU's dense bf16 matmul rate and device-to-device copy bandwidth as ceilings.

  /opt/torch/.venv/bin/python3 bench/compare/cuda_vs_torch.py --json results_torch.json
  python3 bench/compare/cuda_vs_torch.py --dry-run     # CPU, shrunken shapes, logic check only
  python3 bench/compare/cuda_vs_torch.py --list        # the shapes below as JSON

Shapes (bf16, head dim d = 128, layout (batch, heads, tokens, d), scale 1/sqrt(d)).
Query i may see key j iff (0-based positions, queries and keys start together):
  causal-4k      B=1 q=kv=4096   H=32 KVH=32  causal:    j <= i
  causal-16k     B=1 q=kv=16384  H=32 KVH=32  causal:    j <= i
  docs-16x512    B=1 q=kv=8192   H=32 KVH=32  documents: j <= i and i//512 == j//512 (16 equal docs)
  window-1k-16k  B=1 q=kv=16384  H=32 KVH=32  window:    i-1024 < j <= i (1024 keys including i)
  decode-32k-b1  B=1 q=1 kv=32768 H=32 KVH=4  full:      every key (GQA: query head h reads KV head h//8)
  decode-32k-b8  B=8 q=1 kv=32768 H=32 KVH=4  full
Useful FLOPs = 4 * d * allowed (i, j) pairs * H * B (QK^T and PV, 2 flops per MAC);
kernels that compute masked-out tiles are not credited for them. Decode GB/s counts
K, V, q and out bytes once each. Masked SDPA rows get a dense (q, kv) boolean attn_mask,
built outside the timed loop, as SDPA users must; SDPA's own per-call conversion of it
to an additive bias is timed. Flash SDPA takes no mask, so those rows are n/a.
GQA SDPA uses enable_gqa=True; a backend that refuses it is re-run on K/V expanded with
repeat_interleave outside the timing, and the note says so. flex_attention runs
torch.compile'd (first call = compile, reported in the note), block masks from
create_block_mask (default 128 blocks) built outside the timing; the document mask
looks up a per-token document-id tensor. A failing implementation becomes a
"failed: ..." note, never an abort. Timing: CUDA events per call, --warmup calls
(default 3) first, median of --iters (default 20).
"""
import argparse
import dataclasses
import json
import statistics
import time
import warnings

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

HEAD_DIM = 128


@dataclasses.dataclass
class Shape:
    name: str
    q_len: int
    kv_len: int
    heads: int
    kv_heads: int
    batch: int
    mask: str  # "causal", "documents", "window" or "full"
    params: dict = dataclasses.field(default_factory=dict)  # doc_len / window

    def allowed_pairs(self):
        """Allowed (query, key) pairs for one head of one sequence, in closed form."""
        n = self.q_len
        if self.mask == "full":
            return self.q_len * self.kv_len
        assert self.q_len == self.kv_len, "masked shapes are square"
        if self.mask == "causal":
            return n * (n + 1) // 2
        if self.mask == "documents":
            length = self.params["doc_len"]
            assert n % length == 0
            return (n // length) * length * (length + 1) // 2
        if self.mask == "window":
            w = self.params["window"]
            # Query i sees min(i + 1, w) keys.
            return n * (n + 1) // 2 if n <= w else w * (w + 1) // 2 + (n - w) * w
        raise ValueError(self.mask)

    def useful_flops(self):
        return 4 * HEAD_DIM * self.allowed_pairs() * self.heads * self.batch

    def io_bytes(self):
        """K and V read plus q read and out written, bf16."""
        kv = 2 * self.batch * self.kv_heads * self.kv_len * HEAD_DIM
        qo = 2 * self.batch * self.heads * self.q_len * HEAD_DIM
        return 2 * (kv + qo)


SHAPES = [
    Shape("causal-4k", 4096, 4096, 32, 32, 1, "causal"),
    Shape("causal-16k", 16384, 16384, 32, 32, 1, "causal"),
    Shape("docs-16x512", 8192, 8192, 32, 32, 1, "documents", {"doc_len": 512}),
    Shape("window-1k-16k", 16384, 16384, 32, 32, 1, "window", {"window": 1024}),
    Shape("decode-32k-b1", 1, 32768, 32, 4, 1, "full"),
    Shape("decode-32k-b8", 1, 32768, 32, 4, 8, "full"),
]


def shrink(shape, factor):
    """A smaller copy of a shape for --dry-run on CPU (same mask semantics)."""
    params = {k: max(1, v // factor) for k, v in shape.params.items()}
    q_len = shape.q_len if shape.q_len == 1 else shape.q_len // factor
    return dataclasses.replace(shape, q_len=q_len, kv_len=shape.kv_len // factor, params=params)


def mask_mod_for(shape, device):
    """flex_attention mask_mod (b, h, q_idx, kv_idx) -> bool; None for full attention.
    Written with tensor ops only, so it also broadcasts to build a dense mask."""
    if shape.mask == "causal":
        return lambda b, h, q, kv: q >= kv
    if shape.mask == "documents":
        # A document-id lookup table rather than arithmetic, as real packed batches have.
        doc_id = torch.arange(shape.kv_len, device=device) // shape.params["doc_len"]
        return lambda b, h, q, kv: (q >= kv) & (doc_id[q] == doc_id[kv])
    if shape.mask == "window":
        window = shape.params["window"]
        return lambda b, h, q, kv: (q >= kv) & (q - kv < window)
    return None


def dense_mask(shape, mask_mod, device):
    q = torch.arange(shape.q_len, device=device)[:, None]
    kv = torch.arange(shape.kv_len, device=device)[None, :]
    return mask_mod(None, None, q, kv)


def time_ms(fn, warmup, iters, device):
    """Median milliseconds of fn() after warmup calls; CUDA events on GPU."""
    for _ in range(warmup):
        fn()
    if device.type != "cuda":
        samples = []
        for _ in range(iters):
            start = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - start) * 1e3)
        return statistics.median(samples)
    torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(iters)]
    for start, end in events:
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in events)


def measure_ceilings(device, args):
    """Dense bf16 matmul rate and copy bandwidth: what the attention rows compare against."""
    rows = []
    n = 512 if args.dry_run else 8192
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    ms = time_ms(lambda: torch.matmul(a, b), args.warmup, args.iters, device)
    rows.append(dict(shape="peak-matmul-%d" % n, impl="torch.matmul bf16", ms=ms,
                     tflops=2 * n ** 3 / ms / 1e9, gbps=None, note="n=m=k=%d" % n))
    del a, b
    size = (16 if args.dry_run else 2048) << 20
    src = torch.empty(size, device=device, dtype=torch.uint8).fill_(1)
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src), args.warmup, args.iters, device)
    rows.append(dict(shape="peak-hbm-copy", impl="Tensor.copy_", ms=ms, tflops=None,
                     gbps=2 * size / ms / 1e6, note="%d MiB, read+write counted" % (size >> 20)))
    return rows


def run_shape(shape, device, args, flex):
    """Returns result rows for every implementation on one shape; failures become notes."""
    rows = []
    gen = torch.Generator(device=device).manual_seed(0)

    def rand(heads, length):
        return torch.randn(shape.batch, heads, length, HEAD_DIM, device=device,
                           dtype=torch.bfloat16, generator=gen)

    q = rand(shape.heads, shape.q_len)
    k = rand(shape.kv_heads, shape.kv_len)
    v = rand(shape.kv_heads, shape.kv_len)
    gqa = shape.heads != shape.kv_heads
    mask_mod = mask_mod_for(shape, device)
    decode = shape.q_len == 1

    def record(impl, fn, note="", warmup=None):
        """Times fn into a row; on failure the row's note says why and False is returned."""
        # SDPA's exception only says "no viable backend"; the reason is in its warnings.
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                ms = time_ms(fn, warmup or args.warmup, args.iters, device)
            except Exception as exc:  # one broken backend must not end the run
                reasons = [first_line(exc)] + [first_line(w.message) for w in caught
                                               if "flex_attention called without" not in str(w.message)]
                rows.append(dict(shape=shape.name, impl=impl, ms=None, tflops=None, gbps=None,
                                 note="failed: " + " | ".join(dict.fromkeys(reasons))[:400]
                                 + ("; " + note if note else "")))
                return False
        rows.append(dict(shape=shape.name, impl=impl, ms=ms,
                         tflops=shape.useful_flops() / ms / 1e9,
                         gbps=shape.io_bytes() / ms / 1e6 if decode else None, note=note))
        return True

    # SDPA: causal uses is_causal; document/window masks go in as a dense boolean attn_mask.
    attn_mask = dense_mask(shape, mask_mod, device) if shape.mask in ("documents", "window") else None
    for backend, impl in ((SDPBackend.FLASH_ATTENTION, "sdpa-flash"),
                          (SDPBackend.CUDNN_ATTENTION, "sdpa-cudnn"),
                          (SDPBackend.EFFICIENT_ATTENTION, "sdpa-efficient")):
        if attn_mask is not None and backend == SDPBackend.FLASH_ATTENTION:
            rows.append(dict(shape=shape.name, impl=impl, ms=None, tflops=None, gbps=None,
                             note="n/a: flash SDPA takes no attn_mask"))
            continue
        kwargs = dict(is_causal=shape.mask == "causal", attn_mask=attn_mask)
        note = "dense bool attn_mask" if attn_mask is not None else ""

        def sdpa(qq=q, kk=k, vv=v, extra=None, backend=backend, kwargs=kwargs):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(qq, kk, vv, **kwargs, **(extra or {}))

        if not gqa:
            record(impl, sdpa, note)
            continue
        # GQA: prefer enable_gqa (torch >= 2.5, no copy); if this backend refuses it,
        # fall back to K/V repeated per query head (expanded once, outside the timing).
        if not record(impl, lambda: sdpa(extra={"enable_gqa": True}), "enable_gqa=True"):
            refusal = rows.pop()["note"].removeprefix("failed: ").removesuffix("; enable_gqa=True")
            group = shape.heads // shape.kv_heads
            k_rep, v_rep = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
            record(impl, lambda: sdpa(q, k_rep, v_rep),
                   "repeat_interleave K/V (enable_gqa=True refused: %s)" % refusal)
            del k_rep, v_rep
    del attn_mask

    # flex_attention: block mask built once outside the timing (BLOCK_SIZE default 128).
    try:
        from torch.nn.attention.flex_attention import create_block_mask
        block_mask = None
        if mask_mod is not None:
            block_mask = create_block_mask(mask_mod, None, None, shape.q_len, shape.kv_len,
                                           device=str(device))
        extra = {"enable_gqa": True} if gqa else {}
        start = time.perf_counter()
        flex(q, k, v, block_mask=block_mask, **extra)  # first call compiles
        if device.type == "cuda":
            torch.cuda.synchronize()
        compile_s = time.perf_counter() - start
        note = ("compiled" if not args.dry_run else "eager") + ", first call %.1fs" % compile_s
        if gqa:
            note += ", enable_gqa=True"
        record("flex", lambda: flex(q, k, v, block_mask=block_mask, **extra), note,
               warmup=max(3, args.warmup))
    except Exception as exc:  # block-mask creation or compilation failed
        rows.append(dict(shape=shape.name, impl="flex", ms=None, tflops=None, gbps=None,
                         note="failed: " + first_line(exc)[:400]))
    return rows


def first_line(exc):
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def fmt(value, digits):
    return "-" if value is None else ("%.*f" % (digits, value))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="", help="comma-separated substrings of shape names")
    parser.add_argument("--iters", type=int, default=20, help="timed iterations (median)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--json", default="results_torch.json")
    parser.add_argument("--dry-run", action="store_true", help="CPU, shapes / 16, eager flex")
    parser.add_argument("--list", action="store_true", help="print the shapes as JSON and exit")
    args = parser.parse_args()

    if args.list:
        print(json.dumps([dict(dataclasses.asdict(s), head_dim=HEAD_DIM,
                               allowed_pairs_per_head=s.allowed_pairs()) for s in SHAPES], indent=2))
        return
    wanted = [w for w in args.shapes.split(",") if w]
    shapes = [s for s in SHAPES if not wanted or any(w in s.name for w in wanted)]

    if args.dry_run:
        device = torch.device("cpu")
        args.iters, args.warmup = min(args.iters, 2), 1
        shapes = [shrink(s, 16) for s in shapes]
        # The closed-form pair counts must match the masks the kernels are given.
        for s in shapes:
            mod = mask_mod_for(s, device)
            counted = s.q_len * s.kv_len if mod is None else int(dense_mask(s, mod, device).sum())
            assert counted == s.allowed_pairs(), (s.name, counted, s.allowed_pairs())
        from torch.nn.attention.flex_attention import flex_attention as flex
        warnings.filterwarnings("ignore", message="flex_attention called without")
        gpu = "cpu (dry run)"
    else:
        device = torch.device("cuda")
        from torch.nn.attention.flex_attention import flex_attention
        # One compiled graph per mask/size; keep dynamo from giving up and running eager.
        for knob in ("cache_size_limit", "recompile_limit"):
            if hasattr(torch._dynamo.config, knob):
                setattr(torch._dynamo.config, knob, 64)
        flex = torch.compile(flex_attention, dynamic=False)
        gpu = torch.cuda.get_device_name(device)
    print("device: %s, torch %s" % (gpu, torch.__version__))

    rows = measure_ceilings(device, args)
    for shape in shapes:
        rows += run_shape(shape, device, args, flex)
        if device.type == "cuda":
            torch.cuda.empty_cache()

    print("\n| shape | impl | ms | TFLOP/s | GB/s | note |\n|---|---|---:|---:|---:|---|")
    for r in rows:
        print("| %s | %s | %s | %s | %s | %s |" % (r["shape"], r["impl"], fmt(r["ms"], 3),
              fmt(r["tflops"], 1), fmt(r["gbps"], 0), r["note"]))
    with open(args.json, "w") as out:
        json.dump(dict(gpu=gpu, torch=torch.__version__, iters=args.iters,
                       shapes=[dataclasses.asdict(s) for s in shapes], results=rows), out, indent=2)
    print("\nwrote %s" % args.json)


if __name__ == "__main__":
    main()
