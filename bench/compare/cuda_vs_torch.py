#!/usr/bin/env python3
"""PyTorch's GPU attention kernels on the shapes seqattn's CUDA benchmarks use.

Measures, per shape, SDPA pinned to one backend at a time (flash, cuDNN,
memory-efficient) and torch.compile'd flex_attention with a block mask, forward
and (every shape but decode) backward, plus the GPU's dense bf16 matmul rate and
device-to-device copy bandwidth as ceilings.

  /opt/torch/.venv/bin/python3 bench/compare/cuda_vs_torch.py --json results_torch.json
  python3 bench/compare/cuda_vs_torch.py --dry-run     # CPU, shrunken shapes, logic check only
  python3 bench/compare/cuda_vs_torch.py --list        # the shapes below as JSON
  ... --no-backward                                     # forward only

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

Backward (bwd_ms, bwd_tflops, bwd_note in each row; not for decode): the row's
forward runs once on fresh requires_grad copies of q, k, v, outside the timing;
then torch.autograd.grad(out, (q, k, v), grad_out, retain_graph=True) is timed
as above (its first call, where flex compiles its backward, is outside the
timing and reported in bwd_note). The gradient tensors it allocates are timed,
as in FlashAttention's benchmarks. Backward FLOPs are counted as FlashAttention's
benchmarks count them: 2.5x the forward's useful FLOPs (five matmuls, QK^T
recomputed, dO V^T, P^T dO, dS K, dS^T Q, to the forward's two), so the
backward TFLOP/s compare with bench/cuda/bench_cuda.cu's. A backward that fails
leaves the forward numbers and says "failed: ..." in bwd_note.
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

    def backward_flops(self):
        """FlashAttention's convention: the backward's five matmuls to the forward's two."""
        return 2.5 * self.useful_flops()

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


# The backward fields of a row that has no backward measurement.
NO_BACKWARD = dict(bwd_ms=None, bwd_tflops=None, bwd_note="")


