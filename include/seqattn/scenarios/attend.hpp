// The one place where the scenarios call the attention engine
// (seqattn/attention.hpp), in the [tokens, heads, dim] layout they share:
//
//   attend(q, k, v, scale, mask)              one sequence (BSHD with batch 1)
//   attend_thd(q, k, v, segments, scale, mask) packed THD segments
//
// Both return AttentionOutput {out [Tq, Hq, Dv], lse [Tq, Hq]}: the LSE is
// written through a strided view straight into token-major order, so nothing
// is transposed afterwards. Backend and execution policy are template/function
// parameters with the engine's defaults (Highway SIMD, serial).
#pragma once

#include <limits>
#include <utility>

#include "seqattn/attention.hpp"
#include "seqattn/core/segments.hpp"
#include "seqattn/masks/concept.hpp"
#include "seqattn/scenarios/reference.hpp"

namespace seqattn::scenarios {

namespace detail {

// A [T, H, D] view as BSHD [1, T, H, D].
template <class T>
TensorView<T> as_batch_of_one(TensorView<T> x) {
  Extents shape;
  Strides strides;
  shape.push_back(1);
  strides.push_back(x.extent(0) * x.stride(0));
  for (int d = 0; d < 3; ++d) {
    shape.push_back(x.extent(d));
    strides.push_back(x.stride(d));
  }
  return TensorView<T>(x.data(), shape, strides);
}

}  // namespace detail

template <class Backend = backends::Highway, MaskDescription M, class Exec = execution::Serial>
AttentionOutput attend(TensorView<const float> q, TensorView<const float> k, TensorView<const float> v, float scale,
                       const M& mask, Exec&& exec = Exec{}, const BlockMask* block_mask = nullptr) {
  detail::require_qkv(q, k, v, "attend");
  const index_t tq = q.extent(0), hq = q.extent(1), dv = v.extent(2);
  AttentionOutput r{Tensor<float>(seqattn::detail::make_extents({tq, hq, dv})),
                    Tensor<float>(seqattn::detail::make_extents({tq, hq}))};
  Extents lse_shape, lse_strides;
  for (index_t d : {index_t{1}, hq, tq}) lse_shape.push_back(d);
  for (index_t s : {tq * hq, index_t{1}, hq}) lse_strides.push_back(s);
  AttentionOptions options;
  options.scale = scale;
  options.block_mask = block_mask;
  attention_forward<Backend>(
      AttentionInputs<float>{detail::as_batch_of_one(q), detail::as_batch_of_one(k), detail::as_batch_of_one(v)}, mask,
      detail::as_batch_of_one(r.out.view()), TensorView<float>(r.lse.data(), lse_shape, lse_strides), options,
      std::forward<Exec>(exec));
  return r;
}

template <class Backend = backends::Highway, MaskDescription M, class Exec = execution::Serial>
AttentionOutput attend_thd(TensorView<const float> q, TensorView<const float> k, TensorView<const float> v,
                           const SegmentTable& segments, float scale, const M& mask, Exec&& exec = Exec{}) {
  detail::require_qkv(q, k, v, "attend_thd");
  const index_t tq = q.extent(0), hq = q.extent(1), dv = v.extent(2);
  // Query tokens no segment covers are not written: they read as rows without keys (0, -inf).
  AttentionOutput r{Tensor<float>(seqattn::detail::make_extents({tq, hq, dv})),
                    Tensor<float>(seqattn::detail::make_extents({tq, hq}), -std::numeric_limits<float>::infinity())};
  Extents lse_shape, lse_strides;
  lse_shape.push_back(hq);
  lse_shape.push_back(tq);
  lse_strides.push_back(1);
  lse_strides.push_back(hq);
  AttentionOptions options;
  options.scale = scale;
  attention_forward<Backend>(AttentionInputs<float>{q, k, v, &segments}, mask, r.out.view(),
                             TensorView<float>(r.lse.data(), lse_shape, lse_strides), options,
                             std::forward<Exec>(exec));
  return r;
}

}  // namespace seqattn::scenarios
