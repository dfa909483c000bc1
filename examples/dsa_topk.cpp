// DeepSeek-V3.2 sparse attention with its lightning indexer: every query keeps
// the k keys with the highest index score sum_h ReLU(q_h . k) w_h (causal, ties
// to the lower index) and attends to those only. Shows the test vectors of
// docs/semantics/multi-item-topk-kascade.md §B.7, the
// parity of the engine path against a brute-force oracle, the two ways to build
// the mask, and the speed against dense causal attention.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "seqattn/scenarios.hpp"

#include "support/timing.hpp"

using namespace seqattn;
using namespace seqattn::scenarios;
using seqattn::examples::best_ms;
using namespace seqattn::scenarios::dsa;

int main() {
  // 1. The small test vectors (TV-B5, TV-B1, TV-B4).
  {
    const Tensor<float> q(Extents{1, 2, 2}, std::vector<float>{1, 0, 0, 1});
    const Tensor<float> k(Extents{2, 2}, std::vector<float>{1, 1, -1, 2});
    const Tensor<float> w(Extents{1, 2}, std::vector<float>{0.5f, 2.0f});
    const Tensor<float> s = index_scores(q.view(), k.view(), w.view(), FullMask{});
    std::printf("1. TV-B5: index scores [%.1f, %.1f] -> top-1 key %d\n", s(0, 0), s(0, 1),
                select_topk(s.view(), 1).indices(0, 0));
    const Tensor<float> row(Extents{1, 5}, std::vector<float>{0.3f, 0.7f, 0.7f, 0.1f, 0.7f});
    const TopK t = select_topk(row.view(), 2);
    std::printf("   TV-B1: scores [0.3 0.7 0.7 0.1 0.7], k=2 -> keys {%d, %d} (ties keep the lowest index)\n",
                t.indices(0, 0), t.indices(0, 1));
    Tensor<float> causal(Extents{4, 4}, kNotAllowed);
    for (index_t i = 0; i < 4; ++i) {
      for (index_t j = 0; j <= i; ++j) causal(i, j) = static_cast<float>(j + 1);
    }
    const TopK c = select_topk(causal.view(), 2);
    std::printf("   TV-B4: causal, score(j)=j+1, k=2 -> rows 0..3 keep");
    for (index_t i = 0; i < 4; ++i) {
      std::printf(" {");
      for (index_t r = 0; r < c.counts[static_cast<std::size_t>(i)]; ++r)
        std::printf(r ? ",%d" : "%d", c.indices(i, r));
      std::printf("}");
    }
    std::printf("  (%td rows had <= k keys: bypassed)\n\n", c.bypassed_rows);
  }

  // 2. A 4096-token sequence: 8 query heads, 2 KV heads, head_dim 64; indexer 4 heads x 32, k = 512.
  const index_t tokens = 4096, top_k = 512;
  const workloads::DsaInputs in = workloads::dsa_inputs(tokens, 8, 2, 64, 4, 32, 11);
  Tensor<float> scores;
  TopK sel;
  AttentionOutput full, gathered_out, dense;
  const double t_index =
      best_ms(2, [&] { scores = index_scores(in.index_q.view(), in.index_k.view(), in.index_w.view()); });
  const double t_select = best_ms(2, [&] { sel = select_topk(scores.view(), top_k, TopKOrder::by_index); });
  const double t_fused = best_ms(2, [&] {
    sel = indexer_topk(in.index_q.view(), in.index_k.view(), in.index_w.view(), top_k, TopKOrder::by_index);
  });
  const TopKLayout layout = topk_layout(sel);
  const double t_full =
      best_ms(2, [&] { full = attend(in.q.view(), in.k.view(), in.v.view(), in.scale, topk_mask(layout)); });
  const double t_gathered = best_ms(2, [&] {
    const GatheredSelection g = gather_selection(sel, in.k.view(), in.v.view());
    gathered_out = attend_thd(in.q.view(), g.k.view(), g.v.view(), g.table(), in.scale, GatheredSelectionMask{&g});
  });
  const double t_dense =
      best_ms(2, [&] { dense = attend(in.q.view(), in.k.view(), in.v.view(), in.scale, CausalMask{}); });
  const PathEstimate plan = estimate_path(sel);
  std::printf("2. %td tokens, top-%td: %td rows bypassed (<= k causal keys).\n", tokens, top_k, sel.bypassed_rows);
  std::printf(
      "   The selection keeps recent keys and a few heavy hitters, so it clusters: in place it touches %td\n"
      "   64-key tiles per 64-query block on average, gathered it would fill %td. Chosen path: %s.\n",
      plan.full_tiles / (tokens / 64), plan.gathered_tiles / (tokens / 64),
      plan.choice == Path::full ? "TopKMask over the full K/V" : "gathered per block");

  // Parity against the brute-force oracle on the last 256 queries (materialized scores, double softmax).
  const index_t rows = 256, first = tokens - rows;
  const Tensor<std::uint8_t> mask = mask_by_scatter(sel.indices.view(), tokens);
  const auto oracle = reference_attention(in.q.view().slice(0, first, tokens), in.k.view(), in.v.view(), in.scale,
                                          [&](index_t, index_t i, index_t j) { return mask(first + i, j) != 0; });
  float err_full = 0.0f, err_gathered = 0.0f;
  for (index_t i = 0; i < rows; ++i) {
    for (index_t h = 0; h < 8; ++h) {
      for (index_t c = 0; c < 64; ++c) {
        err_full = std::max(err_full, std::fabs(full.out(first + i, h, c) - oracle.out(i, h, c)));
        err_gathered = std::max(err_gathered, std::fabs(gathered_out.out(first + i, h, c) - oracle.out(i, h, c)));
      }
    }
  }
  std::printf("   engine vs oracle (last %td queries): max |out error| %.1e in place, %.1e gathered\n", rows, err_full,
              err_gathered);
  const double t_attn = std::min(t_full, t_gathered);
  std::printf("   indexer: scores %.1f ms + top-k %.1f ms, or %.1f ms fused (no [t, s] score matrix)\n", t_index,
              t_select, t_fused);
  std::printf("   attention in place %.1f ms, gathered (copy included) %.1f ms\n", t_full, t_gathered);
  std::printf(
      "   dense causal attention %.1f ms -> top-k attention %.1fx faster; %.2fx end to end with the indexer\n\n",
      t_dense, t_dense / t_attn, t_dense / (t_fused + t_attn));

  // 3. Building the 0/1 mask from the indices: scatter vs broadcast-compare (MaxText before PR #4437).
  Tensor<std::uint8_t> a, b;
  const auto few = sel.indices.view().slice(0, 0, 1024);
  const double t_scatter = best_ms(3, [&] { a = mask_by_scatter(few, tokens); });
  const double t_broadcast = best_ms(1, [&] { b = mask_by_broadcast_compare(few, tokens); });
  std::printf(
      "3. Mask for 1024 rows x %td keys, k=%td: scatter %.2f ms, broadcast-compare %.1f ms (%.0fx); "
      "identical: %s\n",
      tokens, top_k, t_scatter, t_broadcast, t_broadcast / t_scatter, a == b ? "yes" : "NO");
  return 0;
}
