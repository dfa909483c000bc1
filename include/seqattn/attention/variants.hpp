// Score variants: how a raw score q.k becomes the logit the softmax sees.
//
//   logit = variant.score(scale * q.k, where)   then the mask, then the
//   softmax, with an optional per-head sink logit in every row's denominator.
//
// A variant is a small copyable policy type, passed by value to
// attention_forward. Like mask descriptions it has no required members: each
// hook it defines replaces a default, and the engine and every backend detect
// the hooks at compile time (FlashInfer's variant_helper idea), so adding a
// variant touches no engine file.
//
//   float scale(index_t dk) const                 default 1 / sqrt(dk)
//   float score(float s, const ScoreIndex&) const  default s (no change). The
//       element form is the definition: the reference backend applies it to
//       every allowed score, and the tiled engine applies it to whole tiles.
//   template <class Kernel> void transform_scores(const ScoreTile&) const
//       optional fast form of `score` over a tile of the CPU engine; must
//       agree with `score` (tests check it). It may use the Kernel's element-
//       wise operations (softcap's tanh).
//   float score_grad(float s, const ScoreIndex&) const
//       d score / d s at s: what the backward pass needs from a variant
//       with a score hook (attention_backward refuses a variant that has
//       `score` but no `score_grad` at compile time). 1 for additive ones.
//   float sink(index_t head) const [+ bool has_sink() const]
//       a logit per query head that joins every row's denominator without a
//       value (attention sinks); has_sink() may switch it off at run time.
//   void check(const AttentionShape&) const      throws for a shape it cannot
//       serve (e.g. a slope per head).
//
// `score` sees the scaled score of an allowed (q, kv) pair; it is not called
// for masked pairs. Returning -inf excludes a pair like a mask would.
//
// Built in (namespace seqattn::variants): Default, Scale, Softcap, Sinks,
// Alibi, Bias (with BiasTensor, a bias read from a strided tensor), ScoreMod,
// and Chain to apply several in order.
//
// On the GPU (backends::Cuda) a score hook runs in device code: Bias's
// function, ScoreMod's fn and grad, and the score / score_grad of a variant
// of your own must be callable there (a functor whose call operator is
// SEQATTN_HOST_DEVICE, seqattn/core/host_device.hpp; ScoreIndex is a plain
// aggregate that device code receives as is); the header comment of
// backends/cuda.cuh lists the rules.
#pragma once

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstdlib>
#include <span>
#include <tuple>
#include <type_traits>
#include <utility>

#include "seqattn/attention/inputs.hpp"
#include "seqattn/core/error.hpp"
#include "seqattn/core/execution.hpp"
#include "seqattn/core/host_device.hpp"
#include "seqattn/core/tensor.hpp"

namespace seqattn {

// Where one score sits: the sequence, the query head, the sequence-local query
// and key, and the sequence's lengths (for bottom-right aligned positions).
struct ScoreIndex {
  index_t batch = 0;
  index_t head = 0;
  index_t q = 0;
  index_t kv = 0;
  index_t q_len = 0;
  index_t kv_len = 0;
};

// A tile of scores of the CPU tiled engine: the score at lane r and column j
// is scores[j * stride + r]. In the forward layout lanes are rows (a query of
// some head: row_q[r], row_head[r]) and columns are keys kv_begin + j; with
// keys_on_lanes (the backward pass's key-major tiles) lanes are keys
// kv_begin + r and columns are rows (row_q[j], row_head[j]). Lanes
// [rows, rows_padded) are padding: computing on them is allowed, their
// results are dropped.
struct ScoreTile {
  float* scores = nullptr;
  index_t stride = 0;
  index_t rows = 0;  // lanes
  index_t rows_padded = 0;
  index_t cols = 0;
  const index_t* row_q = nullptr;     // query row -> sequence-local query
  const index_t* row_head = nullptr;  // query row -> query head
  index_t batch = 0;
  index_t kv_begin = 0;
  index_t q_len = 0;
  index_t kv_len = 0;
  bool keys_on_lanes = false;

