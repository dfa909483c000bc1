// Score hooks of the Cuda backend's kernels: how a raw score q.k becomes the
// log2-unit logit the online softmax sees, and (backward) d score / d s. Every
// kernel (forward, decode, the backward key and query passes) is a template
// over one hook type, passed by value as the kernel's second argument:
//
//   PlainScores          scale only: the forward kernels fold the scale into
//                        the exponent and call no hook (the fast path)
//   SoftcapAlibiScores   the built-in device form: softcap(scale * q.k), then
//                        ALiBi, from the fields of the kernel parameters
//   VariantScores<P>     a variant's own score hooks, run in device code: P is one part or
//                        a ScoreParts list (user functors, Bias, ScoreMod,
//                        and the device forms of Softcap and ALiBi in a Chain)
//
// PlainScores and SoftcapAlibiScores are compiled once per configuration
// (cmake/SeqattnCuda.cmake); a VariantScores instantiates the kernels in the
// translation unit that calls attention_forward / attention_backward with
// the variant.
//
// A hook type H provides:
//   static constexpr bool kModifiesScores      false: logits are scale * q.k
//   H::Head head(p, int head, bool valid)       per-(row, head) state, made
//       once outside the element loops (valid: the row exists)
//   float logit(p, const Head&, float raw, const ScorePair&)   log2 units
//   float grad(p, const Head&, float raw, const ScorePair&)    d score / d s
// where p is the kernel's ForwardParams or BackwardParams.
#pragma once

#include <cstddef>
#include <cuda_runtime.h>
#include <type_traits>
#include <utility>

#include "seqattn/attention/variants.hpp"
#include "seqattn/backends/cuda/device_primitives.cuh"

