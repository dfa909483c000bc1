// backends::Cuda on the shapes of bench/compare/cuda_vs_torch.py, beside the
// GPU's own limits measured in the same run: cuBLAS bf16 GEMM (8192^3) for the
// dense tensor-core rate and a device-to-device copy for HBM bandwidth.
//
//   bench_cuda [--json FILE] [--iters N] [--shapes SUBSTRING] [--kv-splits N] [--no-limits] [--no-backward]
//              [--mma-sync]
//
// --mma-sync: prefill on the mma.sync kernel where the Hopper (wgmma) kernel
// would run, to compare the two in one run.
//
// Useful FLOPs = 4 * d * allowed (q, k) pairs * heads * batch, counted from
// the mask (masked tiles the kernel skips are not credited). Decode GB/s
// counts K, V, q and out once. bf16, d = 128, scale 1/sqrt(d).
//
// Backward (every shape but decode; --no-backward skips it): attention_backward
// alone is timed, on a plan made with PlanOptions::backward, after one forward
// call on that plan outside the timing. Its FLOPs are counted as FlashAttention's
// benchmarks count them, 2.5x the forward's useful FLOPs: the backward does five
// matmuls (S = QK^T again, dP = dO V^T, dV += P^T dO, dQ += dS K, dK += dS^T Q)
// to the forward's two, so its TFLOP/s compare directly with FlashAttention's
// and with bench/compare/cuda_vs_torch.py's backward rows. A backward that
// throws becomes a "failed: ..." bwd_note in the JSON; the forward rows stay.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <cublas_v2.h>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "seqattn/backends/cuda.cuh"
#include "seqattn/masks.hpp"

namespace {

using namespace seqattn;

float median_ms(const std::function<void()>& call, int iters) {
  cudaEvent_t a, b;
  cuda::check(cudaEventCreate(&a), "cudaEventCreate");
  cuda::check(cudaEventCreate(&b), "cudaEventCreate");
  for (int i = 0; i < 3; ++i) call();
  std::vector<float> ms;
  for (int i = 0; i < iters; ++i) {
    cuda::check(cudaEventRecord(a), "cudaEventRecord");
    call();
    cuda::check(cudaEventRecord(b), "cudaEventRecord");
    cuda::check(cudaEventSynchronize(b), "cudaEventSynchronize");
    float t = 0;
    cuda::check(cudaEventElapsedTime(&t, a, b), "cudaEventElapsedTime");
    ms.push_back(t);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::nth_element(ms.begin(), ms.begin() + ms.size() / 2, ms.end());
  return ms[ms.size() / 2];
}

void fill_random(bfloat16* dev, std::size_t n, unsigned seed) {
  std::vector<bfloat16> host(n);
  std::uint64_t s = seed;
  for (auto& x : host) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    x = bfloat16(static_cast<float>(static_cast<int>((s >> 40) % 2001) - 1000) / 1000.0f);
  }
  cuda::check(cudaMemcpy(dev, host.data(), n * sizeof(bfloat16), cudaMemcpyHostToDevice), "cudaMemcpy");
}

double gemm_tflops(int iters) {
  const int n = 8192;
  cuda::DeviceBuffer<bfloat16> a(std::size_t(n) * n), b(std::size_t(n) * n), c(std::size_t(n) * n);
  cublasHandle_t h;
  if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) throw std::runtime_error("cublasCreate failed");
  const float one = 1.0f, zero = 0.0f;
  const float ms = median_ms(
      [&] {
        cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, a.data(), CUDA_R_16BF, n, b.data(), CUDA_R_16BF, n,
                     &zero, c.data(), CUDA_R_16BF, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
      },
      iters);
  cublasDestroy(h);
  return 2.0 * n * double(n) * n / (ms * 1e-3) / 1e12;
}

double copy_gbps(int iters) {
  const std::size_t bytes = std::size_t(2) << 30;
  cuda::DeviceBuffer<char> a(bytes), b(bytes);
  const float ms = median_ms([&] { cudaMemcpyAsync(b.data(), a.data(), bytes, cudaMemcpyDeviceToDevice); }, iters);
  return 2.0 * double(bytes) / (ms * 1e-3) / 1e9;
}

