// What the CPU (jax_ffi.cpp) and CUDA (cuda/jax_ffi_cuda.cpp) XLA handlers of
// seqattn.jax share: XLA buffers as engine views, and the operands, results
// and attributes of the two custom calls in the order seqattn/jax.py passes
// them (the CUDA handlers bind XLA's stream first and hand the rest here).
#pragma once

#include <cstdint>
#include <utility>

#include "seqattn/core/error.hpp"
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

}  // namespace ffi_buffers

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
