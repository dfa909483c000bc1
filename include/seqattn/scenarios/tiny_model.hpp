// A deterministic one-layer attention model: enough of a language model to
// turn attention outputs into next-token log-probabilities, so the scoring
// scenarios can be checked end to end (a packed multi-item request must score
// every item exactly as the serial request `query ‖ d ‖ item` does).
//
//   x      = embedding[token]                              [T, dim]
//   q, k   = RoPE(x Wq), RoPE(x Wk) at the given positions  [T, H, hd], [T, Hkv, hd]
//   v      = x Wv                                          [T, Hkv, hd]
//   o      = attention(q, k, v; mask)      (supplied by the caller)
//   y      = x + o Wo
//   logp   = log_softmax(y Whead)                          [T, vocab]
//
// RoPE is the non-interleaved ("rotate half") form. Weights come from
// SplitMix64(seed), so a seed names the model on every platform.
#pragma once

#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include "seqattn/core/error.hpp"
#include "seqattn/core/tensor.hpp"
#include "seqattn/scenarios/random.hpp"

namespace seqattn::scenarios {

struct TinyModelConfig {
  index_t vocab = 64;
  index_t dim = 32;
  index_t heads = 4;
  index_t kv_heads = 2;
  index_t head_dim = 16;
  float rope_theta = 10000.0f;
  std::uint64_t seed = 2026;
};

struct Projections {
  Tensor<float> q;  // [T, heads, head_dim]
  Tensor<float> k;  // [T, kv_heads, head_dim]
  Tensor<float> v;  // [T, kv_heads, head_dim]
};

class TinyModel {
 public:
  explicit TinyModel(const TinyModelConfig& config = {}) : c_(config) {
    seqattn::detail::require(c_.vocab > 0 && c_.dim > 0 && c_.heads > 0 && c_.kv_heads > 0 && c_.head_dim > 0,
                             "TinyModel: every size must be positive");
    seqattn::detail::require(c_.heads % c_.kv_heads == 0, "TinyModel: heads (", c_.heads,
                             ") must be a multiple of kv_heads (", c_.kv_heads, ")");
    seqattn::detail::require(c_.head_dim % 2 == 0, "TinyModel: head_dim (", c_.head_dim, ") must be even for RoPE");
    SplitMix64 rng(c_.seed);
    const auto in_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c_.dim)));
    embedding_ = random_normal(seqattn::detail::make_extents({c_.vocab, c_.dim}), rng);
    wq_ = random_normal(seqattn::detail::make_extents({c_.dim, c_.heads * c_.head_dim}), rng, in_scale);
    wk_ = random_normal(seqattn::detail::make_extents({c_.dim, c_.kv_heads * c_.head_dim}), rng, in_scale);
    wv_ = random_normal(seqattn::detail::make_extents({c_.dim, c_.kv_heads * c_.head_dim}), rng, in_scale);
    wo_ = random_normal(seqattn::detail::make_extents({c_.heads * c_.head_dim, c_.dim}), rng,
                        static_cast<float>(1.0 / std::sqrt(static_cast<double>(c_.heads * c_.head_dim))));
    whead_ = random_normal(seqattn::detail::make_extents({c_.dim, c_.vocab}), rng, in_scale);
  }

  const TinyModelConfig& config() const { return c_; }
  float softmax_scale() const { return static_cast<float>(1.0 / std::sqrt(static_cast<double>(c_.head_dim))); }

  // q, k, v of every token; positions are the RoPE positions (one per token).
  Projections project(std::span<const std::int32_t> tokens, std::span<const std::int32_t> positions) const {
    check_tokens(tokens);
    seqattn::detail::require(tokens.size() == positions.size(), "TinyModel::project: ", tokens.size(), " tokens but ",
                             positions.size(), " positions");
    const auto t = static_cast<index_t>(tokens.size());
    Projections p{Tensor<float>(seqattn::detail::make_extents({t, c_.heads, c_.head_dim})),
                  Tensor<float>(seqattn::detail::make_extents({t, c_.kv_heads, c_.head_dim})),
                  Tensor<float>(seqattn::detail::make_extents({t, c_.kv_heads, c_.head_dim}))};
    for (index_t i = 0; i < t; ++i) {
      const float* x = embedding_.data() + tokens[static_cast<std::size_t>(i)] * c_.dim;
      matvec(x, wq_, p.q.data() + i * c_.heads * c_.head_dim);
      matvec(x, wk_, p.k.data() + i * c_.kv_heads * c_.head_dim);
      matvec(x, wv_, p.v.data() + i * c_.kv_heads * c_.head_dim);
      const auto pos = static_cast<double>(positions[static_cast<std::size_t>(i)]);
      for (index_t h = 0; h < c_.heads; ++h) rope(p.q.data() + (i * c_.heads + h) * c_.head_dim, pos);
      for (index_t h = 0; h < c_.kv_heads; ++h) rope(p.k.data() + (i * c_.kv_heads + h) * c_.head_dim, pos);
    }
    return p;
  }

  // Next-token log-probabilities [rows.size(), vocab] at the given rows, from
  // the attention output `attn` [T, heads, head_dim] of the same tokens.
  Tensor<float> logprobs(std::span<const std::int32_t> tokens, const Tensor<float>& attn,
                         std::span<const index_t> rows) const {
    check_tokens(tokens);
    const auto t = static_cast<index_t>(tokens.size());
    seqattn::detail::require_shape(attn.view(), seqattn::detail::make_extents({t, c_.heads, c_.head_dim}),
                                   "TinyModel::logprobs: attn");
    Tensor<float> out(seqattn::detail::make_extents({static_cast<index_t>(rows.size()), c_.vocab}));
    std::vector<float> y(static_cast<std::size_t>(c_.dim));
    for (std::size_t r = 0; r < rows.size(); ++r) {
      const index_t i = rows[r];
      seqattn::detail::require(i >= 0 && i < t, "TinyModel::logprobs: rows[", r, "] = ", i, " outside [0, ", t, ")");
      const float* x = embedding_.data() + tokens[static_cast<std::size_t>(i)] * c_.dim;
      matvec(attn.data() + i * c_.heads * c_.head_dim, wo_, y.data());
      for (index_t c = 0; c < c_.dim; ++c) y[static_cast<std::size_t>(c)] += x[c];
      float* logits = out.data() + static_cast<index_t>(r) * c_.vocab;
      matvec(y.data(), whead_, logits);
      double m = -INFINITY;
      for (index_t c = 0; c < c_.vocab; ++c) m = std::max(m, static_cast<double>(logits[c]));
      double sum = 0.0;
      for (index_t c = 0; c < c_.vocab; ++c) sum += std::exp(static_cast<double>(logits[c]) - m);
      const double lse = m + std::log(sum);
      for (index_t c = 0; c < c_.vocab; ++c) logits[c] = static_cast<float>(static_cast<double>(logits[c]) - lse);
    }
    return out;
  }

 private:
  void check_tokens(std::span<const std::int32_t> tokens) const {
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      seqattn::detail::require(tokens[i] >= 0 && tokens[i] < c_.vocab, "TinyModel: tokens[", i, "] = ", tokens[i],
                               " outside the vocabulary [0, ", c_.vocab, ")");
    }
  }
  // out[n] = sum_c x[c] W[c, n]
  static void matvec(const float* x, const Tensor<float>& w, float* out) {
    const index_t rows = w.extent(0), cols = w.extent(1);
    for (index_t n = 0; n < cols; ++n) out[n] = 0.0f;
    for (index_t c = 0; c < rows; ++c) {
      const float* wr = w.data() + c * cols;
      for (index_t n = 0; n < cols; ++n) out[n] += x[c] * wr[n];
    }
  }
  void rope(float* x, double pos) const {
    const index_t half = c_.head_dim / 2;
    for (index_t i = 0; i < half; ++i) {
      const double freq = std::pow(static_cast<double>(c_.rope_theta),
                                   -2.0 * static_cast<double>(i) / static_cast<double>(c_.head_dim));
      const double a = pos * freq;
      const auto cs = static_cast<float>(std::cos(a)), sn = static_cast<float>(std::sin(a));
      const float x0 = x[i], x1 = x[i + half];
      x[i] = x0 * cs - x1 * sn;
      x[i + half] = x0 * sn + x1 * cs;
    }
  }

  TinyModelConfig c_;
  Tensor<float> embedding_, wq_, wk_, wv_, wo_, whead_;
};

}  // namespace seqattn::scenarios
