// The operands, results and attributes of seqattn.jax's two custom calls, in
// the order seqattn/jax.py passes them: one list for the CPU handlers
// (jax_ffi.cpp) and the CUDA ones (cuda/jax_ffi_cuda.cpp, which bind XLA's
// stream first and hand the rest of the binding here).
#pragma once

#include <cstdint>
#include <utility>

#include "xla/ffi/api/ffi.h"

namespace seqattn::python::ffi_signatures {

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

}  // namespace seqattn::python::ffi_signatures
