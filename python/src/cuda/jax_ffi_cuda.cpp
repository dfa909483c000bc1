// XLA FFI handlers for platform CUDA: seqattn.jax's custom calls on
// backends::Cuda, on XLA's stream with XLA's device buffers. seqattn.jax
// registers them under the names its CPU handlers have (jax_ffi.cpp), with
// the same operands and attributes, so one traced computation runs on either
// platform; `threads` is ignored here. Storage: bfloat16 or float16
// (backends::Cuda), BSHD with the leading dims folded into the batch (vmap).
//
// Plans are cached per (mask, shape, pass, device, segment ids) as on the CPU.
// Segment ids are device buffers: a call with ids copies them to the host
// (planning reads them there) and waits for the stream; a static mask's
// call does neither.
#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <nanobind/nanobind.h>
#include <string>
#include <vector>

#include "../ffi_common.hpp"
#include "engine.hpp"
#include "module.hpp"

#ifdef SEQATTN_PY_HAVE_XLA_FFI
#include "xla/ffi/api/ffi.h"
#endif

namespace seqattn::python::cuda_module {

#ifdef SEQATTN_PY_HAVE_XLA_FFI
namespace ffi = xla::ffi;
using ffi_buffers::by_storage_type;
using ffi_buffers::dims_of;
using ffi_buffers::fold_leading;
using ffi_buffers::input;
using ffi_buffers::output;

namespace {

// The ids of a call copied to the host ([rows, S]; empty: not given).
struct HostIds {
  std::array<std::vector<std::int32_t>, 4> values;
  std::array<Extents, 4> shapes;
  bool operator==(const HostIds&) const = default;

