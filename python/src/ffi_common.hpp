// What the CPU (jax_ffi.cpp) and CUDA (cuda/jax_ffi_cuda.cpp) XLA handlers of
// seqattn.jax share: XLA buffers as engine views, and the operands, results
// and attributes of the two custom calls in the order seqattn/jax.py passes
// them (the CUDA handlers bind XLA's stream first and hand the rest here).
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "seqattn/core/bfloat16.hpp"
#include "seqattn/core/error.hpp"
#include "seqattn/core/float16.hpp"
#include "seqattn/core/tensor.hpp"

#include "xla/ffi/api/ffi.h"

namespace seqattn::python {

namespace ffi_buffers {

namespace ffi = xla::ffi;

inline Extents dims_of(ffi::Span<const std::int64_t> d) {
  Extents e;
  for (std::int64_t x : d) e.push_back(static_cast<index_t>(x));
  return e;
}

// [..., a, b, c] -> [prod(...), a, b, c] (row-major buffers: a reshape).
inline Extents fold_leading(const Extents& e, int keep, const char* name) {
  detail::require(e.rank() >= keep + 1, "seqattn.jax: ", name, " must have at least ", keep + 1, " dims, got shape ",
                  e);
  Extents out{e.drop_last(keep).size()};
  for (int i = e.rank() - keep; i < e.rank(); ++i) out.push_back(e[i]);
  return out;
}

template <class T>
TensorView<const T> input(ffi::AnyBuffer b, int keep, const char* name) {
  return TensorView<const T>(static_cast<const T*>(b.untyped_data()),
                             fold_leading(dims_of(b.dimensions()), keep, name));
}

template <class T>
TensorView<T> output(ffi::Result<ffi::AnyBuffer>& b, int keep, const char* name) {
  return TensorView<T>(static_cast<T*>(b->untyped_data()), fold_leading(dims_of(b->dimensions()), keep, name));
}

// XLA's element type of a storage type.
template <class T>
constexpr ffi::DataType kDataType = ffi::DataType::INVALID;
template <>
inline constexpr ffi::DataType kDataType<float> = ffi::DataType::F32;
template <>
inline constexpr ffi::DataType kDataType<bfloat16> = ffi::DataType::BF16;
template <>
inline constexpr ffi::DataType kDataType<float16> = ffi::DataType::F16;

// A handler's body as its result: run(T{}) for the T among Types whose XLA
// type is `type`; another type gives `unsupported`, an exception its message.
template <class... Types, class Run>
ffi::Error by_storage_type(ffi::DataType type, const char* unsupported, Run&& run) {
  try {
    const bool ran = ((type == kDataType<Types> ? (run(Types{}), true) : false) || ...);
    if (!ran) return ffi::Error(ffi::ErrorCode::kInvalidArgument, unsupported);
    return ffi::Error::Success();
  } catch (const std::exception& e) {
    return ffi::Error(ffi::ErrorCode::kInvalidArgument, e.what());
  }
}

}  // namespace ffi_buffers

// What the plan caches of one module have done: plans made, calls served.
struct PlanCacheStats {
  std::int64_t plans = 0;
  std::int64_t hits = 0;
};

// Plans by key, the oldest dropped first beyond `kept`. Plans are immutable,
// so concurrent calls share them. A module's caches share one mutex and one
// PlanCacheStats (read under that mutex). A new key is planned outside the
// lock: two threads may both plan it; both plans are right.
template <class Key, class Plan>
class PlanCache {
 public:
  PlanCache(std::size_t kept, std::mutex& mutex, PlanCacheStats& stats) : kept_(kept), mutex_(mutex), stats_(stats) {}

  template <class Make>
  std::shared_ptr<const Plan> get(Key key, Make&& make) {
    {
      std::lock_guard lock(mutex_);
      for (const Entry& e : entries_) {
        if (e.key == key) {
          ++stats_.hits;
          return e.plan;
        }
      }
    }
    std::shared_ptr<const Plan> plan = make();
    std::lock_guard lock(mutex_);
    ++stats_.plans;
    if (entries_.size() == kept_) entries_.erase(entries_.begin());
    entries_.push_back({std::move(key), plan});
    return plan;
  }

 private:
  struct Entry {
    Key key;
    std::shared_ptr<const Plan> plan;
  };
  std::size_t kept_;
  std::mutex& mutex_;
  PlanCacheStats& stats_;
  std::vector<Entry> entries_;
};

namespace ffi_signatures {

namespace ffi = xla::ffi;

// A binding's methods take it as an rvalue (each returns the next binding type).

// The four segment-id operands (a zero-size buffer: not given).
template <class Binding>
auto segment_ids(Binding b) {
  return std::move(b)
      .template Arg<ffi::Buffer<ffi::S32>>()   // q_segment_ids
      .template Arg<ffi::Buffer<ffi::S32>>()   // kv_segment_ids
      .template Arg<ffi::Buffer<ffi::S32>>()   // q_positions
      .template Arg<ffi::Buffer<ffi::S32>>();  // kv_positions
}

template <class Binding>
auto attributes(Binding b) {
  return std::move(b)
      .template Attr<std::int64_t>("mask_id")
      .template Attr<float>("scale")
      .template Attr<float>("softcap")
      .template Attr<std::int64_t>("threads");
}

// q, k, v, the ids -> out, lse. (A binding cannot be held in a variable: its
// move constructor is private, so each step passes the last one on as a
// temporary.)
template <class Binding>
auto forward(Binding b) {
  return attributes(segment_ids(std::move(b)
                                    .template Arg<ffi::AnyBuffer>()   // q
                                    .template Arg<ffi::AnyBuffer>()   // k
                                    .template Arg<ffi::AnyBuffer>())  // v
                        .template Ret<ffi::AnyBuffer>()               // out
                        .template Ret<ffi::Buffer<ffi::F32>>());      // lse
}

// q, k, v, out, lse, dout, the ids -> dq, dk, dv.
template <class Binding>
auto backward(Binding b) {
  return attributes(segment_ids(std::move(b)
                                    .template Arg<ffi::AnyBuffer>()         // q
                                    .template Arg<ffi::AnyBuffer>()         // k
                                    .template Arg<ffi::AnyBuffer>()         // v
                                    .template Arg<ffi::AnyBuffer>()         // out
                                    .template Arg<ffi::Buffer<ffi::F32>>()  // lse
                                    .template Arg<ffi::AnyBuffer>())        // dout
                        .template Ret<ffi::AnyBuffer>()                     // dq
                        .template Ret<ffi::AnyBuffer>()                     // dk
                        .template Ret<ffi::AnyBuffer>());                   // dv
}

}  // namespace ffi_signatures

}  // namespace seqattn::python
