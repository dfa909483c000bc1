// backends::Cuda for seqattn._cuda (engine.hpp). The kernels themselves are
// the generated instance files of cmake/SeqattnCuda.cmake
// (SEQATTN_CUDA_SEPARATE_INSTANCES): this file compiles only their callers.
#include <cuda_runtime.h>
#include <memory>
#include <utility>

#include "seqattn/attention/plan.hpp"
#include "seqattn/attention/run.hpp"
#include "seqattn/attention/variants.hpp"
#include "seqattn/backends/cuda.cuh"
#include "seqattn/core/error.hpp"

#include "engine.hpp"

namespace seqattn::python::cuda_engine {

using CudaPlan = AttentionPlan<backends::Cuda>;

class Plan {
 public:
  Plan(CudaPlan plan, int device) : plan_(std::move(plan)), device_(device) {}
  const CudaPlan& get() const { return plan_; }
  int device() const { return device_; }

 private:
  CudaPlan plan_;
  int device_;
};

namespace {

// Makes `device` current for a call and restores the caller's device (a torch
// or XLA thread keeps its own) afterwards.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    cuda::check(cudaGetDevice(&previous_), "cudaGetDevice");
    if (previous_ != device) cuda::check(cudaSetDevice(device), "cudaSetDevice");
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;
  ~DeviceGuard() {
    int now = previous_;
    if (cudaGetDevice(&now) == cudaSuccess && now != previous_) cudaSetDevice(previous_);
  }

 private:
  int previous_ = 0;
};

variants::Standard variant_of(const RunOptions& o) { return {o.scale, {o.softcap}, {o.sinks}}; }

PlanOptions plan_options(bool backward) {
  PlanOptions options;
  options.backward = backward;
  return options;
}

}  // namespace

const AttentionShape& plan_shape(const Plan& plan) { return plan.get().shape(); }
bool plan_backward(const Plan& plan) { return plan.get().options().backward; }
int plan_device(const Plan& plan) { return plan.device(); }

BlockShape block_shape() { return backends::Cuda::block_shape(); }

void check_plan_request(const AttentionShape& shape, bool backward) {
  seqattn::detail::check_plan_request<backends::Cuda>(shape, plan_options(backward), 1);
  // What plan_backward_launch checks too, but only after the forward half is uploaded.
  seqattn::detail::require(
      !backward || (shape.dk <= cuda::kMaxBackwardHeadDim && shape.dv <= cuda::kMaxBackwardHeadDim),
      "Cuda backend: the backward pass supports head dims up to ", cuda::kMaxBackwardHeadDim, ", got dk ", shape.dk,
      " and dv ", shape.dv, " (plan with backward = false for the forward pass)");
}

std::shared_ptr<const Plan> make_plan(const AttentionShape& shape, std::shared_ptr<const BlockMask> block_mask,
                                      bool backward, int device) {
  // Host-side checks first: a bad request fails before any CUDA call.
  check_plan_request(shape, backward);
  seqattn::detail::require(block_mask != nullptr, "plan_attention: block_mask is null");
  seqattn::detail::require_matching_block_mask<backends::Cuda>(*block_mask, shape);
  const DeviceGuard guard(device);
  return std::make_shared<const Plan>(
      plan_attention<backends::Cuda>(shape, std::move(block_mask), plan_options(backward)), device);
}

int device_count(std::string* why) {
  int n = 0;
  const cudaError_t status = cudaGetDeviceCount(&n);
  if (status != cudaSuccess) {
    if (why) *why = seqattn::detail::concat(cudaGetErrorName(status), " (", cudaGetErrorString(status), ")");
    cudaGetLastError();  // not sticky: clear it
    return 0;
  }
  if (why) *why = n == 0 ? "no CUDA device" : "";
  return n;
}

int runtime_version() { return CUDART_VERSION; }

void check_run_options(const RunOptions& options, const AttentionShape& shape) {
  seqattn::detail::check_variant(variant_of(options), shape);
}

template <class T>
void forward(const Plan& plan, const RunOptions& options, const AttentionInputs<T>& in, TensorView<T> out,
             TensorView<float> lse, void* stream) {
  const DeviceGuard guard(plan.device());
  cuda::Stream exec{static_cast<cudaStream_t>(stream)};
  attention_forward(plan.get(), in, out, lse, variant_of(options), exec);
}

template <class T>
void backward(const Plan& plan, const RunOptions& options, const AttentionInputs<T>& in, TensorView<const T> out,
              TensorView<const float> lse, TensorView<const T> dout, TensorView<T> dq, TensorView<T> dk,
              TensorView<T> dv, void* stream) {
  const DeviceGuard guard(plan.device());
  cuda::Stream exec{static_cast<cudaStream_t>(stream)};
  attention_backward(plan.get(), in, out, lse, dout, AttentionGrads<T>{dq, dk, dv}, variant_of(options), exec);
}

void copy_to_host(void* host, const void* device, std::size_t bytes, void* stream, bool wait) {
  const auto s = static_cast<cudaStream_t>(stream);
  if (bytes > 0) {
    cuda::check(cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, s), "cudaMemcpyAsync(segment ids)");
  }
  if (wait) cuda::check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
}

int device_of(const void* pointer, const char* name) {
  if (pointer == nullptr) {  // an empty buffer: the current device
    int device = 0;
    cuda::check(cudaGetDevice(&device), "cudaGetDevice");
    return device;
  }
  cudaPointerAttributes attr{};
  cuda::check(cudaPointerGetAttributes(&attr, pointer), "cudaPointerGetAttributes");
  seqattn::detail::require(attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged, name,
                           " must point to device memory, got a host pointer");
  return attr.device;
}

void zero_async(void* device, std::size_t bytes, void* stream) {
  if (bytes == 0) return;
  cuda::check(cudaMemsetAsync(device, 0, bytes, static_cast<cudaStream_t>(stream)), "cudaMemsetAsync");
}

template void forward<bfloat16>(const Plan&, const RunOptions&, const AttentionInputs<bfloat16>&, TensorView<bfloat16>,
                                TensorView<float>, void*);
template void forward<float16>(const Plan&, const RunOptions&, const AttentionInputs<float16>&, TensorView<float16>,
                               TensorView<float>, void*);
template void backward<bfloat16>(const Plan&, const RunOptions&, const AttentionInputs<bfloat16>&,
                                 TensorView<const bfloat16>, TensorView<const float>, TensorView<const bfloat16>,
                                 TensorView<bfloat16>, TensorView<bfloat16>, TensorView<bfloat16>, void*);
template void backward<float16>(const Plan&, const RunOptions&, const AttentionInputs<float16>&,
                                TensorView<const float16>, TensorView<const float>, TensorView<const float16>,
                                TensorView<float16>, TensorView<float16>, TensorView<float16>, void*);

}  // namespace seqattn::python::cuda_engine