struct Case {
  std::string name;
  index_t batch, q_len, kv_len, heads, kv_heads;
  std::string mask;  // causal, docs, window, full
  double pairs;      // allowed (q, k) pairs per head per sequence
};

struct Row {
  std::string name;
  double ms, tflops, gbps;
  std::string plan;
  // Backward: NaN (JSON null) when not measured; bwd_note says why.
  double bwd_ms = std::nan(""), bwd_tflops = std::nan("");
  std::string bwd_note;
};

// JSON text of a string (notes may carry exception messages) and of a number
// (NaN, a value not measured, becomes null).
std::string json_string(const std::string& s) {
  std::string quoted = "\"";
  for (const char ch : s) {
    if (ch == '"' || ch == '\\') {
      quoted += '\\';
      quoted += ch;
    } else if (static_cast<unsigned char>(ch) < 0x20) {
      quoted += ' ';
    } else {
      quoted += ch;
    }
  }
  return quoted + "\"";
}

std::string json_number(double x) { return std::isfinite(x) ? std::to_string(x) : "null"; }

Row run_case(const Case& c, int iters, const PlanOptions& options, bool backward, bool mma_sync) {
  const index_t d = 128;
  const std::size_t nq = std::size_t(c.batch * c.q_len * c.heads * d),
                    nkv = std::size_t(c.batch * c.kv_len * c.kv_heads * d);
  cuda::DeviceBuffer<bfloat16> q(nq), k(nkv), v(nkv), out(nq);
  cuda::DeviceBuffer<float> lse(std::size_t(c.batch * c.heads * c.q_len));
  fill_random(q.data(), nq, 1);
  fill_random(k.data(), nkv, 2);
  fill_random(v.data(), nkv, 3);
  const AttentionInputs<bfloat16> in{TensorView<const bfloat16>(q.data(), Extents{c.batch, c.q_len, c.heads, d}),
                                     TensorView<const bfloat16>(k.data(), Extents{c.batch, c.kv_len, c.kv_heads, d}),
                                     TensorView<const bfloat16>(v.data(), Extents{c.batch, c.kv_len, c.kv_heads, d})};
  const TensorView<bfloat16> o(out.data(), Extents{c.batch, c.q_len, c.heads, d});
  const TensorView<float> l(lse.data(), Extents{c.batch, c.heads, c.q_len});
  const AttentionShape shape = shape_of(in);
  std::vector<std::int32_t> ids;
  for (index_t b = 0; b < c.batch; ++b)
    for (index_t t = 0; t < c.q_len; ++t) ids.push_back(static_cast<std::int32_t>(t / 512));
  const bool decode = c.q_len == 1;
  // The backward of one mask on its own plan (PlanOptions::backward), so the
  // forward rows keep the plan they always had; out and lse come from one
  // forward call on that plan, outside the timing.
  auto time_backward = [&](const auto& mask, double forward_flops, Row& row) {
    PlanOptions backward_options = options;
    backward_options.backward = true;
    const auto plan = plan_attention<backends::Cuda>(shape, mask, backward_options);
    cuda::DeviceBuffer<bfloat16> dout(nq), dq(nq), dk(nkv), dv(nkv);
    fill_random(dout.data(), nq, 4);
    const TensorView<const bfloat16> dout_view(dout.data(), Extents{c.batch, c.q_len, c.heads, d});
    const AttentionGrads<bfloat16> grads{TensorView<bfloat16>(dq.data(), Extents{c.batch, c.q_len, c.heads, d}),
                                         TensorView<bfloat16>(dk.data(), Extents{c.batch, c.kv_len, c.kv_heads, d}),
                                         TensorView<bfloat16>(dv.data(), Extents{c.batch, c.kv_len, c.kv_heads, d})};
    attention_forward(plan, in, o, l, variants::Default{}, cuda::Stream{});
    row.bwd_ms = median_ms(
        [&] { attention_backward(plan, in, o, l, dout_view, grads, variants::Default{}, cuda::Stream{}); }, iters);
    row.bwd_tflops = 2.5 * forward_flops / (row.bwd_ms * 1e-3) / 1e12;
  };
  auto run_with = [&](const auto& mask) {
    const auto plan = plan_attention<backends::Cuda>(shape, mask, options);
    cuda::LaunchPlan& lp = plan.work().device->launch;
    if (mma_sync) lp.wgmma = false;
    const std::string desc = std::string(lp.decode  ? "decode"
                                         : lp.wgmma ? "wgmma"
                                                    : "mma.sync") +
                             ", grid " + std::to_string(lp.items.size()) + "x" + std::to_string(lp.head_groups) + "x" +
                             std::to_string(lp.kv_splits) + ", heads/cta " + std::to_string(lp.heads_per_cta);
    const float ms = median_ms([&] { attention_forward(plan, in, o, l, variants::Default{}, cuda::Stream{}); }, iters);
    const double flops = 4.0 * d * c.pairs * c.heads * c.batch;
    const double bytes = 2.0 * (2.0 * nkv + 2.0 * nq);
    Row row;
    row.name = c.name;
    row.ms = ms;
    row.tflops = flops / (ms * 1e-3) / 1e12;
    row.gbps = bytes / (ms * 1e-3) / 1e9;
    row.plan = desc;
    if (decode) {
      row.bwd_note = "n/a: decode";
    } else if (!backward) {
      row.bwd_note = "skipped: --no-backward";
    } else {
      // A backward that fails (it is the newer code path) must not cost the
      // forward rows of this run: it becomes the row's note.
      try {
        time_backward(mask, flops, row);
      } catch (const std::exception& e) {
        row.bwd_ms = row.bwd_tflops = std::nan("");
        row.bwd_note = std::string("failed: ") + e.what();
        std::fprintf(stderr, "bench_cuda: %s backward: %s\n", c.name.c_str(), e.what());
      }
    }
    return row;
  };
  if (c.mask == "causal") return run_with(CausalMask{});
  if (c.mask == "window") return run_with(SlidingWindowMask{1023, 0});
  if (c.mask == "full") return run_with(FullMask{});
  const DocumentLayout layout =
      DocumentLayout::from_segment_ids(TensorView<const std::int32_t>(ids.data(), Extents{c.batch, c.q_len}));
  return run_with(document_mask(layout, CausalMask{}));
}

}  // namespace

