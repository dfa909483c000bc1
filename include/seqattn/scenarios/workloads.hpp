// Seeded synthetic inputs with the structure the scenarios exploit, shared by
// the examples, the benchmarks and the tour. Random Gaussian q/k would give
// flat attention, for which no top-k method is meaningful; these generators
// plant the two patterns real models show: a few "heavy hitter" keys that many
// queries favour, and recency.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "seqattn/core/tensor.hpp"
#include "seqattn/scenarios/random.hpp"

namespace seqattn::scenarios::workloads {

// Items of random tokens in [0, delimiter) with lengths uniform in [0, max_len].
inline std::vector<std::vector<std::int32_t>> random_items(SplitMix64& rng, index_t n, index_t max_len,
                                                           std::int32_t delimiter) {
  std::vector<std::vector<std::int32_t>> items(static_cast<std::size_t>(n));
  for (auto& item : items) {
    for (index_t i = 0, len = rng.below(max_len + 1); i < len; ++i) {
      item.push_back(static_cast<std::int32_t>(rng.below(delimiter)));
    }
  }
  return items;
}

struct DsaInputs {
  Tensor<float> q, k, v;                    // main attention [t, H, D], [t, Hkv, D]
  Tensor<float> index_q, index_k, index_w;  // indexer [t, h, d], [t, d], [t, h]
  float scale = 1.0f;
};

// Self-attention over `tokens` tokens. The indexer scores keys by recency
// (a ramp of one unit per 64 keys), plus 4 units for ~2% heavy-hitter keys,
// plus noise (std ~0.5 units): each row's top-k is the heavy hitters and its
// most recent keys, as trained indexers tend to pick.
inline DsaInputs dsa_inputs(index_t tokens, index_t heads, index_t kv_heads, index_t head_dim, index_t index_heads,
                            index_t index_dim, std::uint64_t seed) {
  SplitMix64 rng(seed);
  DsaInputs in;
  in.q = random_normal(seqattn::detail::make_extents({tokens, heads, head_dim}), rng);
  in.k = random_normal(seqattn::detail::make_extents({tokens, kv_heads, head_dim}), rng);
  in.v = random_normal(seqattn::detail::make_extents({tokens, kv_heads, head_dim}), rng);
  in.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim)));
  in.index_q = random_normal(seqattn::detail::make_extents({tokens, index_heads, index_dim}), rng, 0.3f);
  in.index_k = random_normal(seqattn::detail::make_extents({tokens, index_dim}), rng, 0.3f);
  in.index_w = Tensor<float>(seqattn::detail::make_extents({tokens, index_heads}));
  for (index_t j = 0; j < tokens; ++j) {
    in.index_k(j, index_t{0}) = static_cast<float>(j) / 64.0f;
    in.index_k(j, index_t{1}) = rng.below(50) == 0 ? 4.0f : 0.0f;
  }
  for (index_t i = 0; i < tokens; ++i) {
    for (index_t h = 0; h < index_heads; ++h) {
      in.index_q(i, h, index_t{0}) = 1.0f;
      in.index_q(i, h, index_t{1}) = 1.0f;
      in.index_w(i, h) = static_cast<float>(1.0 / static_cast<double>(index_heads));
    }
  }
  return in;
}

struct KascadeLayer {
  Tensor<float> q, k, v;  // [L, H, D], [L, Hkv, D]
};

// `layers` layers of self-attention over `tokens` tokens. Every KV group g has
// its own heavy-hitter keys (~5% of positions) sharing a direction u_g that
// its queries lean towards (logit boost ~6): most attention mass sits on them,
// the rest spreads thinly. Layer l > 0 is layer 0 with its KV groups permuted
// by rotation (group g takes layer 0's group (g + l) % Hkv) plus noise, so
// reuse layers need a head map to find their anchor group.
inline std::vector<KascadeLayer> kascade_layers(index_t tokens, index_t heads, index_t kv_heads, index_t head_dim,
                                                index_t layers, std::uint64_t seed, float noise = 0.3f) {
  SplitMix64 rng(seed);
  const index_t group = heads / kv_heads;
  std::vector<Tensor<float>> dir;  // u_g, unit vectors
  for (index_t g = 0; g < kv_heads; ++g) {
    Tensor<float> u = random_normal(seqattn::detail::make_extents({head_dim}), rng);
    double n = 0.0;
    for (float x : u.values()) n += static_cast<double>(x) * x;
    for (float& x : u.values()) x = static_cast<float>(x / std::sqrt(n));
    dir.push_back(std::move(u));
  }
  const float boost = std::sqrt(6.0f * std::sqrt(static_cast<float>(head_dim)));  // boost^2 / sqrt(D) = 6
  KascadeLayer base{random_normal(seqattn::detail::make_extents({tokens, heads, head_dim}), rng),
                    random_normal(seqattn::detail::make_extents({tokens, kv_heads, head_dim}), rng),
                    random_normal(seqattn::detail::make_extents({tokens, kv_heads, head_dim}), rng)};
  for (index_t j = 0; j < tokens; ++j) {
    for (index_t g = 0; g < kv_heads; ++g) {
      if (rng.below(20) != 0) continue;
      for (index_t c = 0; c < head_dim; ++c) base.k(j, g, c) += boost * dir[static_cast<std::size_t>(g)](c);
    }
  }
  for (index_t i = 0; i < tokens; ++i) {
    for (index_t h = 0; h < heads; ++h) {
      for (index_t c = 0; c < head_dim; ++c) base.q(i, h, c) += boost * dir[static_cast<std::size_t>(h / group)](c);
    }
  }
  std::vector<KascadeLayer> out;
  for (index_t l = 0; l < layers; ++l) {
    KascadeLayer layer{Tensor<float>(base.q.shape()), Tensor<float>(base.k.shape()), Tensor<float>(base.v.shape())};
    for (index_t i = 0; i < tokens; ++i) {
      for (index_t h = 0; h < heads; ++h) {
        const index_t src = ((h / group + l) % kv_heads) * group + h % group;
        for (index_t c = 0; c < head_dim; ++c) {
          layer.q(i, h, c) = base.q(i, src, c) + (l ? noise * rng.normal() : 0.0f);
        }
      }
      for (index_t g = 0; g < kv_heads; ++g) {
        const index_t src = (g + l) % kv_heads;
        for (index_t c = 0; c < head_dim; ++c) {
          layer.k(i, g, c) = base.k(i, src, c) + (l ? noise * rng.normal() : 0.0f);
          layer.v(i, g, c) = l ? rng.normal() : base.v(i, g, c);
        }
      }
    }
    out.push_back(std::move(layer));
  }
  return out;
}

}  // namespace seqattn::scenarios::workloads
