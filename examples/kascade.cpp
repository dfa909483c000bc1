// Kascade (arXiv 2512.16391): an anchor layer finds, for every 32-query tile
// and KV group, the top-k keys by pooled attention mass over the keys before
// the tile; the following layers reuse those keys (through a head map) and
// attend only to them plus their own tile, causally. Reports the output error
// against dense attention and the speedup, on a 3-layer synthetic model whose
// attention concentrates on per-group heavy-hitter keys.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <vector>

#include "seqattn/scenarios.hpp"

#include "support/timing.hpp"

using namespace seqattn;
using namespace seqattn::scenarios;
using seqattn::examples::best_ms;
using namespace seqattn::scenarios::kascade;

namespace {

double relative_error(const Tensor<float>& got, const Tensor<float>& want) {
  double num = 0.0, den = 0.0;
  for (index_t i = 0; i < got.size(); ++i) {
    const double d = static_cast<double>(got.data()[i]) - want.data()[i];
    num += d * d;
    den += static_cast<double>(want.data()[i]) * want.data()[i];
  }
  return std::sqrt(num / den);
}

}  // namespace

int main() {
  const index_t tokens = 4096, heads = 8, kv_heads = 2, dim = 64;
  const Config config;  // tile 32, 10% of keys, at least 128
  std::printf("Kascade on %td tokens, %td query heads in %td KV groups, head_dim %td.\n", tokens, heads, kv_heads, dim);
  std::printf(
      "Budget: min(max(128, 10%% of %td), %td) - 32 = %td selected keys per tile and group "
      "(TV-C3: 8192 -> %td, 1000 -> %td, 100 -> %td)\n\n",
      tokens, tokens, budget(tokens, config), budget(8192), budget(1000), budget(100));
  const auto layers = workloads::kascade_layers(tokens, heads, kv_heads, dim, 3, 5);
  const float scale = 1.0f / std::sqrt(static_cast<float>(dim));

  // Layer 0: dense, and the anchor that chooses the keys.
  Selection anchor;
  const double t_anchor =
      best_ms(1, [&] { anchor = select_anchor(layers[0].q.view(), layers[0].k.view(), scale, config); });
  std::printf("Layer 0 (dense, anchor): pooled-mass top-k for %td tiles x %td groups in %.0f ms\n",
              anchor.tiling.num_tiles(), anchor.groups, t_anchor);

  for (std::size_t l = 1; l < layers.size(); ++l) {
    const workloads::KascadeLayer& L = layers[l];
    // Offline calibration: which anchor group's keys carry this layer's attention.
    const Tensor<float> pooled = pooled_mass(L.q.view(), L.k.view(), scale, config.tile);
    const std::vector<index_t> head_map = calibrate_head_map(anchor, pooled.view());

    AttentionOutput dense, sparse;
    Gathered g;
    const double t_dense = best_ms(2, [&] { dense = attend(L.q.view(), L.k.view(), L.v.view(), scale, CausalMask{}); });
    const double t_gather = best_ms(2, [&] { g = gather(anchor, head_map, L.k.view(), L.v.view()); });
    const double t_sparse = best_ms(2, [&] { sparse = sparse_attention(L.q.view(), g, scale); });

    // Parity: the last 64 queries against the brute-force oracle of the paper's key sets.
    const index_t rows = 64, first = tokens - rows;
    const auto oracle = reference_attention(L.q.view().slice(0, first, tokens), L.k.view(), L.v.view(), scale,
                                            [&](index_t h, index_t i, index_t j) {
                                              return reuse_allowed(anchor, head_map, heads / kv_heads, h, first + i, j);
                                            });
    float parity = 0.0f;
    for (index_t i = 0; i < rows; ++i) {
      for (index_t h = 0; h < heads; ++h) {
        for (index_t c = 0; c < dim; ++c) {
          parity = std::max(parity, std::fabs(sparse.out(first + i, h, c) - oracle.out(i, h, c)));
        }
      }
    }
    std::printf("Layer %zu (reuse of 0): head map [", l);
    for (std::size_t g2 = 0; g2 < head_map.size(); ++g2) std::printf(g2 ? " %td" : "%td", head_map[g2]);
    std::printf("] (planted: [");
    for (index_t g2 = 0; g2 < kv_heads; ++g2)
      std::printf(g2 ? " %td" : "%td", (g2 + static_cast<index_t>(l)) % kv_heads);
    std::printf("])\n");
    std::printf("  keys read per query: %.0f of %.0f on average (dense causal)\n",
                static_cast<double>(g.k.extent(0)) / static_cast<double>(anchor.tiling.num_tiles()),
                static_cast<double>(tokens + 1) / 2.0);
    std::printf("  error vs dense attention: relative L2 %.3f; engine vs oracle on the same key sets: %.1e\n",
                relative_error(sparse.out, dense.out), parity);
    std::printf(
        "  dense %.1f ms | gather %.1f ms + sparse attention %.1f ms -> speedup %.1fx (%.1fx without "
        "the gather)\n",
        t_dense, t_gather, t_sparse, t_dense / (t_gather + t_sparse), t_dense / t_sparse);
  }
  return 0;
}