int main(int argc, char** argv) {
  std::string json, only;
  int iters = 20;
  bool limits = true, backward = true, mma_sync = false;
  PlanOptions options;  // --kv-splits N: force the split count (0: the planner's choice)
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--json") && i + 1 < argc)
      json = argv[++i];
    else if (!std::strcmp(argv[i], "--iters") && i + 1 < argc)
      iters = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--shapes") && i + 1 < argc)
      only = argv[++i];
    else if (!std::strcmp(argv[i], "--kv-splits") && i + 1 < argc)
      options.kv_splits = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--no-limits"))
      limits = false;
    else if (!std::strcmp(argv[i], "--no-backward"))
      backward = false;
    else if (!std::strcmp(argv[i], "--mma-sync"))
      mma_sync = true;
  }
  int devices = 0;
  if (const cudaError_t status = cudaGetDeviceCount(&devices); status != cudaSuccess || devices == 0) {
    // 77: CTest's bench.cuda.smoke reports Skipped, as the GPU test does.
    std::printf("SKIPPED: bench_cuda needs a CUDA device; cudaGetDeviceCount: %s\n",
                status == cudaSuccess ? "0 devices" : cudaGetErrorString(status));
    return 77;
  }
  // The JSON is written even when a case throws (a device run is short and
  // rare): the rows measured so far, and the error.
  std::string header, error;
  std::vector<std::string> results;
  try {
    cudaDeviceProp prop{};
    cuda::check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
    const double peak = limits ? gemm_tflops(iters) : 1.0, bw = limits ? copy_gbps(iters) : 1.0;
    std::printf("GPU: %s (%d SMs)\n", prop.name, prop.multiProcessorCount);
    if (limits) {
      std::printf("cuBLAS bf16 GEMM 8192^3: %.1f TFLOP/s; D2D copy: %.0f GB/s (read + write)\n", peak, bw);
    } else {
      std::printf("GEMM and copy limits not measured (--no-limits)\n");
    }
    std::printf("Backward TFLOP/s count 2.5x the forward's useful FLOPs (FlashAttention's convention).\n\n");
    auto tri = [](double n) { return n * (n + 1) / 2; };
    const std::vector<Case> cases{
        {"causal-4k", 1, 4096, 4096, 32, 32, "causal", tri(4096)},
        {"causal-16k", 1, 16384, 16384, 32, 32, "causal", tri(16384)},
        {"docs-16x512", 1, 8192, 8192, 32, 32, "docs", 16 * tri(512)},
        {"window-1k-16k", 1, 16384, 16384, 32, 32, "window", tri(1024) + (16384.0 - 1024) * 1024},
        {"decode-32k-b1", 1, 1, 32768, 32, 4, "full", 32768},
        {"decode-32k-b8", 8, 1, 32768, 32, 4, "full", 32768},
    };
    header = "{\"gpu\": " + json_string(prop.name) + ", \"gemm_tflops\": " + json_number(limits ? peak : std::nan("")) +
             ", \"copy_gbps\": " + json_number(limits ? bw : std::nan("")) +
             ", \"bwd_flops_convention\": \"2.5x forward useful FLOPs\"";
    std::printf(
        "| shape | ms | TFLOP/s | of GEMM | GB/s | of copy | bwd ms | bwd TFLOP/s | bwd of GEMM | plan |\n"
        "|---|---|---|---|---|---|---|---|---|---|\n");
    auto fraction = [&](double x, double limit) {
      char text[32] = "-";
      if (limits && std::isfinite(x)) std::snprintf(text, sizeof text, "%.2f", x / limit);
      return std::string(text);
    };
    auto fixed = [](double x, int digits) {
      char text[32] = "-";
      if (std::isfinite(x)) std::snprintf(text, sizeof text, "%.*f", digits, x);
      return std::string(text);
    };
    for (const Case& c : cases) {
      if (!only.empty() && c.name.find(only) == std::string::npos) continue;
      const Row r = run_case(c, iters, options, backward, mma_sync);
      std::printf("| %s | %.3f | %.1f | %s | %.0f | %s | %s | %s | %s | %s |\n", r.name.c_str(), r.ms, r.tflops,
                  fraction(r.tflops, peak).c_str(), r.gbps, fraction(r.gbps, bw).c_str(), fixed(r.bwd_ms, 3).c_str(),
                  fixed(r.bwd_tflops, 1).c_str(), fraction(r.bwd_tflops, peak).c_str(), r.plan.c_str());
      std::fflush(stdout);
      results.push_back(
          "{\"shape\": " + json_string(r.name) + ", \"impl\": \"seqattn-cuda\", \"ms\": " + json_number(r.ms) +
          ", \"tflops\": " + json_number(r.tflops) + ", \"gbps\": " + json_number(r.gbps) +
          ", \"note\": " + json_string(r.plan) + ", \"bwd_ms\": " + json_number(r.bwd_ms) +
          ", \"bwd_tflops\": " + json_number(r.bwd_tflops) + ", \"bwd_note\": " + json_string(r.bwd_note) + "}");
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_cuda: %s\n", e.what());
    error = e.what();
  }
  if (!json.empty() && !header.empty()) {
    std::string text = header + ", \"results\": [";
    for (std::size_t i = 0; i < results.size(); ++i) text += (i ? ", " : "") + results[i];
    text += "]";
    if (!error.empty()) text += ", \"error\": " + json_string(error);
    std::ofstream(json) << text << "}\n";
  }
  return error.empty() ? 0 : 1;
}
