"""seqattn.torch.attention against PyTorch's SDPA and compiled flex_attention on the CPU, in one run.

Shapes (B = 1, --heads heads, d = --dim, [B, H, S, D] torch tensors), with N = --tokens (default 4096):
  causal N                 causal over N tokens
  16 documents in 2N       16 causal documents of 2N / 16 tokens each (seqattn: segment_ids tensor)
  window N/4 over 2N       causal sliding window of N / 4 keys
fp32 and bf16; forward (under torch.no_grad) and forward + backward (out.backward(dout) into q, k, v).
SDPA gets is_causal for the causal row and a dense boolean [2N, 2N] mask for the others (it has no
document or window kernel); flex_attention runs under torch.compile with the BlockMask that
seqattn.torch.block_mask exports (compilation excluded from the times) and forward only: torch has no
flex_attention backward on the CPU. FLOPs as bench/attention.cpp counts them: 2 * (dk + dv) per allowed
(head, query, key) pair forward, 2.5 times that for the backward (forward + backward: 3.5 times).

The limits, measured here in the same run (bench_attention.py's helpers): NumPy's sgemm 2048^3 and the
streaming-read rate on --threads threads. Times are the best of --repeat after a warm-up call.

  python bench/python/bench_torch_op.py [--threads 2] [--tokens 4096] [--heads 8] [--dim 128] [--no-flex]
"""

import argparse
import os

import numpy as np
import torch
import torch.nn.attention.flex_attention as fa
import torch.nn.functional as F

import seqattn
import seqattn.torch as st

from bench_attention import best_of, cpu_name, read_gbps, sgemm_gflops


def cases(n):
    """(name, tokens, seqattn mask, segment-id tensor or None, mask exported to flex, dense mask or None, pairs)."""
    causal = seqattn.CausalMask()
    out = [(f"causal {n}", n, causal, None, causal, None, n * (n + 1) // 2)]
    s, doc = 2 * n, 2 * n // 16
    ids = np.repeat(np.arange(1, 17, dtype=np.int32), doc)[None, :]
    rows = np.arange(s)
    dense_docs = (ids[0][:, None] == ids[0][None, :]) & (rows[None, :] <= rows[:, None])
    out.append((f"16 documents in {s}", s, causal, torch.from_numpy(ids), seqattn.DocumentMask(ids, inner=causal),
                torch.from_numpy(dense_docs), 16 * doc * (doc + 1) // 2))
    w = n // 4
    window = seqattn.SlidingWindowMask(w, 0)
    dense_window = (rows[None, :] <= rows[:, None]) & (rows[:, None] - rows[None, :] <= w)
    out.append((f"window {w} over {s}", s, window, None, window, torch.from_numpy(dense_window),
                int(np.minimum(rows, w).sum()) + s))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-flex", action="store_true", help="skip compiled flex_attention (its compilation is slow)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    gemm, read = sgemm_gflops(), read_gbps(args.threads)
    print(f"{cpu_name()}, {os.cpu_count()} CPUs; torch {torch.__version__}, seqattn {seqattn.__version__} "
          f"(SIMD target {seqattn.simd_target}); {args.threads} threads; B = 1, H = {args.heads}, d = {args.dim}")
    print(f"limits: NumPy sgemm 2048^3 {gemm:.1f} GFLOP/s; NumPy streaming read {read:.1f} GB/s\n")
    print("| case | dtype | pass | seqattn ms | GFLOP/s | of sgemm | SDPA ms | GFLOP/s | flex (compiled) ms | GFLOP/s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    h, d = args.heads, args.dim
    flex = None if args.no_flex else torch.compile(fa.flex_attention, dynamic=False)
    g = torch.Generator().manual_seed(0)
    for name, s, mask, ids, export, dense, pairs in cases(args.tokens):
        block_mask = None if flex is None else st.block_mask(export, 1, h, s, s)
        for dtype in (torch.float32, torch.bfloat16):
            q, k, v = (torch.randn(1, h, s, d, generator=g).to(dtype) for _ in range(3))
            dout = torch.randn(1, h, s, d, generator=g).to(dtype)

            def ours(q, k, v):
                return st.attention(q, k, v, mask, segment_ids=ids, threads=args.threads)

            def sdpa(q, k, v):
                if dense is None:
                    return F.scaled_dot_product_attention(q, k, v, is_causal=True)
                return F.scaled_dot_product_attention(q, k, v, attn_mask=dense)

            fwd_flops = 2 * (d + d) * h * pairs
            for pass_name, flops in (("fwd", fwd_flops), ("fwd+bwd", 3.5 * fwd_flops)):
                backward = pass_name == "fwd+bwd"

                def timed(fn):
                    if backward:
                        qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))
                        return best_of(lambda: fn(qg, kg, vg).backward(dout), args.repeat)
                    with torch.no_grad():
                        return best_of(lambda: fn(q, k, v), args.repeat)

                t_ours, t_sdpa = timed(ours), timed(sdpa)
                if flex is None or backward:
                    flex_cells = "- | -" if flex is None else "n/a (no CPU backward) | -"
                else:
                    t_flex = timed(lambda q, k, v: flex(q, k, v, block_mask=block_mask))
                    flex_cells = f"{t_flex * 1e3:.1f} | {flops / t_flex / 1e9:.1f}"
                rate = flops / t_ours / 1e9
                print(f"| {name} | {str(dtype).removeprefix('torch.')} | {pass_name} | {t_ours * 1e3:.1f} | "
                      f"{rate:.1f} | {rate / gemm:.2f} | {t_sdpa * 1e3:.1f} | {flops / t_sdpa / 1e9:.1f} | "
                      f"{flex_cells} |", flush=True)


if __name__ == "__main__":
    main()