  CoreFfiIds views() const {
    std::array<TensorView<const std::int32_t>, 4> v;
    for (std::size_t i = 0; i < 4; ++i) {
      if (!values[i].empty()) v[i] = TensorView<const std::int32_t>(values[i].data(), shapes[i]);
    }
    return {v[0], v[1], v[2], v[3]};
  }
};

HostIds host_ids(const std::array<ffi::Buffer<ffi::S32>, 4>& buffers, void* stream) {
  static constexpr std::array<const char*, 4> kNames{"q_segment_ids", "kv_segment_ids", "q_positions", "kv_positions"};
  HostIds ids;
  bool any = false;
  for (std::size_t i = 0; i < buffers.size(); ++i) {
    const auto n = static_cast<std::size_t>(buffers[i].element_count());
    if (n == 0) continue;
    ids.shapes[i] = fold_leading(dims_of(buffers[i].dimensions()), 1, kNames[i]);
    ids.values[i].resize(n);
    // Queued on XLA's stream (after whatever computed the ids); one wait below.
    cuda_engine::copy_to_host(ids.values[i].data(), buffers[i].typed_data(), n * sizeof(std::int32_t), stream, false);
    any = true;
  }
  if (any) cuda_engine::copy_to_host(nullptr, nullptr, 0, stream, true);
  return ids;
}

struct PlanKey {
  std::int64_t mask_id = 0;
  bool backward = false;
  int device = 0;
  AttentionShape shape;
  HostIds ids;
  bool operator==(const PlanKey&) const = default;
};

std::mutex& cache_mutex() {
  static std::mutex m;
  return m;
}
PlanCacheStats& cache_stats() {
  static PlanCacheStats s;
  return s;
}
using CudaPlanCache = PlanCache<PlanKey, cuda_engine::Plan>;

std::shared_ptr<const cuda_engine::Plan> call_plan(std::int64_t mask_id, const AttentionShape& shape, bool backward,
                                                   int device, HostIds ids) {
  // Never destroyed: plans hold device memory past exit.
  static auto* static_plans = new CudaPlanCache(32, cache_mutex(), cache_stats());
  static auto* id_plans = new CudaPlanCache(4, cache_mutex(), cache_stats());
  CudaPlanCache& cache = ids.values[0].empty() ? *static_plans : *id_plans;
  // The checks that need no device come before the BlockMask is built.
  cuda_engine::check_plan_request(shape, backward);
  return cache.get(PlanKey{mask_id, backward, device, shape, ids}, [&] {
    return cuda_engine::make_plan(shape, core_ffi_block_mask(mask_id, ids.views(), shape), backward, device);
  });
}

cuda_engine::RunOptions run_options(float scale, float softcap) {
  cuda_engine::RunOptions o;
  o.scale = scale;
  o.softcap = softcap;
  return o;
}

const char* dtype_error() {
  return "seqattn.jax on CUDA: q, k and v must be bfloat16 or float16 (backends::Cuda computes on 16-bit storage "
         "with fp32 accumulation); float32 runs on the CPU engine only";
}

template <class T>
void forward_typed(void* stream, ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v,
                   const std::array<ffi::Buffer<ffi::S32>, 4>& ids, ffi::Result<ffi::AnyBuffer>& out,
                   ffi::Result<ffi::Buffer<ffi::F32>>& lse, std::int64_t mask_id, const cuda_engine::RunOptions& o) {
  const AttentionInputs<T> in{input<T>(q, 3, "q"), input<T>(k, 3, "k"), input<T>(v, 3, "v"), nullptr};
  const AttentionShape shape = shape_of(in);
  cuda_engine::check_run_options(o, shape);
  const int device = cuda_engine::device_of(q.untyped_data(), "seqattn.jax (CUDA): q");
  const auto plan = call_plan(mask_id, shape, false, device, host_ids(ids, stream));
  const auto lse_dims = fold_leading(dims_of(lse->dimensions()), 2, "lse");
  cuda_engine::forward<T>(*plan, o, in, output<T>(out, 3, "out"), TensorView<float>(lse->typed_data(), lse_dims),
                          stream);
}

ffi::Error forward_impl(void* stream, ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v, ffi::Buffer<ffi::S32> q_ids,
                        ffi::Buffer<ffi::S32> kv_ids, ffi::Buffer<ffi::S32> q_pos, ffi::Buffer<ffi::S32> kv_pos,
                        ffi::Result<ffi::AnyBuffer> out, ffi::Result<ffi::Buffer<ffi::F32>> lse, std::int64_t mask_id,
                        float scale, float softcap, std::int64_t /*threads*/) {
  const std::array<ffi::Buffer<ffi::S32>, 4> ids{q_ids, kv_ids, q_pos, kv_pos};
  const cuda_engine::RunOptions o = run_options(scale, softcap);
  return by_storage_type<bfloat16, float16>(q.element_type(), dtype_error(), [&](auto t) {
    forward_typed<decltype(t)>(stream, q, k, v, ids, out, lse, mask_id, o);
  });
}

template <class T>
void backward_typed(void* stream, ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v, ffi::AnyBuffer out,
                    ffi::Buffer<ffi::F32> lse, ffi::AnyBuffer dout, const std::array<ffi::Buffer<ffi::S32>, 4>& ids,
                    ffi::Result<ffi::AnyBuffer>& dq, ffi::Result<ffi::AnyBuffer>& dk, ffi::Result<ffi::AnyBuffer>& dv,
                    std::int64_t mask_id, const cuda_engine::RunOptions& o) {
  const AttentionInputs<T> in{input<T>(q, 3, "q"), input<T>(k, 3, "k"), input<T>(v, 3, "v"), nullptr};
  const AttentionShape shape = shape_of(in);
  cuda_engine::check_run_options(o, shape);
  const int device = cuda_engine::device_of(q.untyped_data(), "seqattn.jax (CUDA): q");
  const auto plan = call_plan(mask_id, shape, true, device, host_ids(ids, stream));
  const auto lse_dims = fold_leading(dims_of(lse.dimensions()), 2, "lse");
  const auto dqv = output<T>(dq, 3, "dq"), dkv = output<T>(dk, 3, "dk"), dvv = output<T>(dv, 3, "dv");
  // As on the CPU: gradients start at 0, whatever the kernels leave unwritten.
  for (const auto& g : {dqv, dkv, dvv}) cuda_engine::zero_async(g.data(), g.size() * sizeof(T), stream);
  cuda_engine::backward<T>(*plan, o, in, input<T>(out, 3, "out"), TensorView<const float>(lse.typed_data(), lse_dims),
                           input<T>(dout, 3, "dout"), dqv, dkv, dvv, stream);
}

ffi::Error backward_impl(void* stream, ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v, ffi::AnyBuffer out,
                         ffi::Buffer<ffi::F32> lse, ffi::AnyBuffer dout, ffi::Buffer<ffi::S32> q_ids,
                         ffi::Buffer<ffi::S32> kv_ids, ffi::Buffer<ffi::S32> q_pos, ffi::Buffer<ffi::S32> kv_pos,
                         ffi::Result<ffi::AnyBuffer> dq, ffi::Result<ffi::AnyBuffer> dk, ffi::Result<ffi::AnyBuffer> dv,
                         std::int64_t mask_id, float scale, float softcap, std::int64_t /*threads*/) {
  const std::array<ffi::Buffer<ffi::S32>, 4> ids{q_ids, kv_ids, q_pos, kv_pos};
  const cuda_engine::RunOptions o = run_options(scale, softcap);
  return by_storage_type<bfloat16, float16>(q.element_type(), dtype_error(), [&](auto t) {
    backward_typed<decltype(t)>(stream, q, k, v, out, lse, dout, ids, dq, dk, dv, mask_id, o);
  });
}

}  // namespace

// XLA's stream (cudaStream_t) first, then the CPU handlers' operands.
XLA_FFI_DEFINE_HANDLER(kCudaAttentionForward, forward_impl,
                       ffi_signatures::forward(ffi::Ffi::Bind().Ctx<ffi::PlatformStream<void*>>()));
XLA_FFI_DEFINE_HANDLER(kCudaAttentionBackward, backward_impl,
                       ffi_signatures::backward(ffi::Ffi::Bind().Ctx<ffi::PlatformStream<void*>>()));

void bind_cuda_jax_ffi(nanobind::module_& m) {
  namespace nb = nanobind;
  m.attr("has_xla_ffi") = true;
  m.attr("xla_ffi_api_version") = nb::make_tuple(XLA_FFI_API_MAJOR, XLA_FFI_API_MINOR);
  m.def("ffi_handlers", [] {
    nb::dict d;
    d["seqattn_attention_forward"] = nb::capsule(reinterpret_cast<void*>(kCudaAttentionForward));
    d["seqattn_attention_backward"] = nb::capsule(reinterpret_cast<void*>(kCudaAttentionBackward));
    return d;
  });
}

#else

void bind_cuda_jax_ffi(nanobind::module_& m) {
  m.attr("has_xla_ffi") = false;
  m.attr("xla_ffi_api_version") = nanobind::none();
}

#endif

}  // namespace seqattn::python::cuda_module