namespace seqattn::cuda::detail {

// One score of a sequence: its index among the call's sequences (ScoreIndex's
// batch), the sequence-local query and key, the sequence's lengths, and
// kv_len - q_len (bottom-right aligned positions: the ALiBi distance is
// |q + offset - kv|).
struct ScorePair {
  int batch, q, kv, q_len, kv_len, offset;
};

// BackwardParams (the backward kernels' parameters) rather than ForwardParams.
template <class P>
inline constexpr bool kBackwardParams = requires(const P& p) {
  p.dsinks;
};

struct PlainScores {
  static constexpr bool kModifiesScores = false;
  struct Head {};
  template <class P>
  __device__ __forceinline__ Head head(const P&, int, bool) const {
    return {};
  }
  template <class P>
  __device__ __forceinline__ float logit(const P& p, const Head&, float raw, const ScorePair&) const {
    return raw * p.scale_log2;
  }
  template <class P>
  __device__ __forceinline__ float grad(const P&, const Head&, float, const ScorePair&) const {
    return 1.0f;
  }
};

// logit = softcap(scale * q.k) - ALiBi in log2 units: p.softcap_log2 (0: no
// softcap), p.softcap_inner = scale / cap, p.scale_log2, p.alibi_slopes
// (null: none). Softcap comes first, as Cuda's variant check requires.
struct SoftcapAlibiScores {
  static constexpr bool kModifiesScores = true;
  struct Head {
    float alibi;  // slope * log2(e); 0 without ALiBi or for a row that does not exist
  };
  template <class P>
  __device__ __forceinline__ Head head(const P& p, int head, bool valid) const {
    return {p.alibi_slopes && valid ? p.alibi_slopes[head] * kLog2e : 0.0f};
  }
  template <class P>
  __device__ __forceinline__ float logit(const P& p, const Head& h, float raw, const ScorePair& at) const {
    float x = p.softcap_log2 != 0.0f ? p.softcap_log2 * tanhf(raw * p.softcap_inner) : raw * p.scale_log2;
    // Both tests are false without slopes; which one guards ALiBi only steers
    // code generation: the forward kernels test the kernel parameter, the
    // backward ones (one head per step) the slope, which keeps each at or
    // below the registers it had before the hooks (ptxas -v).
    bool alibi;
    if constexpr (kBackwardParams<P>) {
      alibi = h.alibi != 0.0f;
    } else {
      alibi = p.alibi_slopes != nullptr;
    }
    if (alibi) x -= h.alibi * fabsf(static_cast<float>(at.q + at.offset - at.kv));
    return x;
  }
  template <class P>
  __device__ __forceinline__ float grad(const P& p, const Head&, float raw, const ScorePair&) const {
    if (p.softcap_log2 != 0.0f) {
      const float t = tanhf(raw * p.softcap_inner);
      return 1.0f - t * t;
    }
    return 1.0f;
  }
};

// ---- Device forms of a variant's score hooks: each part has
// __device__ score(s, at) and (for the backward pass) score_grad(s, at).

// A part without a score hook (Default, Scale, Sinks).
struct ScoreIdentity {
  __device__ __forceinline__ float score(float s, const ScoreIndex&) const { return s; }
  __device__ __forceinline__ float score_grad(float, const ScoreIndex&) const { return 1.0f; }
};

// variants::Softcap.
struct DeviceSoftcap {
  float cap = 0.0f;
  __device__ __forceinline__ float score(float s, const ScoreIndex&) const {
    return cap > 0.0f ? cap * tanhf(s / cap) : s;
  }
  __device__ __forceinline__ float score_grad(float s, const ScoreIndex&) const {
    if (!(cap > 0.0f)) return 1.0f;
    const float t = tanhf(s / cap);
    return 1.0f - t * t;
  }
};

// variants::Alibi, reading the slopes the call uploads into the plan.
struct DeviceAlibi {
  const float* slopes = nullptr;
  __device__ __forceinline__ float score(float s, const ScoreIndex& at) const {
    const long long distance = at.q + at.kv_len - at.q_len - at.kv;
    return s - slopes[at.head] * static_cast<float>(distance < 0 ? -distance : distance);
  }
  __device__ __forceinline__ float score_grad(float, const ScoreIndex&) const { return 1.0f; }
};

// variants::Bias: the function runs in device code.
template <class F>
struct DeviceBias {
  F bias;
  __device__ __forceinline__ float score(float s, const ScoreIndex& at) const {
    return s + static_cast<float>(bias(at.batch, at.head, at.q, at.kv));
  }
  __device__ __forceinline__ float score_grad(float, const ScoreIndex&) const { return 1.0f; }
};

// variants::ScoreMod: fn and grad run in device code. Without a grad there is
// no score_grad (attention_backward refuses such a variant at compile time).
template <class F, class G>
struct DeviceScoreMod {
  F fn;
  G grad;
  __device__ __forceinline__ float score(float s, const ScoreIndex& at) const {
    return static_cast<float>(fn(s, at.batch, at.head, at.q, at.kv));
  }
  __device__ __forceinline__ float score_grad(float s, const ScoreIndex& at) const
      requires(!std::is_same_v<G, variants::NoScoreGrad>) {
    return static_cast<float>(grad(s, at.batch, at.head, at.q, at.kv));
  }
};

// A variant of the user's own type: its score / score_grad run in device code
// (they must be __host__ __device__ or __device__).
template <class V>
struct DeviceVariantPart {
  V v;
  __device__ __forceinline__ float score(float s, const ScoreIndex& at) const { return v.score(s, at); }
  __device__ __forceinline__ float score_grad(float s, const ScoreIndex& at) const requires HasScoreGradHook<V> {
    return v.score_grad(s, at);
  }
};

// The parts of a Chain applied in order (Chain::score and score_grad without
// std::tuple, which device code cannot use). An aggregate: ScoreParts<A, B>{{a}, {b}}.
template <std::size_t I, class Part>
struct ScorePart {
  Part part;
};
template <class Indices, class... Parts>
struct ScorePartList;
template <std::size_t... Is, class... Parts>
struct ScorePartList<std::index_sequence<Is...>, Parts...> : ScorePart<Is, Parts>... {
  __device__ __forceinline__ float score(float s, const ScoreIndex& at) const {
    ((s = static_cast<const ScorePart<Is, Parts>&>(*this).part.score(s, at)), ...);
    return s;
  }
  __device__ __forceinline__ float score_grad(float s, const ScoreIndex& at) const {
    float g = 1.0f;
    auto one = [&](const auto& part) {
      g *= part.score_grad(s, at);
      s = part.score(s, at);
    };
    (one(static_cast<const ScorePart<Is, Parts>&>(*this).part), ...);
    return g;
  }
};
template <class... Parts>
using ScoreParts = ScorePartList<std::index_sequence_for<Parts...>, Parts...>;

// A variant's score hooks (one part, or a Chain's ScoreParts list) as a kernel hook. The scale
// comes from the host (variant_scale); pairs outside the sequence (padding
// rows and keys of a tile) get the scaled score without a call, so that a
// hook never reads past the data it was given (a bias tensor's extents).
template <class Parts>
struct VariantScores {
  static constexpr bool kModifiesScores = true;
  Parts parts;
  float scale = 1.0f;

  struct Head {
    int head;
  };
  template <class P>
  __device__ __forceinline__ Head head(const P&, int head, bool) const {
    return {head};
  }
  __device__ __forceinline__ static ScoreIndex index(const Head& h, const ScorePair& at) {
    return ScoreIndex{at.batch, h.head, at.q, at.kv, at.q_len, at.kv_len};
  }
  __device__ __forceinline__ static bool inside(const ScorePair& at) {
    return at.q >= 0 && at.q < at.q_len && at.kv >= 0 && at.kv < at.kv_len;
  }
  template <class P>
  __device__ __forceinline__ float logit(const P&, const Head& h, float raw, const ScorePair& at) const {
    const float s = raw * scale;
    return (inside(at) ? parts.score(s, index(h, at)) : s) * kLog2e;
  }
  template <class P>
  __device__ __forceinline__ float grad(const P&, const Head& h, float raw, const ScorePair& at) const {
    return inside(at) ? parts.score_grad(raw * scale, index(h, at)) : 1.0f;
  }
};

}  // namespace seqattn::cuda::detail
