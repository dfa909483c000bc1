// The engine configurations the tests run most, compiled once per preset.
//
// Without this header every test TU that calls, say, Highway's float forward
// pass with variants::Standard on a ThreadPool compiles that whole engine
// (tiled forward, kernels) again: in the ASan build of 2026-11-25, 256 engine
// instantiations in the test objects were 140 distinct ones. Here each listed
// configuration is declared `extern template`, so TUs that include this header
// reference it instead of compiling it, and one TU per group in
// tests/support/engine/ instantiates it (FlashAttention-3's instantiation files
// and ggml's template-instances do the same). Configurations not listed are
// instantiated where they are used, as before; the public headers are
// untouched, and a consumer of the header-only library never sees this.
//
// A group = backend kernel x storage type; each entry names the pass, the
// variant and the execution policy (the types attention_forward /
// attention_backward deduce: the policy without reference or const).
#pragma once

#include "seqattn/attention.hpp"
#include "seqattn/core/execution.hpp"

#define SEQATTN_TEST_HIGHWAY_FLOAT(TILED_FORWARD, TILED_BACKWARD, REFERENCE_FORWARD, REFERENCE_BACKWARD) \
  TILED_FORWARD(::seqattn::backends::Highway::Kernel, float, ::seqattn::variants::Default,               \
                ::seqattn::execution::Serial)                                                            \
  TILED_FORWARD(::seqattn::backends::Highway::Kernel, float, ::seqattn::variants::Default,               \
                ::seqattn::execution::ThreadPool)                                                        \
  TILED_FORWARD(::seqattn::backends::Highway::Kernel, float, ::seqattn::variants::Standard,              \
                ::seqattn::execution::Serial)                                                            \
  TILED_FORWARD(::seqattn::backends::Highway::Kernel, float, ::seqattn::variants::Standard,              \
                ::seqattn::execution::ThreadPool)                                                        \
  TILED_BACKWARD(::seqattn::backends::Highway::Kernel, float, ::seqattn::variants::Default,              \
                 ::seqattn::execution::Serial)                                                           \
  TILED_BACKWARD(::seqattn::backends::Highway::Kernel, float, ::seqattn::variants::Default,              \
                 ::seqattn::execution::ThreadPool)                                                       \
  TILED_BACKWARD(::seqattn::backends::Highway::Kernel, float, ::seqattn::variants::Standard,             \
                 ::seqattn::execution::Serial)

#define SEQATTN_TEST_HIGHWAY_BF16(TILED_FORWARD, TILED_BACKWARD, REFERENCE_FORWARD, REFERENCE_BACKWARD)   \
  TILED_FORWARD(::seqattn::backends::Highway::Kernel, ::seqattn::bfloat16, ::seqattn::variants::Default,  \
                ::seqattn::execution::ThreadPool)                                                         \
  TILED_FORWARD(::seqattn::backends::Highway::Kernel, ::seqattn::bfloat16, ::seqattn::variants::Standard, \
                ::seqattn::execution::ThreadPool)                                                         \
  TILED_FORWARD(::seqattn::backends::Highway::Kernel, ::seqattn::bfloat16, ::seqattn::variants::Standard, \
                ::seqattn::execution::Serial)

#define SEQATTN_TEST_SCALAR(TILED_FORWARD, TILED_BACKWARD, REFERENCE_FORWARD, REFERENCE_BACKWARD) \
  TILED_FORWARD(::seqattn::backends::Scalar::Kernel, float, ::seqattn::variants::Default,         \
                ::seqattn::execution::Serial)                                                     \
  TILED_FORWARD(::seqattn::backends::Scalar::Kernel, float, ::seqattn::variants::Default,         \
                ::seqattn::execution::ThreadPool)                                                 \
  TILED_FORWARD(::seqattn::backends::Scalar::Kernel, float, ::seqattn::variants::Standard,        \
                ::seqattn::execution::Serial)                                                     \
  TILED_FORWARD(::seqattn::backends::Scalar::Kernel, float, ::seqattn::variants::Standard,        \
                ::seqattn::execution::ThreadPool)

#define SEQATTN_TEST_REFERENCE(TILED_FORWARD, TILED_BACKWARD, REFERENCE_FORWARD, REFERENCE_BACKWARD)  \
  REFERENCE_FORWARD(float, ::seqattn::variants::Default, ::seqattn::execution::Serial)                \
  REFERENCE_FORWARD(float, ::seqattn::variants::Default, ::seqattn::execution::ThreadPool)            \
  REFERENCE_FORWARD(float, ::seqattn::variants::Standard, ::seqattn::execution::Serial)               \
  REFERENCE_FORWARD(float, ::seqattn::variants::Sinks, ::seqattn::execution::Serial)                  \
  REFERENCE_FORWARD(::seqattn::bfloat16, ::seqattn::variants::Standard, ::seqattn::execution::Serial) \
  REFERENCE_BACKWARD(float, ::seqattn::variants::Default)