  float& at(index_t r, index_t j) const { return scores[j * stride + r]; }
  ScoreIndex index(index_t r, index_t j) const {
    if (keys_on_lanes) return {batch, row_head[j], row_q[j], kv_begin + r, q_len, kv_len};
    return {batch, row_head[r], row_q[r], kv_begin + j, q_len, kv_len};
  }
};

template <class V>
concept HasScaleHook = requires(const V& v, index_t dk) {
  { v.scale(dk) } -> std::convertible_to<float>;
};
template <class V>
concept HasScoreHook = requires(const V& v, float s, const ScoreIndex& at) {
  { v.score(s, at) } -> std::convertible_to<float>;
};
template <class V>
concept HasScoreGradHook = requires(const V& v, float s, const ScoreIndex& at) {
  { v.score_grad(s, at) } -> std::convertible_to<float>;
};
template <class V, class Kernel>
concept HasTileScoreHook = requires(const V& v, const ScoreTile& t) {
  v.template transform_scores<Kernel>(t);
};
template <class V>
concept HasSinkHook = requires(const V& v, index_t head) {
  { v.sink(head) } -> std::convertible_to<float>;
};
template <class V>
concept HasVariantCheck = requires(const V& v, const AttentionShape& shape) {
  v.check(shape);
};

// Anything copyable that is not an execution policy can be a variant: every
// hook is optional.
template <class V>
concept ScoreVariant = std::copy_constructible<V> && !ExecutionPolicy<V>;

// ---- What the engine and the backends call: the hooks or their defaults.
namespace detail {

template <class V>
float variant_scale(const V& v, index_t dk) {
  if constexpr (HasScaleHook<V>) {
    return v.scale(dk);
  } else {
    return 1.0f / std::sqrt(static_cast<float>(dk));
  }
}

template <class V>
bool variant_has_sink(const V& v) {
  if constexpr (!HasSinkHook<V>) {
    return false;
  } else if constexpr (requires { v.has_sink(); }) {
    return v.has_sink();
  } else {
    return true;
  }
}

template <class V>
void check_variant(const V& v, const AttentionShape& shape) {
  if constexpr (HasVariantCheck<V>) v.check(shape);
  detail::require(std::isfinite(variant_scale(v, shape.dk)), "attention: scale must be finite, got ",
                  variant_scale(v, shape.dk));
  // Like scale and softcap: a NaN or infinite sink would turn every row of
  // its head into NaN or zero. Every variant's sinks, Sinks' or a custom one's.
  if constexpr (HasSinkHook<V>) {
    if (variant_has_sink(v)) {
      for (index_t h = 0; h < shape.heads; ++h) {
        const float sink = v.sink(h);
        detail::require(std::isfinite(sink), "attention: the sink logit of head ", h, " must be finite, got ", sink);
      }
    }
  }
}

// Element form over a tile, for variants without a tile hook.
template <class V>
void transform_scores_per_element(const V& v, const ScoreTile& t) {
  for (index_t j = 0; j < t.cols; ++j) {
    for (index_t r = 0; r < t.rows; ++r) t.at(r, j) = v.score(t.at(r, j), t.index(r, j));
  }
}

template <class Kernel, class V>
void transform_scores(const V& v, const ScoreTile& t) {
  if constexpr (HasTileScoreHook<V, Kernel>) {
    v.template transform_scores<Kernel>(t);
  } else if constexpr (HasScoreHook<V>) {
    transform_scores_per_element(v, t);
  }
}

}  // namespace detail

namespace variants {

// softmax(q.k / sqrt(dk)): no hooks at all.
struct Default {};

// A fixed scale instead of 1 / sqrt(dk).
struct Scale {
  float value = 1.0f;
  float scale(index_t) const { return value; }
};

// Logit soft-capping (Gemma 2, Grok): s -> cap * tanh(s / cap). cap = 0 is off.
struct Softcap {
  float cap = 0.0f;

  float score(float s, const ScoreIndex&) const { return cap > 0.0f ? cap * std::tanh(s / cap) : s; }
  float score_grad(float s, const ScoreIndex&) const {
    if (!(cap > 0.0f)) return 1.0f;
    const float t = std::tanh(s / cap);
    return 1.0f - t * t;
  }
  template <class Kernel>
  void transform_scores(const ScoreTile& t) const {
    if (!(cap > 0.0f)) return;
    const float inv = 1.0f / cap;
    for (index_t j = 0; j < t.cols; ++j) {
      float* col = t.scores + j * t.stride;
      for (index_t r = 0; r < t.rows_padded; ++r) col[r] *= inv;
    }
    Kernel::softcap(t.scores, t.cols, t.rows_padded, cap);
  }
  void check(const AttentionShape&) const {
    detail::require(std::isfinite(cap) && cap >= 0.0f,
                    "attention: softcap must be finite and >= 0 (0 disables it), got ", cap);
  }
};

// Attention sinks (gpt-oss): one logit per query head in every row's
// denominator, with no value. Empty: off.
struct Sinks {
  std::span<const float> logits;