def measure_ceilings(device, args):
    """Dense bf16 matmul rate and copy bandwidth: what the attention rows compare against."""
    rows = []
    n = 512 if args.dry_run else 8192
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    ms = time_ms(lambda: torch.matmul(a, b), args.warmup, args.iters, device)
    rows.append(dict(shape="peak-matmul-%d" % n, impl="torch.matmul bf16", ms=ms,
                     tflops=2 * n ** 3 / ms / 1e9, gbps=None, note="n=m=k=%d" % n, **NO_BACKWARD))
    del a, b
    size = (16 if args.dry_run else 2048) << 20
    src = torch.empty(size, device=device, dtype=torch.uint8).fill_(1)
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src), args.warmup, args.iters, device)
    rows.append(dict(shape="peak-hbm-copy", impl="Tensor.copy_", ms=ms, tflops=None,
                     gbps=2 * size / ms / 1e6, note="%d MiB, read+write counted" % (size >> 20),
                     **NO_BACKWARD))
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

    def guarded(fn):
        """(fn(), None), or (None, "failed: why") when fn raises."""
        # SDPA's exception only says "no viable backend"; the reason is in its warnings.
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                return fn(), None
            except Exception as exc:  # one broken backend must not end the run
                reasons = [first_line(exc)] + [first_line(w.message) for w in caught
                                               if "flex_attention called without" not in str(w.message)]
                return None, "failed: " + " | ".join(dict.fromkeys(reasons))[:400]

    def time_backward(fn, inputs, warmup):
        """(median ms, None, seconds of the first forward + backward) of the backward of
        fn(*inputs), or (None, "failed: why", None)."""
        leaves = [t.detach().requires_grad_() for t in inputs]

        def first_call():
            out = fn(*leaves)  # the forward, once, outside the timing
            grad_out = torch.randn(out.shape, device=device, dtype=out.dtype, generator=gen)

            def grad():
                return torch.autograd.grad(out, leaves, grad_out, retain_graph=True)

            grad()  # flex compiles its backward here
            if device.type == "cuda":
                torch.cuda.synchronize()
            return grad

        start = time.perf_counter()
        grad, failure = guarded(first_call)
        if failure:
            return None, failure, None
        first_s = time.perf_counter() - start
        ms, failure = guarded(lambda: time_ms(grad, warmup, args.iters, device))
        return ms, failure, first_s

    def record(impl, fn, inputs, note="", warmup=None, compiled=False):
        """Times fn(*inputs) and, unless decode or --no-backward, its backward into one row
        (compiled: bwd_note gives the first forward + backward call's time, compilation
        included). On a forward failure the row's note says why and False is returned."""
        warmup = warmup or args.warmup
        ms, failure = guarded(lambda: time_ms(lambda: fn(*inputs), warmup, args.iters, device))
        if failure:
            rows.append(dict(shape=shape.name, impl=impl, ms=None, tflops=None, gbps=None,
                             note=failure + ("; " + note if note else ""), **NO_BACKWARD))
            return False
        row = dict(shape=shape.name, impl=impl, ms=ms, tflops=shape.useful_flops() / ms / 1e9,
                   gbps=shape.io_bytes() / ms / 1e6 if decode else None, note=note, **NO_BACKWARD)
        if decode:
            row["bwd_note"] = "n/a: decode"
        elif not args.backward:
            row["bwd_note"] = "skipped: --no-backward"
        else:
            bwd_ms, failure, first_s = time_backward(fn, inputs, warmup)
            row["bwd_note"] = failure or ("first fwd+bwd call %.1fs" % first_s if compiled else "")
            if bwd_ms is not None:
                row.update(bwd_ms=bwd_ms, bwd_tflops=shape.backward_flops() / bwd_ms / 1e9)
        rows.append(row)
        return True

    # SDPA: causal uses is_causal; document/window masks go in as a dense boolean attn_mask.
    attn_mask = dense_mask(shape, mask_mod, device) if shape.mask in ("documents", "window") else None
    for backend, impl in ((SDPBackend.FLASH_ATTENTION, "sdpa-flash"),
                          (SDPBackend.CUDNN_ATTENTION, "sdpa-cudnn"),
                          (SDPBackend.EFFICIENT_ATTENTION, "sdpa-efficient")):
        if attn_mask is not None and backend == SDPBackend.FLASH_ATTENTION:
            rows.append(dict(shape=shape.name, impl=impl, ms=None, tflops=None, gbps=None,
                             note="n/a: flash SDPA takes no attn_mask",
                             **dict(NO_BACKWARD, bwd_note="n/a: flash SDPA takes no attn_mask")))
            continue
        kwargs = dict(is_causal=shape.mask == "causal", attn_mask=attn_mask)
        note = "dense bool attn_mask" if attn_mask is not None else ""

        def sdpa(qq, kk, vv, extra=None, backend=backend, kwargs=kwargs):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(qq, kk, vv, **kwargs, **(extra or {}))

        if not gqa:
            record(impl, sdpa, (q, k, v), note)
            continue
        # GQA: prefer enable_gqa (torch >= 2.5, no copy); if this backend refuses it,
        # fall back to K/V repeated per query head (expanded once, outside the timing;
        # a backward then yields the gradients of the repeated K/V).
        if not record(impl, lambda qq, kk, vv: sdpa(qq, kk, vv, extra={"enable_gqa": True}), (q, k, v),
                      "enable_gqa=True"):
            refusal = rows.pop()["note"].removeprefix("failed: ").removesuffix("; enable_gqa=True")
            group = shape.heads // shape.kv_heads
            k_rep, v_rep = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
            record(impl, sdpa, (q, k_rep, v_rep),
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
        record("flex", lambda qq, kk, vv: flex(qq, kk, vv, block_mask=block_mask, **extra), (q, k, v), note,
               warmup=max(3, args.warmup), compiled=True)
    except Exception as exc:  # block-mask creation or compilation failed
        rows.append(dict(shape=shape.name, impl="flex", ms=None, tflops=None, gbps=None,
                         note="failed: " + first_line(exc)[:400], **NO_BACKWARD))
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
    parser.add_argument("--no-backward", dest="backward", action="store_false",
                        help="time the forward only")
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
    print("backward TFLOP/s count 2.5x the forward's useful FLOPs (FlashAttention's convention)")

    rows = measure_ceilings(device, args)
    for shape in shapes:
        rows += run_shape(shape, device, args, flex)
        if device.type == "cuda":
            torch.cuda.empty_cache()

    print("\n| shape | impl | ms | TFLOP/s | GB/s | bwd ms | bwd TFLOP/s | note |\n"
          "|---|---|---:|---:|---:|---:|---:|---|")
    for r in rows:
        notes = [r["note"]] + (["bwd: " + r["bwd_note"]] if r["bwd_note"] not in ("", r["note"]) else [])
        print("| %s | %s | %s | %s | %s | %s | %s | %s |" % (
            r["shape"], r["impl"], fmt(r["ms"], 3), fmt(r["tflops"], 1), fmt(r["gbps"], 0),
            fmt(r["bwd_ms"], 3), fmt(r["bwd_tflops"], 1), "; ".join(n for n in notes if n)))
    with open(args.json, "w") as out:
        json.dump(dict(gpu=gpu, torch=torch.__version__, iters=args.iters,
                       bwd_flops_convention="2.5x forward useful FLOPs",
                       shapes=[dataclasses.asdict(s) for s in shapes], results=rows), out, indent=2)
    print("\nwrote %s" % args.json)


if __name__ == "__main__":
    main()