// One entry as an explicit instantiation: `extern template` (declaration) or
// `template` (definition, in tests/support/engine/*.cpp).
#define SEQATTN_TEST_TILED_FORWARD_AS(KEYWORD, Kernel, T, V, Exec)                                                     \
  KEYWORD void seqattn::detail::run_tiled_forward<Kernel, T, V, Exec>(                                                 \
      const ::seqattn::detail::TiledWork&, const ::seqattn::BlockMask&, const ::seqattn::detail::AttentionProblem<T>&, \
      const V&, Exec&);
#define SEQATTN_TEST_TILED_BACKWARD_AS(KEYWORD, Kernel, T, V, Exec)             \
  KEYWORD void seqattn::detail::run_tiled_backward<Kernel, T, V, Exec>(         \
      const ::seqattn::detail::TiledBackwardWork&, const ::seqattn::BlockMask&, \
      const ::seqattn::detail::BackwardProblem<T>&, const V&, Exec&);
#define SEQATTN_TEST_REFERENCE_FORWARD_AS(KEYWORD, T, V, Exec)                                                   \
  KEYWORD void seqattn::detail::run_reference_forward<T, V, Exec>(const ::seqattn::detail::AttentionProblem<T>&, \
                                                                  const ::seqattn::BlockMask&, const V&, Exec&);
#define SEQATTN_TEST_REFERENCE_BACKWARD_AS(KEYWORD, T, V)                                                  \
  KEYWORD void seqattn::detail::run_reference_backward<T, V>(const ::seqattn::detail::BackwardProblem<T>&, \
                                                             const ::seqattn::BlockMask&, const V&);

#define SEQATTN_TEST_EXTERN_TILED_FORWARD(...) SEQATTN_TEST_TILED_FORWARD_AS(extern template, __VA_ARGS__)
#define SEQATTN_TEST_EXTERN_TILED_BACKWARD(...) SEQATTN_TEST_TILED_BACKWARD_AS(extern template, __VA_ARGS__)
#define SEQATTN_TEST_EXTERN_REFERENCE_FORWARD(...) SEQATTN_TEST_REFERENCE_FORWARD_AS(extern template, __VA_ARGS__)
#define SEQATTN_TEST_EXTERN_REFERENCE_BACKWARD(...) SEQATTN_TEST_REFERENCE_BACKWARD_AS(extern template, __VA_ARGS__)
#define SEQATTN_TEST_DEFINE_TILED_FORWARD(...) SEQATTN_TEST_TILED_FORWARD_AS(template, __VA_ARGS__)
#define SEQATTN_TEST_DEFINE_TILED_BACKWARD(...) SEQATTN_TEST_TILED_BACKWARD_AS(template, __VA_ARGS__)
#define SEQATTN_TEST_DEFINE_REFERENCE_FORWARD(...) SEQATTN_TEST_REFERENCE_FORWARD_AS(template, __VA_ARGS__)
#define SEQATTN_TEST_DEFINE_REFERENCE_BACKWARD(...) SEQATTN_TEST_REFERENCE_BACKWARD_AS(template, __VA_ARGS__)

#define SEQATTN_TEST_EXTERN(GROUP)                                                                                    \
  GROUP(SEQATTN_TEST_EXTERN_TILED_FORWARD, SEQATTN_TEST_EXTERN_TILED_BACKWARD, SEQATTN_TEST_EXTERN_REFERENCE_FORWARD, \
        SEQATTN_TEST_EXTERN_REFERENCE_BACKWARD)
#define SEQATTN_TEST_DEFINE(GROUP)                                                                                    \
  GROUP(SEQATTN_TEST_DEFINE_TILED_FORWARD, SEQATTN_TEST_DEFINE_TILED_BACKWARD, SEQATTN_TEST_DEFINE_REFERENCE_FORWARD, \
        SEQATTN_TEST_DEFINE_REFERENCE_BACKWARD)

// The instantiation TUs define SEQATTN_TEST_ENGINE_INSTANCES_TU and
// instantiate their own group; every other TU references all of them.
#ifndef SEQATTN_TEST_ENGINE_INSTANCES_TU
SEQATTN_TEST_EXTERN(SEQATTN_TEST_HIGHWAY_FLOAT)
SEQATTN_TEST_EXTERN(SEQATTN_TEST_HIGHWAY_BF16)
SEQATTN_TEST_EXTERN(SEQATTN_TEST_SCALAR)
SEQATTN_TEST_EXTERN(SEQATTN_TEST_REFERENCE)
#endif