  bool has_sink() const { return !logits.empty(); }
  float sink(index_t head) const { return logits[static_cast<std::size_t>(head)]; }
  void check(const AttentionShape& shape) const {
    detail::require(logits.empty() || static_cast<index_t>(logits.size()) == shape.heads,
                    "attention: sinks must hold one logit per query head (", shape.heads, "), got ", logits.size());
  }
};

// ALiBi with FlashAttention-2's convention: head h adds
// -slopes[h] * |q + kv_len - q_len - kv|, the distance to the key at the
// query's own position with queries aligned to the end of the keys (the
// bottom-right alignment of decoding and of causal masks over a KV cache).
struct Alibi {
  std::span<const float> slopes;

  float score(float s, const ScoreIndex& at) const {
    const index_t distance = std::abs(at.q + at.kv_len - at.q_len - at.kv);
    return s - slopes[static_cast<std::size_t>(at.head)] * static_cast<float>(distance);
  }
  float score_grad(float, const ScoreIndex&) const { return 1.0f; }
  void check(const AttentionShape& shape) const {
    detail::require(static_cast<index_t>(slopes.size()) == shape.heads,
                    "attention: ALiBi needs one slope per query head (", shape.heads, "), got ", slopes.size());
  }
};

// An additive bias given as a function: s + bias(batch, head, q, kv), for
// example a BiasTensor. A function with a check(const AttentionShape&) member
// (BiasTensor's) is checked against the call's shape.
template <class F>
struct Bias {
  F bias;
  float score(float s, const ScoreIndex& at) const {
    return s + static_cast<float>(bias(at.batch, at.head, at.q, at.kv));
  }
  float score_grad(float, const ScoreIndex&) const { return 1.0f; }
  void check(const AttentionShape& shape) const requires HasVariantCheck<F> { bias.check(shape); }
};
template <class F>
Bias(F) -> Bias<F>;

// A bias read in place from a rank-4 fp32 view [batch, heads, q, kv] for
// Bias: the value of (batch b, query head h, sequence-local query q and key
// kv). An extent of 1 in the batch or head dimension broadcasts (its stride is
// ignored); the q and kv extents must cover the longest sequence (THD: index
// by segment, sequence-local positions). Host memory for the CPU backends,
// device memory for backends::Cuda (checked before anything runs). Masked
// pairs are never read; -inf entries exclude their pair.
struct BiasTensor {
  const float* data = nullptr;
  index_t batch = 0, heads = 0, q = 0, kv = 0;                             // extents
  index_t batch_stride = 0, head_stride = 0, q_stride = 0, kv_stride = 0;  // 0 where broadcast

  BiasTensor() = default;
  explicit BiasTensor(TensorView<const float> v) {
    detail::require(v.rank() == 4, "variants::BiasTensor: the bias must have rank 4 [batch, heads, q, kv], got shape ",
                    v.shape());
    data = v.data();
    batch = v.extent(0);
    heads = v.extent(1);
    q = v.extent(2);
    kv = v.extent(3);
    batch_stride = batch == 1 ? 0 : v.stride(0);
    head_stride = heads == 1 ? 0 : v.stride(1);
    q_stride = v.stride(2);
    kv_stride = v.stride(3);
  }
  SEQATTN_HOST_DEVICE float operator()(index_t b, index_t h, index_t qi, index_t k) const {
    return data[b * batch_stride + h * head_stride + qi * q_stride + k * kv_stride];
  }
  void check(const AttentionShape& shape) const {
    index_t max_kv = 0;
    for (const index_t n : shape.lengths.kv) max_kv = std::max(max_kv, n);
    detail::require((batch == 1 || batch == shape.batch()) && (heads == 1 || heads == shape.heads) &&
                        q >= shape.max_q_len() && kv >= max_kv,
                    "variants::BiasTensor: the bias of shape (", batch, ", ", heads, ", ", q, ", ", kv,
                    ") does not cover the call: it needs (", shape.batch(), " or 1, ", shape.heads,
                    " or 1, >= ", shape.max_q_len(), ", >= ", max_kv, ") for ", shape);
    detail::require(data != nullptr || (shape.max_q_len() == 0 || max_kv == 0),
                    "variants::BiasTensor: the bias has no data (", shape, ")");
  }
};

// Any score modification, in the spirit of flex_attention's score_mod:
// fn(score, batch, head, q, kv) -> new score (-inf excludes the pair), and
// optionally its derivative grad(score, batch, head, q, kv) -> d new / d score
// for the backward pass.
struct NoScoreGrad {};

template <class F, class G = NoScoreGrad>
struct ScoreMod {
  F fn;
  G grad{};
  float score(float s, const ScoreIndex& at) const { return static_cast<float>(fn(s, at.batch, at.head, at.q, at.kv)); }
  float score_grad(float s, const ScoreIndex& at) const requires(!std::is_same_v<G, NoScoreGrad>) {
    return static_cast<float>(grad(s, at.batch, at.head, at.q, at.kv));
  }
};
template <class F>
ScoreMod(F) -> ScoreMod<F>;
template <class F, class G>
ScoreMod(F, G) -> ScoreMod<F, G>;

// Several variants applied in order: scale from the first that sets one,
// score hooks one after another, at most one sink.
template <class... Vs>
struct Chain {
  static_assert((0 + ... + static_cast<int>(HasSinkHook<Vs>)) <= 1, "variants::Chain: at most one part may add sinks");
  std::tuple<Vs...> parts;

