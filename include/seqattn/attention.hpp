// Attention: tiled online-softmax ("flash") forward pass on a chosen backend.
//
//   seqattn::attention_forward<Backend>(inputs, mask, out, lse, options, exec)
//
// computes softmax(mask(softcap(scale * q k^T)) [+ sink]) v and the
// log-sum-exp of every (batch, head, query) row, for BSHD or packed THD
// inputs (AttentionInputs), any MaskDescription, GQA/MQA, fp32 or bf16
// storage (fp32 accumulation). See attention/options.hpp for the shapes.
//
// Backends are policy types:
//   backends::Highway    SIMD kernel for this TU's static Highway target (default)
//   backends::Scalar     the same tiling in portable C++
//   backends::Reference  materialized scores, exact softmax: the test oracle
// Execution policies: execution::Serial (default), execution::ThreadPool,
// execution::OpenMP (with -fopenmp). Work is split over batch x head x q-tile;
// with few such tasks (decode) each row of tiles is also split over KV chunks
// whose partial results are merged by their LSE.
//
// The mask is consumed through its BlockMask at the backend's tile shape
// (attention_block_shape<Backend>()): empty tiles are skipped, full tiles run
// without mask work, partial tiles are masked from the stored tile bits (or
// the element predicate when the BlockMask has none). Pass options.block_mask
// to reuse one BlockMask across calls.
#pragma once

#include <type_traits>
#include <utility>

#include "seqattn/attention/detail/problem.hpp"
#include "seqattn/attention/detail/tiled.hpp"
#include "seqattn/attention/options.hpp"
#include "seqattn/backends/execution.hpp"
#include "seqattn/backends/highway.hpp"
#include "seqattn/backends/reference.hpp"
#include "seqattn/backends/scalar.hpp"
#include "seqattn/masks/block_mask.hpp"
#include "seqattn/masks/concept.hpp"

namespace seqattn {

template <class Backend>
concept TiledBackend = requires {
  typename Backend::Kernel;
  { Backend::Kernel::kBlockQ } -> std::convertible_to<index_t>;
  { Backend::Kernel::kBlockKv } -> std::convertible_to<index_t>;
};

template <class Backend>
concept AttentionBackend = TiledBackend<Backend> || requires {
  Backend::kMaterializesScores;
};

// The tile shape a BlockMask must have to be passed as options.block_mask.
template <TiledBackend Backend>
constexpr BlockShape attention_block_shape() {
  return {Backend::Kernel::kBlockQ, Backend::Kernel::kBlockKv};
}

// The BlockMask `attention_forward<Backend>` builds for these inputs; build it
// once and pass it as options.block_mask to reuse it (e.g. across layers).
template <TiledBackend Backend = backends::Highway, class T, MaskDescription M>
BlockMask make_attention_block_mask(const AttentionInputs<T>& in, const M& mask,
                                    BlockMaskOptions options = BlockMaskOptions{}) {
  const index_t tokens_axis = in.segments ? 0 : 1;
  RaggedLengths lengths;
  if (in.segments) {
    for (index_t i = 0; i < in.segments->size(); ++i) {
      lengths.q.push_back(in.segments->q_lens[static_cast<std::size_t>(i)]);
      lengths.kv.push_back(in.segments->kv_lens[static_cast<std::size_t>(i)]);
    }
  } else {
    detail::require(in.q.rank() == 4 && in.k.rank() == 4, "make_attention_block_mask: q and k must have rank 4 (BSHD)",
                    ", got q ", in.q.shape(), " and k ", in.k.shape());
    lengths = RaggedLengths::uniform(in.q.extent(0), in.q.extent(tokens_axis), in.k.extent(tokens_axis));
  }
  return build_block_mask(mask, std::move(lengths), in.q.extent(-2), attention_block_shape<Backend>(), options);
}

template <AttentionBackend Backend = backends::Highway, class T, MaskDescription M, class Exec = execution::Serial>
void attention_forward(const AttentionInputs<T>& inputs, const M& mask, std::type_identity_t<TensorView<T>> out,
                       TensorView<float> lse, const AttentionOptions& options, Exec&& exec) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, bfloat16>, "storage must be float or seqattn::bfloat16");
  const detail::AttentionProblem<T> problem = detail::make_attention_problem(inputs, out, lse, options);
  if constexpr (TiledBackend<Backend>) {
    constexpr BlockShape block = attention_block_shape<Backend>();
    if (options.block_mask) {
      detail::require_matching_block_mask(*options.block_mask, problem, block);
      detail::run_tiled_attention<typename Backend::Kernel>(problem, mask, *options.block_mask, exec);
    } else {
      const BlockMask bm = build_block_mask(mask, problem.lengths(), problem.heads, block);
      detail::run_tiled_attention<typename Backend::Kernel>(problem, mask, bm, exec);
    }
  } else {
    detail::run_reference_attention(problem, mask, exec);
  }
}

template <AttentionBackend Backend = backends::Highway, class T, MaskDescription M>
void attention_forward(const AttentionInputs<T>& inputs, const M& mask, std::type_identity_t<TensorView<T>> out,
                       TensorView<float> lse, const AttentionOptions& options = {}) {
  attention_forward<Backend>(inputs, mask, out, lse, options, execution::Serial{});
}

}  // namespace seqattn
