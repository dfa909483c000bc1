// Helpers shared by the binding files of seqattn._core (not part of the
// contract with other engineers' files: that is bindings.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "seqattn/attention/plan.hpp"
#include "seqattn/attention/segment_ids.hpp"
#include "seqattn/core/error.hpp"
#include "seqattn/core/segments.hpp"
#include "seqattn/core/tensor.hpp"
#include "seqattn/dispatch.hpp"
#include "seqattn/masks/any_mask.hpp"
#include "seqattn/masks/block_mask.hpp"

namespace seqattn::python {

namespace nb = nanobind;

template <class T>
using CpuArray = nb::ndarray<const T, nb::device::cpu>;
template <class T>
using NumpyArray = nb::ndarray<nb::numpy, T>;

// A strided view of a NumPy/DLPack array (strides in elements, as both use).
// A broadcast array (stride 0) may have any number of elements without
// memory behind them; more than limits::kMaxTensorElements is refused here,
// naming `name`, since every copy or result sized from it would be too.
template <class T>
TensorView<const T> view_of(const CpuArray<T>& a, const char* name) {
  detail::require(a.ndim() <= static_cast<std::size_t>(kMaxRank), name, ": at most ", kMaxRank,
                  " dims are supported, got ", a.ndim());
  Extents shape;
  Strides strides;
  for (std::size_t d = 0; d < a.ndim(); ++d) {
    shape.push_back(static_cast<index_t>(a.shape(d)));
    strides.push_back(static_cast<index_t>(a.stride(d)));
  }
  detail::checked_tensor_size(shape, name);
  return TensorView<const T>(a.data(), shape, strides);
}

// Runs `allocate`, which allocates about `bytes` for `what` (a description
// with the shape), turning std::bad_alloc into seqattn::out_of_memory: Python
// then sees a MemoryError naming the request instead of "std::bad_alloc".
template <class Allocate>
decltype(auto) allocating(const std::string& what, std::size_t bytes, Allocate&& allocate) {
  return detail::allocating(what.c_str(), bytes, std::forward<Allocate>(allocate));
}

// The bytes of `elements` values of T, saturated (only for messages and
// allocation requests whose element count is already checked).
template <class T>
std::size_t bytes_of(index_t elements) {
  index_t bytes = 0;
  if (elements < 0 || !detail::mul_fits(elements, static_cast<index_t>(sizeof(T)), bytes)) {
    return std::numeric_limits<std::size_t>::max();
  }
  return static_cast<std::size_t>(bytes);
}

// A result tensor of `shape` filled with `fill`: more than
// limits::kMaxTensorElements elements is a seqattn::invalid_argument naming
// `what` and the shape, raised before anything is allocated; within the limit
// a failed allocation is a seqattn::out_of_memory naming the bytes.
template <class T>
Tensor<T> allocate_result(const char* what, const Extents& shape, const T& fill) {
  const index_t n = detail::checked_tensor_size(shape, what);
  return allocating(detail::concat(what, " ", shape), bytes_of<T>(n), [&] { return Tensor<T>(shape, fill); });
}

// An owned copy of a (possibly broadcast or strided) input array, `name` of
// the argument of `who`; sized and reported like allocate_result.
template <class T>
Tensor<T> owned_copy(const CpuArray<T>& a, const char* who, const char* name) {
  const TensorView<const T> v = view_of(a, name);
  return allocating(detail::concat(who, ": ", name, " ", v.shape()), bytes_of<T>(v.size()),
                    [&] { return to_tensor(v); });
}

template <class T>
TensorView<T> mutable_view_of(const nb::ndarray<T, nb::device::cpu>& a) {
  Extents shape;
  Strides strides;
  for (std::size_t d = 0; d < a.ndim(); ++d) {
    shape.push_back(static_cast<index_t>(a.shape(d)));
    strides.push_back(static_cast<index_t>(a.stride(d)));
  }
  return TensorView<T>(a.data(), shape, strides);
}

// Hands an owning container to NumPy without a copy: the capsule deletes it
// when the array dies. `As` reinterprets the element type (uint8 -> bool).
template <class As = void, class Container>
auto to_numpy(Container&& c, const Extents& shape) {
  using C = std::remove_cvref_t<Container>;
  using T = std::remove_cvref_t<decltype(*c.data())>;
  using Out = std::conditional_t<std::is_void_v<As>, T, As>;
  static_assert(sizeof(Out) == sizeof(T));
  auto* heap = new C(std::forward<Container>(c));
  nb::capsule owner(heap, [](void* p) noexcept { delete static_cast<C*>(p); });
  std::vector<std::size_t> dims;
  for (index_t d : shape.dims()) dims.push_back(static_cast<std::size_t>(d));
  // NumPy wants a non-null pointer even for an empty array.
  static T dummy{};
  T* data = heap->data() != nullptr ? heap->data() : &dummy;
  return NumpyArray<Out>(reinterpret_cast<Out*>(data), dims.size(), dims.data(), owner);
}

template <class T>
NumpyArray<T> to_numpy(Tensor<T>&& t) {
  const Extents shape = t.shape();
  return to_numpy(std::move(t), shape);
}

template <class T>
NumpyArray<T> to_numpy(const Tensor<T>& t) {
  return to_numpy(Tensor<T>(t));
}

template <class T>
NumpyArray<T> to_numpy(std::vector<T>&& v) {
  const Extents shape{static_cast<index_t>(v.size())};
  return to_numpy(std::move(v), shape);
}

// What a Python mask object holds: the description, how it prints, and the
// lengths / head count its own data implies (document, top-k, dense, ...).
struct PyMask {
  AnyMask mask;
  std::string repr;
  std::string kind;
  std::optional<RaggedLengths> lengths;
  std::optional<index_t> heads;
  // The sequences its own data describes when it holds no lengths (one
  // prefix length per sequence): representations default their batch to it.
  std::optional<index_t> batch;
};

// What a Python BlockMask object holds (shared with plans).
struct PyBlockMask {
  std::shared_ptr<const BlockMask> block_mask;
};

void bind_descriptors(nb::module_& m);
void bind_masks(nb::module_& m);
void bind_attention(nb::module_& m);
void bind_jax_ffi(nb::module_& m);
void bind_core_api(nb::module_& m);

struct CoreFfiIds;
// The mask an XLA call runs: the one seqattn.jax registered as `mask_id`,
// inside a document mask over the call's segment ids when they are given
// (owning its layout). jax_ffi.cpp; used by the CPU handlers and, through
// the CoreApi (core_api.hpp), by the CUDA ones.
AnyMask ffi_call_mask(std::int64_t mask_id, const CoreFfiIds& ids);

// The engine, shared by the NumPy bindings and the XLA FFI handlers: the
// runtime-dispatched kernels (backends::Dispatched, src/dispatch.cc), planned
// once per (mask, shape) and run any number of times. Outputs are
// caller-allocated; the caller has set them to 0 / -inf where tokens may stay
// unwritten (THD gaps).
using EnginePlan = AttentionPlan<backends::Dispatched>;

// Threads: 0 = all hardware threads; range-checked in 64 bits, then narrowed
// (2^32 + 1 must not become 1). Errors name `who`.
int resolve_threads(std::int64_t threads);

// Plans `shape` under `mask` for `threads` workers (what the plan's mask
// reads must outlive the plan). Releases nothing: callers hold no GIL here.
std::shared_ptr<const EnginePlan> plan_engine(const AttentionShape& shape, const AnyMask& mask, bool backward,
                                              int threads);

// The plan a call with BSHD segment ids runs and the ids' operand: `static_plan`
// (made for `mask` alone) with the ids as its operand where that is the
// document mask over them (SegmentIds::same_as_document_mask: masks that
// depend on kv - q alone, self-attention ids), else the plan `plan_document`
// makes of that document mask (ids then null: the plan holds them).
struct CallPlan {
  std::shared_ptr<const EnginePlan> plan;
  std::shared_ptr<const SegmentIds> ids;
};
using PlanDocument = std::function<std::shared_ptr<const EnginePlan>(const AnyMask& document)>;
CallPlan plan_with_segment_ids(std::shared_ptr<const EnginePlan> static_plan, const AnyMask& mask,
                               std::shared_ptr<const SegmentIds> ids, const PlanDocument& plan_document);

// How a planned call runs: the score variant's scalars and the threads
// (pools are cached per thread count).
struct RunOptions {
  float scale = std::numeric_limits<float>::quiet_NaN();  // NaN: 1/sqrt(dk)
  float softcap = 0.0f;                                   // 0: off
  std::span<const float> sinks = {};
  int threads = 1;
};

// Throws unless `options` suit `shape` (sinks per head, finite scale, ...):
// callers check before allocating their outputs.
void check_run_options(const RunOptions& options, const AttentionShape& shape);

template <class T>
void run_forward(const EnginePlan& plan, const RunOptions& options, const AttentionInputs<T>& in, TensorView<T> out,
                 TensorView<float> lse);

template <class T>
void run_backward(const EnginePlan& plan, const RunOptions& options, const AttentionInputs<T>& in,
                  TensorView<const T> out, TensorView<const float> lse, TensorView<const T> dout, TensorView<T> dq,
                  TensorView<T> dk, TensorView<T> dv);

}  // namespace seqattn::python