  float scale(index_t dk) const requires(HasScaleHook<Vs> || ...) {
    float s = 0.0f;
    bool found = false;
    std::apply(
        [&](const auto&... v) {
          auto one = [&](const auto& part) {
            if constexpr (HasScaleHook<std::decay_t<decltype(part)>>) {
              if (!found) s = part.scale(dk);
              found = true;
            }
          };
          (one(v), ...);
        },
        parts);
    return s;
  }
  float score(float s, const ScoreIndex& at) const requires(HasScoreHook<Vs> || ...) {
    std::apply(
        [&](const auto&... v) {
          auto one = [&](const auto& part) {
            if constexpr (HasScoreHook<std::decay_t<decltype(part)>>) s = part.score(s, at);
          };
          (one(v), ...);
        },
        parts);
    return s;
  }
  float score_grad(float s, const ScoreIndex& at) const
      requires((HasScoreHook<Vs> || ...) && ((!HasScoreHook<Vs> || HasScoreGradHook<Vs>)&&...)) {
    float g = 1.0f;
    std::apply(
        [&](const auto&... v) {
          auto one = [&](const auto& part) {
            if constexpr (HasScoreHook<std::decay_t<decltype(part)>>) {
              g *= part.score_grad(s, at);
              s = part.score(s, at);
            }
          };
          (one(v), ...);
        },
        parts);
    return g;
  }
  template <class Kernel>
  void transform_scores(const ScoreTile& t) const requires(HasScoreHook<Vs> || ...) {
    std::apply([&](const auto&... v) { (detail::transform_scores<Kernel>(v, t), ...); }, parts);
  }
  bool has_sink() const requires(HasSinkHook<Vs> || ...) {
    bool any = false;
    std::apply([&](const auto&... v) { ((any = any || detail::variant_has_sink(v)), ...); }, parts);
    return any;
  }
  float sink(index_t head) const requires(HasSinkHook<Vs> || ...) {
    float s = 0.0f;
    std::apply(
        [&](const auto&... v) {
          auto one = [&](const auto& part) {
            if constexpr (HasSinkHook<std::decay_t<decltype(part)>>) s = part.sink(head);
          };
          (one(v), ...);
        },
        parts);
    return s;
  }
  void check(const AttentionShape& shape) const {
    std::apply(
        [&](const auto&... v) {
          auto one = [&](const auto& part) {
            if constexpr (HasVariantCheck<std::decay_t<decltype(part)>>) part.check(shape);
          };
          (one(v), ...);
        },
        parts);
  }
};

template <class... Vs>
Chain<Vs...> chain(Vs... vs) {
  return {std::tuple<Vs...>{std::move(vs)...}};
}

// The variant the one-call API builds from AttentionOptions: scale (NaN:
// 1 / sqrt(dk)), soft-cap (0: off) and sinks (empty: off), in that order.
struct Standard {
  float scale_value = std::numeric_limits<float>::quiet_NaN();
  Softcap softcap;
  Sinks sinks;

  float scale(index_t dk) const {
    return std::isnan(scale_value) ? 1.0f / std::sqrt(static_cast<float>(dk)) : scale_value;
  }
  float score(float s, const ScoreIndex& at) const { return softcap.score(s, at); }
  float score_grad(float s, const ScoreIndex& at) const { return softcap.score_grad(s, at); }
  template <class Kernel>
  void transform_scores(const ScoreTile& t) const {
    softcap.transform_scores<Kernel>(t);
  }
  bool has_sink() const { return sinks.has_sink(); }
  float sink(index_t head) const { return sinks.sink(head); }
  void check(const AttentionShape& shape) const {
    softcap.check(shape);
    sinks.check(shape);
  }
};

}  // namespace variants
}  // namespace seqattn
