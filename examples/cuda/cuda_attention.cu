// The Cuda backend on a packed (THD) batch of three documents with GQA:
// plan once (the BlockMask goes to the GPU with the plan), run on a stream,
// and compare with the CPU reference backend.
//
//   seqattn_example_cuda_attention       (needs a CUDA device)
#include <cmath>
#include <cstdio>
#include <vector>

#include "seqattn/backends/cuda.cuh"
#include "seqattn/backends/reference.hpp"
#include "seqattn/masks.hpp"

int main() {
  using namespace seqattn;
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("no CUDA device: nothing to run\n");
    return 0;
  }
  // Three documents of 300, 0 and 517 tokens packed into one token axis.
  const std::vector<std::int32_t> offsets{0, 300, 300}, lengths{300, 0, 517};
  const SegmentTable docs{offsets, lengths, offsets, lengths};
  const index_t tokens = 817, heads = 16, kv_heads = 4, dim = 128;

  std::vector<bfloat16> q(tokens * heads * dim), k(tokens * kv_heads * dim), v(k.size());
  std::uint32_t state = 1;
  auto next = [&] {
    state = state * 1664525u + 1013904223u;
    return static_cast<float>(state >> 8) / 16777216.0f - 0.5f;
  };
  for (auto* t : {&q, &k, &v})
    for (auto& x : *t) x = bfloat16(next());

  try {
    cuda::DeviceBuffer<bfloat16> dq(q.size()), dk(k.size()), dv(v.size()), dout(q.size());
    dq.upload(std::span<const bfloat16>(q));
    dk.upload(std::span<const bfloat16>(k));
    dv.upload(std::span<const bfloat16>(v));
    const AttentionInputs<bfloat16> in{TensorView<const bfloat16>(dq.data(), Extents{tokens, heads, dim}),
                                       TensorView<const bfloat16>(dk.data(), Extents{tokens, kv_heads, dim}),
                                       TensorView<const bfloat16>(dv.data(), Extents{tokens, kv_heads, dim}), &docs};
    const TensorView<bfloat16> out(dout.data(), Extents{tokens, heads, dim});

    const auto plan = plan_attention<backends::Cuda>(shape_of(in), CausalMask{});
    cudaStream_t stream;
    cuda::check(cudaStreamCreate(&stream), "cudaStreamCreate");
    attention_forward(plan, in, out, {}, variants::Softcap{30.0f}, cuda::Stream{stream});
    cuda::check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    cudaStreamDestroy(stream);
    std::vector<bfloat16> got(q.size());
    cuda::check(cudaMemcpy(got.data(), dout.data(), got.size() * sizeof(bfloat16), cudaMemcpyDeviceToHost),
                "cudaMemcpy");

    // The same on the CPU reference backend, in fp32 from the same bf16 values.
    std::vector<float> qf(q.size()), kf(k.size()), vf(v.size()), want(q.size());
    for (std::size_t i = 0; i < q.size(); ++i) qf[i] = static_cast<float>(q[i]);
    for (std::size_t i = 0; i < k.size(); ++i) kf[i] = static_cast<float>(k[i]), vf[i] = static_cast<float>(v[i]);
    const AttentionInputs<float> ref{TensorView<const float>(qf.data(), Extents{tokens, heads, dim}),
                                     TensorView<const float>(kf.data(), Extents{tokens, kv_heads, dim}),
                                     TensorView<const float>(vf.data(), Extents{tokens, kv_heads, dim}), &docs};
    attention_forward(plan_attention<backends::Reference>(shape_of(ref), CausalMask{}), ref,
                      TensorView<float>(want.data(), Extents{tokens, heads, dim}), {}, variants::Softcap{30.0f});
    double max_diff = 0;
    for (std::size_t i = 0; i < got.size(); ++i) {
      max_diff = std::max(max_diff, std::abs(static_cast<double>(static_cast<float>(got[i])) - want[i]));
    }
    const cuda::LaunchPlan& lp = plan.work().device->launch;
    std::printf("Cuda backend: %lld tokens in 3 documents, %lld heads over %lld kv heads, d %lld, softcap 30\n",
                static_cast<long long>(tokens), static_cast<long long>(heads), static_cast<long long>(kv_heads),
                static_cast<long long>(dim));
    std::printf("  grid %zu work items x %lld head groups x %lld kv splits; device mask %zu bytes\n", lp.items.size(),
                static_cast<long long>(lp.head_groups), static_cast<long long>(lp.kv_splits),
                plan.work().device->layout.bytes());
    std::printf("  max |gpu - cpu reference| = %.4f (bf16 output)\n", max_diff);
    return max_diff < 0.02 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
