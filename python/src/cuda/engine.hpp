// seqattn._cuda's way into backends::Cuda (engine.cu, compiled by nvcc): plans
// and planned calls on device memory, behind an interface without CUDA types,
// so that the binding files compile with the C++ compiler. Layout: BSHD, any
// strides the backend accepts (checked there: head dim contiguous, 16-byte
// rows). Streams are cudaStream_t passed as void*.
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <string>

#include "seqattn/attention/inputs.hpp"
#include "seqattn/core/bfloat16.hpp"
#include "seqattn/core/float16.hpp"
#include "seqattn/core/tensor.hpp"
#include "seqattn/masks/block_mask.hpp"

namespace seqattn::python::cuda_engine {

// A plan of backends::Cuda (its device buffers live on `device()`).
class Plan;
const AttentionShape& plan_shape(const Plan& plan);
bool plan_backward(const Plan& plan);
int plan_device(const Plan& plan);

// The Cuda backend's tile shape: what the BlockMask of a plan is built for.
BlockShape block_shape();

// Everything planning checks before it touches the GPU (limits, head ratio,
// head dims the kernels have, those of the backward pass when `backward`):
// throws seqattn::invalid_argument.
void check_plan_request(const AttentionShape& shape, bool backward);

// Plans `shape` on CUDA device `device` (made current for the call, then
// restored) with a BlockMask built for block_shape(); uploads the mask.
std::shared_ptr<const Plan> make_plan(const AttentionShape& shape, std::shared_ptr<const BlockMask> block_mask,
                                      bool backward, int device);

// The number of CUDA devices; 0 where there is no driver or no device
// (`why` then says what cudaGetDeviceCount answered).
int device_count(std::string* why = nullptr);

// The CUDA runtime version this module was built with (CUDART_VERSION).
int runtime_version();

struct RunOptions {
  float scale = std::numeric_limits<float>::quiet_NaN();  // NaN: 1/sqrt(dk)
  float softcap = 0.0f;                                   // 0: off
  std::span<const float> sinks = {};                      // host, one per query head; empty: none
};

// Throws unless `options` suit `shape` (finite scale, sinks per head, ...).
void check_run_options(const RunOptions& options, const AttentionShape& shape);

// Asynchronous on `stream`, on the plan's device. T: bfloat16 or float16.
template <class T>
void forward(const Plan& plan, const RunOptions& options, const AttentionInputs<T>& in, TensorView<T> out,
             TensorView<float> lse, void* stream);

// Asynchronous on `stream`; the plan was made with backward = true.
template <class T>
void backward(const Plan& plan, const RunOptions& options, const AttentionInputs<T>& in, TensorView<const T> out,
              TensorView<const float> lse, TensorView<const T> dout, TensorView<T> dq, TensorView<T> dk,
              TensorView<T> dv, void* stream);

// cudaMemcpyAsync device -> host of `bytes` on `stream` (segment ids, which
// planning reads on the host); waits for the stream when `wait`.
void copy_to_host(void* host, const void* device, std::size_t bytes, void* stream, bool wait);
// The device that `pointer` (device memory) lives on, the current device for
// null (an empty buffer); throws for host memory.
int device_of(const void* pointer, const char* name);
// cudaMemsetAsync(0) of `bytes` at `device` on `stream`.
void zero_async(void* device, std::size_t bytes, void* stream);

}  // namespace seqattn::python::cuda_engine
