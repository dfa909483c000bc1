// Ring attention over MPI: context-parallel attention forward.
//
// Every rank of `comm` holds one shard of the token axis (ShardLayout, in
// cp/layout.hpp): its queries and its keys/values are the same tokens. The
// result on each rank is exactly what single-process attention over the whole
// sequence gives for that rank's query rows (outputs and LSE), up to float
// rounding.
//
// The ring (Algorithm::ring). Step s = 0 .. P-1, rank r computes its queries
// against the K/V shard of rank src = (r - s) mod P:
//
//   post Irecv(next buffer <- rank r-1), Isend(current buffer -> rank r+1)
//   attention on (local q, current K/V)      <- overlaps the transfer
//   merge the step's (out, lse) into the running (O, SoftmaxState) by LSE
//   Waitall; swap buffers
//
// Overlap: shared-memory and most network transports move a large message
// only while the MPI library is entered, so the step's attention runs on an
// execution policy wrapper that calls MPI_Testall from worker 0 (the calling
// thread) between tasks. Two K/V buffers of the largest shard size are
// allocated once per plan; nothing is allocated in the loop.
//
// Merge: each step's normalized output with its LSE is the partial result
// (lse, 1, out) of the row over that shard's keys; SoftmaxState::merge folds
// partials exactly whatever their order (attention/softmax_state.hpp). Sinks
// join once at the end, not per step. A row no shard lets it see stays empty:
// out 0, lse -inf.
//
// Masks: the mask is a description in global coordinates; each (rank, src)
// step is planned once up front with ShardedMask, which maps local rows and
// keys to global positions. Skip rule: a step whose BlockMask has no
// non-empty tile is not computed (its buffer is still forwarded: the ring
// needs every shard to pass every rank).
//
// Algorithm::all_gather instead gathers every rank's K/V (MPI_Allgatherv, in
// storage precision), reorders them per sequence into rank order, and runs one
// attention call with the sinks in the variant: no merge, more memory, no
// overlap.
//
// Validation is collective: at planning every rank checks everything the
// plan and its per-step plans would reject (shapes, options, kv_splits,
// workers, the mask) and contributes a fingerprint of its arguments (layout,
// heads, head dims, storage type, options, the mask's parameters and a
// sample of it) to one MPI_Allreduce; every call checks its local inputs and
// agrees with MPI_Allreduce before any point-to-point message. A rank that
// disagrees or whose inputs are wrong makes every rank throw the same
// seqattn::invalid_argument instead of hanging.
//
// Failures during the ring (an exception from the execution policy, an
// allocation inside a backend) cannot be agreed on beforehand. The failing
// rank stops computing but keeps forwarding the shards, so no peer waits for
// a message that never comes and no posted request outlives the call; after
// the last step one MPI_Allreduce tells every rank. The failing rank then
// rethrows its own exception, the others throw std::runtime_error naming the
// lowest failing rank and its message, and no rank writes its outputs (the
// all-gather algorithm may have written the failing rank's).
//
// Backward (RingOptions::backward, ring only): K/V travel the ring again and
// each shard's dK/dV accumulator (fp32) follows one step behind, ending at its
// owner after P hops; see backward_ring.
//
// Not supported: score variants that read positions (ALiBi, score_mod: they
// would see local indices), cross-attention, a backward pass for all-gather.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <mpi.h>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "seqattn/attention.hpp"
#include "seqattn/core/overlap.hpp"
#include "seqattn/cp/layout.hpp"
#include "seqattn/masks/combinators.hpp"
#include "seqattn/masks/document.hpp"
#include "seqattn/masks/structural.hpp"

namespace seqattn::cp {

enum class Algorithm : std::uint8_t { ring, all_gather };

struct RingOptions {
  Algorithm algorithm = Algorithm::ring;
  // As AttentionOptions: NaN scale means 1 / sqrt(dk); softcap 0 is off;
  // sinks: one logit per query head (or empty).
  float scale = std::numeric_limits<float>::quiet_NaN();
  float softcap = 0.0f;
  std::span<const float> sinks;
  // Per step, as PlanOptions::kv_splits.
  index_t kv_splits = 0;
  // Also plan the backward pass (RingPlan::backward; ring algorithm only).
  bool backward = false;
};

// What one ring step did, for benchmarks: seconds spent in attention and
// merge, and seconds waiting for the transfer after them.
struct RingStepTiming {
  double compute_s = 0;
  double wait_s = 0;
  bool skipped = false;
};

namespace detail {

using seqattn::detail::concat;
using seqattn::detail::require;

inline constexpr int kRingTag = 0x5a77;
inline constexpr std::size_t kMessageChars = 1024;

// The lowest rank whose `local_error` is not empty, and its message (rank
// == size when every rank succeeded). Collective.
struct FirstFailure {
  int rank = 0;
  int size = 1;
  std::array<char, kMessageChars> text{};
  bool any() const { return rank < size; }
};

inline FirstFailure first_failure(MPI_Comm comm, const std::string& local_error) {
  int rank = 0;
  FirstFailure f;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &f.size);
  const int mine = local_error.empty() ? f.size : rank;
  f.rank = f.size;
  MPI_Allreduce(&mine, &f.rank, 1, MPI_INT, MPI_MIN, comm);
  if (!f.any()) return f;
  if (rank == f.rank) std::strncpy(f.text.data(), local_error.c_str(), f.text.size() - 1);
  MPI_Bcast(f.text.data(), static_cast<int>(f.text.size()), MPI_CHAR, f.rank, comm);
  return f;
}

// Checks `local_error` on every rank. When some rank failed, every rank
// throws the message of the lowest failing rank.
inline void agree_or_throw(MPI_Comm comm, const std::string& local_error, const char* who) {
  const FirstFailure f = first_failure(comm, local_error);
  if (!f.any()) return;
  throw invalid_argument(concat(who, ": rank ", f.rank, " of ", f.size, " rejected its arguments: ", f.text.data()));
}

inline std::string message_of(const std::exception_ptr& failure) {
  if (!failure) return {};
  try {
    std::rethrow_exception(failure);
  } catch (const std::exception& e) {
    // An empty what() must still count as a failure.
    return e.what()[0] != '\0' ? e.what() : "an exception without a message";
  } catch (...) {
    return "an exception that is not a std::exception";
  }
}

// After work that may fail on some ranks only (the ring's steps, building the
// step plans): when any rank failed, the failing ranks rethrow their own
// exception (its type kept: out_of_memory stays out_of_memory) and the others
// throw std::runtime_error naming the lowest failing rank. Collective.
inline void agree_on_completion(MPI_Comm comm, const std::exception_ptr& failure, const char* who) {
  const FirstFailure f = first_failure(comm, message_of(failure));
  if (!f.any()) return;
  if (failure) std::rethrow_exception(failure);
  throw std::runtime_error(concat(who, ": rank ", f.rank, " of ", f.size, " failed: ", f.text.data()));
}

// The point-to-point requests of one ring call. On every exit path none is
// left in flight: a receive is cancelled (or completes, if it already
// matched) and a send completes (its peer posted the matching receive for
// the same step). The ring completes them on its own; this guard holds for
// an exception that escapes the loop anyway, so that MPI never writes into a
// buffer the plan has freed.
template <std::size_t N>
struct InFlight {
  std::array<MPI_Request, N> requests;
  std::array<bool, N> is_receive;

  explicit InFlight(std::array<bool, N> receives) : is_receive(receives) { requests.fill(MPI_REQUEST_NULL); }
  InFlight(const InFlight&) = delete;
  InFlight& operator=(const InFlight&) = delete;
  ~InFlight() {
    for (std::size_t i = 0; i < N; ++i) {
      if (requests[i] == MPI_REQUEST_NULL) continue;
      if (is_receive[i]) MPI_Cancel(&requests[i]);
      MPI_Wait(&requests[i], MPI_STATUS_IGNORE);
    }
  }
  MPI_Request* data() { return requests.data(); }
  MPI_Request& operator[](std::size_t i) { return requests[i]; }
};

// Runs `fn`, turning an exception into the message agree_or_throw shares.
template <class Fn>
std::string capture_error(Fn&& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    // Any failure, not only invalid_argument: the other ranks must hear of it.
    return e.what();
  }
  return {};
}

struct Fnv {
  std::uint64_t h = 1469598103934665603ull;
  void add(std::uint64_t x) {
    for (int i = 0; i < 8; ++i) {
      h ^= (x >> (8 * i)) & 0xff;
      h *= 1099511628211ull;
    }
  }
};

// What mask_parameters recognizes: the structural masks, the combinators and
// document masks (whose inner mask it reads), and masks with the hook
//   std::uint64_t fingerprint() const;  // equal on every rank iff the masks are
// Others contribute nothing: the samples decide.
template <class M>
struct MaskParts {
  static constexpr int tag = 0;
};
template <class A, class B>
struct MaskParts<AndMask<A, B>> {
  static constexpr int tag = 6;
};
template <class A, class B>
struct MaskParts<OrMask<A, B>> {
  static constexpr int tag = 7;
};
template <class A>
struct MaskParts<NotMask<A>> {
  static constexpr int tag = 8;
};
template <class Inner>
struct MaskParts<DocumentMask<Inner>> {
  static constexpr int tag = 9;
};

template <class M>
concept HasMaskFingerprint = requires(const M& m) {
  { m.fingerprint() } -> std::convertible_to<std::uint64_t>;
};

// Adds the mask's parameters: masks differing in a few elements only (window
// 300 against 301) escape the samples but not their parameters.
template <class M>
void mask_parameters(Fnv& f, const M& m) {
  // A negative window side means unbounded, whatever its value.
  const auto side = [](index_t x) { return static_cast<std::uint64_t>(x < 0 ? -1 : x); };
  if constexpr (HasMaskFingerprint<M>) {
    f.add(1);
    f.add(static_cast<std::uint64_t>(m.fingerprint()));
  } else if constexpr (std::is_same_v<M, FullMask>) {
    f.add(2);
  } else if constexpr (std::is_same_v<M, CausalMask>) {
    f.add(3);
    f.add(static_cast<std::uint64_t>(m.alignment));
  } else if constexpr (std::is_same_v<M, SlidingWindowMask>) {
    f.add(4);
    f.add(side(m.left));
    f.add(side(m.right));
    f.add(static_cast<std::uint64_t>(m.alignment));
  } else if constexpr (std::is_same_v<M, ChunkedCausalMask>) {
    f.add(5);
    f.add(static_cast<std::uint64_t>(m.chunk));
    f.add(static_cast<std::uint64_t>(m.alignment));
  } else if constexpr (std::is_same_v<M, PrefixLMMask>) {
    f.add(10);
    f.add(static_cast<std::uint64_t>(m.alignment));
    if (m.prefix_lengths.empty()) {
      f.add(static_cast<std::uint64_t>(m.prefix));
    } else {
      for (const std::int32_t p : m.prefix_lengths) f.add(static_cast<std::uint64_t>(p));
    }
  } else if constexpr (MaskParts<M>::tag == 6 || MaskParts<M>::tag == 7) {
    f.add(MaskParts<M>::tag);
    mask_parameters(f, m.a);
    mask_parameters(f, m.b);
  } else if constexpr (MaskParts<M>::tag == 8) {
    f.add(8);
    mask_parameters(f, m.a);
  } else if constexpr (MaskParts<M>::tag == 9) {
    f.add(9);
    mask_parameters(f, m.inner);
  } else {
    f.add(0);
  }
}

// A fingerprint of the mask on the global problem: its parameters where
// mask_parameters knows them, the class of a coarse grid of tiles and the
// element predicate at pseudo-random points of every sequence (at most 64
// sequences, every head for masks that vary by head, up to 8). The samples
// catch masks of another kind or document layout; two masks without known
// parameters that differ in a few elements only may agree here.
template <MaskDescription M>
std::uint64_t mask_fingerprint(const M& mask, const ShardLayout& layout, index_t heads) {
  Fnv f;
  mask_parameters(f, mask);
  std::uint64_t rng = 0x9e3779b97f4a7c15ull;
  auto next = [&] {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
  };
  const index_t nh = is_head_invariant<M>() ? 1 : std::min<index_t>(heads, 8);
  for (index_t b = 0; b < std::min<index_t>(layout.batch(), 64); ++b) {
    const index_t n = layout.global_len(b);
    if (n == 0) continue;
    for (index_t h = 0; h < nh; ++h) {
      const MaskContext ctx{b, h, n, n};
      const index_t cells = std::min<index_t>(n, 8);
      for (index_t i = 0; i < cells; ++i) {
        for (index_t j = 0; j < cells; ++j) {
          const Tile t{n * i / cells, n * (i + 1) / cells, n * j / cells, n * (j + 1) / cells};
          f.add(static_cast<std::uint64_t>(mask.classify(ctx, t)));
        }
      }
      for (int k = 0; k < 256; ++k) {
        const auto q = static_cast<index_t>(next() % static_cast<std::uint64_t>(n));
        const auto kv = static_cast<index_t>(next() % static_cast<std::uint64_t>(n));
        f.add(mask.allowed(ctx, q, kv) ? 1 : 0);
      }
    }
  }
  return f.h;
}

// One named value every rank must agree on.
struct Agreed {
  const char* name;
  std::int64_t value;
};

// Throws on every rank, naming the first field whose minimum and maximum
// over the ranks differ.
inline void agree_on(MPI_Comm comm, const std::vector<Agreed>& fields, const char* who) {
  const auto n = fields.size();
  std::vector<std::int64_t> lo(n), hi(n), mine(2 * n), reduced(2 * n);
  for (std::size_t i = 0; i < n; ++i) {
    mine[i] = fields[i].value;
    // -INT64_MIN overflows: saturate the negated side (values are small or hashes).
    mine[n + i] = fields[i].value == std::numeric_limits<std::int64_t>::min() ? std::numeric_limits<std::int64_t>::max()
                                                                              : -fields[i].value;
  }
  MPI_Allreduce(mine.data(), reduced.data(), static_cast<int>(2 * n), MPI_INT64_T, MPI_MAX, comm);
  for (std::size_t i = 0; i < n; ++i) {
    const std::int64_t max = reduced[i], min = -reduced[n + i];
    if (max != min) {
      // The same message on every rank: no rank's own value in it.
      throw invalid_argument(concat(who, ": the ranks disagree on ", fields[i].name, " (from ", min, " to ", max,
                                    " across ranks): every rank must plan the same problem"));
    }
  }
}

// Wraps an execution policy so that worker 0 (the calling thread, the one
// allowed to call MPI) drives the pending transfers between tasks.
template <class Exec>
struct ProgressingExec {
  Exec& inner;
  MPI_Request* requests;
  int count;

  int workers() const { return static_cast<int>(inner.workers()); }
  template <class F>
  void parallel_for(index_t n, F&& f) {
    inner.parallel_for(n, [&](index_t task, int worker) {
      f(task, worker);
      if (worker == 0 && count > 0) {
        int done = 0;
        MPI_Testall(count, requests, &done, MPI_STATUSES_IGNORE);
      }
    });
  }
};

inline double now_s() { return MPI_Wtime(); }

}  // namespace detail

// A planned context-parallel attention for one communicator, one ShardLayout,
// one mask and one storage type T (float or bfloat16). Construction is
// collective (every rank of comm, same arguments). Holds the per-step plans
// and the communication and merge buffers, so calls allocate nothing per
// step; one call at a time per plan.
template <class T, AttentionBackend Backend = backends::Highway>
class RingPlan {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, bfloat16>, "storage must be float or seqattn::bfloat16");

 public:
  template <MaskDescription M>
  RingPlan(MPI_Comm comm, ShardLayout layout, index_t heads, index_t kv_heads, index_t dk, index_t dv, const M& mask,
           RingOptions options = {}, int workers = 1)
      : comm_(comm),
        layout_(std::make_shared<const ShardLayout>(std::move(layout))),
        heads_(heads),
        kv_heads_(kv_heads),
        dk_(dk),
        dv_(dv),
        options_(options),
        sinks_(options.sinks.begin(), options.sinks.end()) {
    constexpr const char* kWho = "ring_attention plan";
    MPI_Comm_rank(comm, &rank_);
    MPI_Comm_size(comm, &size_);
    std::uint64_t mask_hash = 0;
    // Local checks first, then one agreement: a rank that fails alone must
    // not leave the others waiting in a collective.
    detail::agree_or_throw(comm, detail::capture_error([&] {
                             check_arguments(mask, workers);
                             mask_hash = detail::mask_fingerprint(mask, *layout_, heads_);
                           }),
                           kWho);
    const ShardLayout& l = *layout_;
    detail::Fnv lengths;
    for (index_t b = 0; b < l.batch(); ++b) lengths.add(static_cast<std::uint64_t>(l.global_len(b)));
    detail::Fnv sinks;
    for (float s : sinks_) sinks.add(std::bit_cast<std::uint32_t>(s));
    detail::agree_on(comm,
                     {{"the number of ranks in the layout (cp_size)", l.cp_size()},
                      {"the layout (BSHD 0, THD 1)", static_cast<std::int64_t>(l.layout())},
                      {"the number of sequences", l.batch()},
                      {"the sequence lengths (hash)", static_cast<std::int64_t>(lengths.h)},
                      {"the sharding", static_cast<std::int64_t>(l.sharding())},
                      {"the stripe", l.stripe()},
                      {"the query heads", heads_},
                      {"the key/value heads", kv_heads_},
                      {"dk", dk_},
                      {"dv", dv_},
                      {"the storage type (bytes per element)", static_cast<std::int64_t>(sizeof(T))},
                      {"the mask (fingerprint)", static_cast<std::int64_t>(mask_hash)},
                      {"the algorithm", static_cast<std::int64_t>(options_.algorithm)},
                      {"RingOptions::backward", options_.backward ? 1 : 0},
                      {"the scale (bits)", std::bit_cast<std::int32_t>(options_.scale)},
                      {"the softcap (bits)", std::bit_cast<std::int32_t>(options_.softcap)},
                      {"the sinks (hash)", static_cast<std::int64_t>(sinks.h)}},
                     kWho);
    // Everything a rank could reject was checked above; what remains (an
    // allocation failing on one rank) must still reach every rank.
    std::exception_ptr failure;
    try {
      build(mask, workers);
    } catch (...) {
      failure = std::current_exception();
    }
    detail::agree_on_completion(comm, failure, kWho);
  }

  RingPlan(const RingPlan&) = delete;
  RingPlan& operator=(const RingPlan&) = delete;

  const ShardLayout& layout() const { return *layout_; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  MPI_Comm comm() const { return comm_; }
  const RingOptions& options() const { return options_; }
  // Steps this rank skips (ring only): their shard is invisible to its queries.
  int skipped_steps() const { return static_cast<int>(std::count(skip_.begin(), skip_.end(), true)); }
  // The step timings of the last ring call (P entries).
  std::span<const RingStepTiming> last_timings() const { return timings_; }

  // The shapes of this rank's inputs and outputs.
  Extents q_shape() const { return token_shape(heads_, dk_); }
  Extents k_shape() const { return token_shape(kv_heads_, dk_); }
  Extents v_shape() const { return token_shape(kv_heads_, dv_); }
  Extents out_shape() const { return token_shape(heads_, dv_); }
  Extents lse_shape() const {
    const index_t n = layout_->local_tokens(rank_);
    return layout_->layout() == Layout::bshd ? seqattn::detail::make_extents({layout_->batch(), heads_, n})
                                             : seqattn::detail::make_extents({heads_, n});
  }

  // Runs on this rank's shard: q [.., Hq, dk], k [.., Hkv, dk], v [.., Hkv, dv]
  // (BSHD [B, S_r, H, D], THD [T_r, H, D]); out like q with dv, lse [B, Hq, S_r]
  // or [Hq, T_r] or empty. Collective.
  template <ExecutionPolicy Exec>
  void forward(TensorView<const T> q, TensorView<const T> k, TensorView<const T> v, TensorView<T> out,
               TensorView<float> lse, Exec&& exec) {
    detail::agree_or_throw(comm_,
                           detail::capture_error([&] { check_call("ring_attention_forward", q, k, v, out, lse); }),
                           "ring_attention_forward");
    if (options_.algorithm == Algorithm::all_gather) {
      forward_all_gather(q, k, v, out, lse, exec);
    } else {
      forward_ring(q, k, v, out, lse, exec);
    }
  }

  // The gradients of forward(q, k, v) -> (out, lse) given dout, the gradient
  // of out: dq like q, dk like k, dv like v (this rank's shard), and, when
  // the plan has sinks and `dsinks` is not empty, the sinks' gradient (one per
  // query head, summed over all ranks). out and lse are what forward returned.
  // Needs RingOptions::backward and Algorithm::ring. Collective.
  template <ExecutionPolicy Exec>
  void backward(TensorView<const T> q, TensorView<const T> k, TensorView<const T> v, TensorView<const T> out,
                TensorView<const float> lse, TensorView<const T> dout, TensorView<T> dq, TensorView<T> dk,
                TensorView<T> dv, std::span<float> dsinks, Exec&& exec) {
    static_assert(BackwardBackend<Backend>, "this backend has no backward pass");
    detail::agree_or_throw(
        comm_, detail::capture_error([&] {
          constexpr const char* kWho = "ring_attention_backward: ";
          detail::require(options_.backward && options_.algorithm == Algorithm::ring, kWho,
                          "the plan must be made with RingOptions::backward and Algorithm::ring");
          check_call("ring_attention_backward", q, k, v,
                     TensorView<T>(const_cast<T*>(out.data()), out.shape(), out.strides()),
                     TensorView<float>(const_cast<float*>(lse.data()), lse.shape(), lse.strides()));
          detail::require(lse.data() != nullptr, kWho, "lse is required");
          detail::require(dout.shape() == out_shape(), kWho, "dout must have shape ", out_shape(), ", got ",
                          dout.shape());
          detail::require(dq.shape() == q_shape(), kWho, "dq must have shape ", q_shape(), ", got ", dq.shape());
          detail::require(dk.shape() == k_shape(), kWho, "dk must have shape ", k_shape(), ", got ", dk.shape());
          detail::require(dv.shape() == v_shape(), kWho, "dv must have shape ", v_shape(), ", got ", dv.shape());
          detail::require(dsinks.empty() || static_cast<index_t>(dsinks.size()) == heads_, kWho,
                          "dsinks must be empty or hold one value per query head (", heads_, "), got ", dsinks.size());
          detail::require((dout.data() || dout.size() == 0) && (dq.data() || dq.size() == 0) &&
                              (dk.data() || dk.size() == 0) && (dv.data() || dv.size() == 0),
                          kWho, "dout, dq, dk and dv must have data (dout ", dout.data() ? "has" : "has none", ", dq ",
                          dq.data() ? "has" : "has none", ", dk ", dk.data() ? "has" : "has none", ", dv ",
                          dv.data() ? "has" : "has none", ")");
          // The ring reads q, out, lse and dout at every step and writes dq, dk
          // and dv one after another at the end (the same rule as the engine's).
          using seqattn::detail::footprint;
          seqattn::detail::require_disjoint(
              "ring_attention_backward",
              {footprint("dq", dq), footprint("dk", dk), footprint("dv", dv), footprint("dsinks", dsinks)},
              {footprint("q", q), footprint("k", k), footprint("v", v), footprint("out", out), footprint("lse", lse),
               footprint("dout", dout)});
        }),
        "ring_attention_backward");
    backward_ring(q, k, v, out, lse, dout, dq, dk, dv, dsinks, exec);
  }

 private:
  struct Step {
    std::unique_ptr<AttentionPlan<Backend>> plan;                      // null for steps that are skipped
    std::vector<std::int32_t> q_offsets, q_lens, kv_offsets, kv_lens;  // THD
    SegmentTable table;
  };

  Extents token_shape(index_t h, index_t d) const {
    const index_t n = layout_->local_tokens(rank_);
    return layout_->layout() == Layout::bshd ? seqattn::detail::make_extents({layout_->batch(), n, h, d})
                                             : seqattn::detail::make_extents({n, h, d});
  }

  PlanOptions plan_options() const {
    PlanOptions po;
    po.kv_splits = options_.kv_splits;
    po.backward = options_.backward && options_.algorithm == Algorithm::ring;
    return po;
  }

  template <class M>
  void check_arguments(const M& mask, int workers) const {
    constexpr const char* kWho = "ring_attention plan: ";
    const ShardLayout& l = *layout_;
    detail::require(l.cp_size() == size_, kWho, "the layout is for cp_size ", l.cp_size(), " but the communicator has ",
                    size_, " ranks");
    detail::require(heads_ > 0 && kv_heads_ > 0 && heads_ % kv_heads_ == 0 && dk_ > 0 && dv_ > 0, kWho, "heads (",
                    heads_, ") must be a positive multiple of kv heads (", kv_heads_,
                    ") and head dims positive, got dk ", dk_, ", dv ", dv_);
    detail::require(sinks_.empty() || static_cast<index_t>(sinks_.size()) == heads_, kWho,
                    "sinks must hold one logit per query head (", heads_, "), got ", sinks_.size());
    for (std::size_t h = 0; h < sinks_.size(); ++h) {
      detail::require(std::isfinite(sinks_[h]), kWho, "sinks must be finite, got ", sinks_[h], " for head ", h);
    }
    // The engine's own rules (and messages) for scale and softcap, here
    // rather than inside the ring: a throw there leaves transfers posted.
    seqattn::detail::check_variant(variants::Standard{options_.scale, {options_.softcap}, {sinks_}},
                                   local_shape(l.local_lengths(rank_)));
    // What plan_attention would reject in build(), per step (kv_splits,
    // workers, the shape limits, the backend): workers and kv_splits are
    // per-rank settings, so a rank failing there alone must fail here.
    const PlanOptions po = plan_options();
    if (options_.algorithm == Algorithm::all_gather) {
      RaggedLengths lengths = l.local_lengths(rank_);
      lengths.kv = l.global_lengths().kv;
      seqattn::detail::check_plan_request<Backend>(local_shape(lengths), po, workers);
    } else {
      for (int src = 0; src < size_; ++src) {
        RaggedLengths lengths = l.local_lengths(rank_);
        lengths.kv = l.local_lengths(src).kv;
        seqattn::detail::check_plan_request<Backend>(local_shape(lengths), po, workers);
      }
    }
    seqattn::detail::check_mask(mask, l.global_lengths(), heads_);
    // Messages are counted in bytes as an int.
    for (int r = 0; r < size_; ++r) {
      const index_t bytes =
          seqattn::detail::checked_size("ring_attention: K/V shard bytes", limits::kMaxTensorElements, shard_tokens(r),
                                        kv_heads_, dk_ + dv_, static_cast<index_t>(sizeof(T)));
      detail::require(bytes <= std::numeric_limits<int>::max(), kWho, "rank ", r, "'s K/V shard is ", bytes,
                      " bytes, over the ", std::numeric_limits<int>::max(), " of one MPI message");
    }
  }

  // Tokens of rank r's K/V buffer: BSHD B * S_r, THD T_r.
  index_t shard_tokens(int r) const {
    const index_t n = layout_->local_tokens(r);
    return layout_->layout() == Layout::bshd ? layout_->batch() * n : n;
  }
  index_t shard_elements(int r) const { return shard_tokens(r) * kv_heads_ * (dk_ + dv_); }

  AttentionShape local_shape(const RaggedLengths& lengths) const {
    AttentionShape s;
    s.layout = layout_->layout();
    s.lengths = lengths;
    s.heads = heads_;
    s.kv_heads = kv_heads_;
    s.dk = dk_;
    s.dv = dv_;
    return s;
  }

  template <class M>
  void build(const M& mask, int workers) {
    const ShardLayout& l = *layout_;
    const auto q_map = std::shared_ptr<const TokenMap>(layout_, &l.map(rank_));
    const PlanOptions po = plan_options();
    auto fill_table = [&](Step& st, int kv_rank) {
      if (l.layout() != Layout::thd) return;
      for (index_t b = 0; b < l.batch(); ++b) {
        st.q_offsets.push_back(static_cast<std::int32_t>(l.local_offset(rank_, b)));
        st.q_lens.push_back(static_cast<std::int32_t>(l.local_len(rank_, b)));
        index_t kv_off = 0, kv_len = 0;
        if (kv_rank >= 0) {
          kv_off = l.local_offset(kv_rank, b);
          kv_len = l.local_len(kv_rank, b);
        } else {  // gathered: segment b holds every rank's share
          kv_off = l.global_offset(b);
          kv_len = l.global_len(b);
        }
        st.kv_offsets.push_back(static_cast<std::int32_t>(kv_off));
        st.kv_lens.push_back(static_cast<std::int32_t>(kv_len));
      }
      st.table = SegmentTable{st.q_offsets, st.q_lens, st.kv_offsets, st.kv_lens};
    };
    const index_t n_max = [&] {
      index_t m = 0;
      for (int r = 0; r < size_; ++r) m = std::max(m, shard_elements(r));
      return m;
    }();
    if (options_.algorithm == Algorithm::all_gather) {
      auto kv_map = std::make_shared<const TokenMap>(gathered_map(l));
      RaggedLengths lengths = l.local_lengths(rank_);
      lengths.kv = l.global_lengths().kv;
      const ShardedMask<M> sm{mask, q_map, kv_map};
      steps_.resize(1);
      fill_table(steps_[0], -1);
      steps_[0].plan =
          std::make_unique<AttentionPlan<Backend>>(plan_attention<Backend>(local_shape(lengths), sm, po, workers));
      // Staging for Allgatherv (rank order) and the reordered K and V.
      index_t total = 0;
      for (int r = 0; r < size_; ++r) {
        counts_.push_back(static_cast<int>(shard_elements(r) * static_cast<index_t>(sizeof(T))));
        displs_.push_back(static_cast<int>(total * static_cast<index_t>(sizeof(T))));
        total += shard_elements(r);
      }
      detail::require(total * static_cast<index_t>(sizeof(T)) <= std::numeric_limits<int>::max(),
                      "ring_attention plan: the gathered K/V are ", total * static_cast<index_t>(sizeof(T)),
                      " bytes, over the int byte displacements of MPI_Allgatherv; use Algorithm::ring");
      send_.assign(static_cast<std::size_t>(n_max), T{});
      gathered_.assign(static_cast<std::size_t>(total), T{});
      const index_t kv_tokens =
          l.layout() == Layout::bshd ? l.batch() * (l.batch() > 0 ? l.global_len(0) : 0) : l.global_tokens();
      full_k_.assign(static_cast<std::size_t>(kv_tokens * kv_heads_ * dk_), T{});
      full_v_.assign(static_cast<std::size_t>(kv_tokens * kv_heads_ * dv_), T{});
      return;
    }
    steps_.resize(static_cast<std::size_t>(size_));
    skip_.assign(static_cast<std::size_t>(size_), false);
    for (int s = 0; s < size_; ++s) {
      const int src = (rank_ - s + size_) % size_;
      Step& st = steps_[static_cast<std::size_t>(s)];
      fill_table(st, src);
      RaggedLengths lengths = l.local_lengths(rank_);
      lengths.kv = l.local_lengths(src).kv;
      const auto kv_map = std::shared_ptr<const TokenMap>(layout_, &l.map(src));
      const ShardedMask<M> sm{mask, q_map, kv_map};
      auto plan =
          std::make_unique<AttentionPlan<Backend>>(plan_attention<Backend>(local_shape(lengths), sm, po, workers));
      const BlockMask& bm = plan->block_mask();
      if (bm.num_full_tiles() + bm.num_partial_tiles() == 0) {
        skip_[static_cast<std::size_t>(s)] = true;
      } else {
        st.plan = std::move(plan);
      }
    }
    for (auto& buf : ring_) buf.assign(static_cast<std::size_t>(n_max), T{});
    const index_t rows = layout_->local_tokens(rank_) * (l.layout() == Layout::bshd ? l.batch() : 1);
    step_out_ = Tensor<T>(out_shape());
    step_lse_ = Tensor<float>(lse_shape(), SoftmaxState::kNegInf);
    acc_.assign(static_cast<std::size_t>(rows * heads_ * dv_), 0.0f);
    state_.assign(static_cast<std::size_t>(rows * heads_), SoftmaxState{});
    timings_.assign(static_cast<std::size_t>(size_), RingStepTiming{});
    if (po.backward) {
      // dK/dV accumulators travel in fp32; the engine's per-step gradients
      // are in storage precision.
      for (auto& buf : dkv_ring_) buf.assign(static_cast<std::size_t>(n_max), 0.0f);
      dq_acc_.assign(static_cast<std::size_t>(rows * heads_ * dk_), 0.0f);
      dq_step_ = Tensor<T>(q_shape());
      dkv_step_.assign(static_cast<std::size_t>(n_max), T{});
    }
  }

  // The checks forward and backward share; `who` names the call in messages.
  void check_call(const char* who, const TensorView<const T>& q, const TensorView<const T>& k,
                  const TensorView<const T>& v, const TensorView<T>& out, const TensorView<float>& lse) const {
    const char* layout =
        layout_->layout() == Layout::bshd ? " (BSHD shard [B, S_r, H, D])" : " (THD shard [T_r, H, D])";
    detail::require(q.shape() == q_shape(), who, ": q must have shape ", q_shape(), layout, " on rank ", rank_,
                    ", got ", q.shape());
    detail::require(k.shape() == k_shape(), who, ": k must have shape ", k_shape(), layout, " on rank ", rank_,
                    ", got ", k.shape());
    detail::require(v.shape() == v_shape(), who, ": v must have shape ", v_shape(), layout, " on rank ", rank_,
                    ", got ", v.shape());
    detail::require(out.shape() == out_shape(), who, ": out must have shape ", out_shape(), " on rank ", rank_,
                    ", got ", out.shape());
    detail::require(lse.data() == nullptr || lse.shape() == lse_shape(), who, ": lse must be empty or have shape ",
                    lse_shape(), " on rank ", rank_, ", got ", lse.shape());
    detail::require((q.data() || q.size() == 0) && (k.data() || k.size() == 0) && (v.data() || v.size() == 0) &&
                        (out.data() || out.size() == 0),
                    who, ": q, k, v and out must have data");
    // The engine's rule for its outputs; out and lse must not share memory.
    using seqattn::detail::footprint;
    seqattn::detail::require_disjoint(who, {footprint("out", out), footprint("lse", lse)},
                                      {footprint("q", q), footprint("k", k), footprint("v", v)});
  }

  // Copies this rank's K then V, token-major, into `dst` (the wire format:
  // [tokens, Hkv, dk] then [tokens, Hkv, dv], tokens BSHD-batch-major).
  void pack(const TensorView<const T>& k, const TensorView<const T>& v, T* dst) const {
    const bool bshd = layout_->layout() == Layout::bshd;
    const index_t n = layout_->local_tokens(rank_);
    const index_t outer = bshd ? layout_->batch() : 1;
    T* kd = dst;
    T* vd = dst + shard_tokens(rank_) * kv_heads_ * dk_;
    for (index_t b = 0; b < outer; ++b) {
      for (index_t t = 0; t < n; ++t) {
        for (index_t h = 0; h < kv_heads_; ++h) {
          const index_t kbase =
              (bshd ? b * k.stride(0) + t * k.stride(1) + h * k.stride(2) : t * k.stride(0) + h * k.stride(1));
          const index_t vbase =
              (bshd ? b * v.stride(0) + t * v.stride(1) + h * v.stride(2) : t * v.stride(0) + h * v.stride(1));
          for (index_t d = 0; d < dk_; ++d) *kd++ = k.data()[kbase + d * k.stride(-1)];
          for (index_t d = 0; d < dv_; ++d) *vd++ = v.data()[vbase + d * v.stride(-1)];
        }
      }
    }
  }

  // Views of rank src's K and V inside a wire buffer.
  std::pair<TensorView<const T>, TensorView<const T>> unpack_views(const T* buf, int src) const {
    const bool bshd = layout_->layout() == Layout::bshd;
    const index_t n = layout_->local_tokens(src);
    const Extents ks = bshd ? seqattn::detail::make_extents({layout_->batch(), n, kv_heads_, dk_})
                            : seqattn::detail::make_extents({n, kv_heads_, dk_});
    const Extents vs = bshd ? seqattn::detail::make_extents({layout_->batch(), n, kv_heads_, dv_})
                            : seqattn::detail::make_extents({n, kv_heads_, dv_});
    return {TensorView<const T>(buf, ks), TensorView<const T>(buf + shard_tokens(src) * kv_heads_ * dk_, vs)};
  }

  // Folds the step's (step_out_, step_lse_) into (acc_, state_).
  template <class Exec>
  void merge_step(Exec& exec) {
    const bool bshd = layout_->layout() == Layout::bshd;
    const index_t n = layout_->local_tokens(rank_);
    const index_t rows = bshd ? layout_->batch() * n : n;
    const T* so = step_out_.data();
    const float* sl = step_lse_.data();
    constexpr index_t kRowsPerTask = 64;
    exec.parallel_for(seqattn::detail::ceil_div_nonneg(rows, kRowsPerTask), [&](index_t task, int) {
      const index_t end = std::min(rows, (task + 1) * kRowsPerTask);
      for (index_t row = task * kRowsPerTask; row < end; ++row) {
        const index_t b = bshd ? row / n : 0, t = bshd ? row % n : row;
        for (index_t h = 0; h < heads_; ++h) {
          const float l = bshd ? sl[(b * heads_ + h) * n + t] : sl[h * n + t];
          const SoftmaxState partial = SoftmaxState::from_lse(l);
          const index_t r = row * heads_ + h;
          float* o = acc_.data() + r * dv_;
          const T* p = so + r * dv_;
          if constexpr (std::is_same_v<T, float>) {
            merge_partial_rows(state_[static_cast<std::size_t>(r)], o, partial, p, dv_);
          } else {
            const SoftmaxState::Weights w = state_[static_cast<std::size_t>(r)].merge(partial);
            if (w.other == 0.0f) continue;
            for (index_t e = 0; e < dv_; ++e) o[e] = o[e] * w.self + static_cast<float>(p[e]) * w.other;
          }
        }
      }
    });
  }

  void finalize(const TensorView<T>& out, const TensorView<float>& lse) {
    const bool bshd = layout_->layout() == Layout::bshd;
    const index_t n = layout_->local_tokens(rank_);
    const index_t rows = bshd ? layout_->batch() * n : n;
    for (index_t row = 0; row < rows; ++row) {
      const index_t b = bshd ? row / n : 0, t = bshd ? row % n : row;
      for (index_t h = 0; h < heads_; ++h) {
        const index_t r = row * heads_ + h;
        SoftmaxState& st = state_[static_cast<std::size_t>(r)];
        float* o = acc_.data() + r * dv_;
        if (!sinks_.empty()) {
          const float f = st.absorb_sink(sinks_[static_cast<std::size_t>(h)]);
          for (index_t e = 0; e < dv_; ++e) o[e] *= f;
        }
        const float norm = st.normalizer();
        T* dst = out.data() + (bshd ? b * out.stride(0) + t * out.stride(1) + h * out.stride(2)
                                    : t * out.stride(0) + h * out.stride(1));
        for (index_t e = 0; e < dv_; ++e) dst[e * out.stride(-1)] = from_float<T>(o[e] * norm);
        if (lse.data()) {
          lse.data()[bshd ? b * lse.stride(0) + h * lse.stride(1) + t * lse.stride(2)
                          : h * lse.stride(0) + t * lse.stride(1)] = st.lse();
        }
      }
    }
  }

  template <class Exec>
  void forward_ring(const TensorView<const T>& q, const TensorView<const T>& k, const TensorView<const T>& v,
                    const TensorView<T>& out, const TensorView<float>& lse, Exec& exec) {
    std::fill(acc_.begin(), acc_.end(), 0.0f);
    std::fill(state_.begin(), state_.end(), SoftmaxState{});
    pack(k, v, ring_[0].data());
    const int next = (rank_ + 1) % size_, prev = (rank_ - 1 + size_) % size_;
    const variants::Standard variant{options_.scale, {options_.softcap}, {}};
    detail::InFlight<2> requests({true, false});
    std::exception_ptr failure;
    for (int s = 0; s < size_; ++s) {
      const int src = (rank_ - s + size_) % size_;
      T* cur = ring_[static_cast<std::size_t>(s % 2)].data();
      T* nxt = ring_[static_cast<std::size_t>((s + 1) % 2)].data();
      int pending = 0;
      if (s + 1 < size_) {
        // Next step's shard belongs to rank src - 1 and comes from prev.
        const int incoming = (src - 1 + size_) % size_;
        MPI_Irecv(nxt, static_cast<int>(shard_elements(incoming) * static_cast<index_t>(sizeof(T))), MPI_BYTE, prev,
                  detail::kRingTag, comm_, &requests[0]);
        MPI_Isend(cur, static_cast<int>(shard_elements(src) * static_cast<index_t>(sizeof(T))), MPI_BYTE, next,
                  detail::kRingTag, comm_, &requests[1]);
        pending = 2;
      }
      RingStepTiming& timing = timings_[static_cast<std::size_t>(s)];
      const double t0 = detail::now_s();
      const Step& st = steps_[static_cast<std::size_t>(s)];
      timing.skipped = st.plan == nullptr;
      // After a failure this rank only forwards shards: the peers wait for them.
      if (st.plan && !failure) {
        try {
          const auto [kv_k, kv_v] = unpack_views(cur, src);
          const AttentionInputs<T> in{q, kv_k, kv_v, layout_->layout() == Layout::thd ? &st.table : nullptr};
          detail::ProgressingExec<std::remove_reference_t<Exec>> pexec{exec, requests.data(), pending};
          attention_forward(*st.plan, in, step_out_.view(), step_lse_.view(), variant, pexec);
          merge_step(pexec);
        } catch (...) {
          failure = std::current_exception();
        }
      }
      const double t1 = detail::now_s();
      if (pending) MPI_Waitall(pending, requests.data(), MPI_STATUSES_IGNORE);
      timing.compute_s = t1 - t0;
      timing.wait_s = detail::now_s() - t1;
    }
    detail::agree_on_completion(comm_, failure, "ring_attention_forward");
    finalize(out, lse);
  }

  // Visits the elements of a [B?, tokens, H, D] view in the order of a
  // contiguous tensor of that shape (BSHD batch-major tokens).
  template <class P, class Fn>
  void for_each_row(const TensorView<P>& x, index_t heads, index_t dim, Fn&& fn) const {
    const bool bshd = layout_->layout() == Layout::bshd;
    const index_t n = layout_->local_tokens(rank_);
    const index_t outer = bshd ? layout_->batch() : 1;
    index_t flat = 0;
    for (index_t b = 0; b < outer; ++b) {
      for (index_t t = 0; t < n; ++t) {
        for (index_t h = 0; h < heads; ++h) {
          P* row = x.data() +
                   (bshd ? b * x.stride(0) + t * x.stride(1) + h * x.stride(2) : t * x.stride(0) + h * x.stride(1));
          fn(row, x.stride(-1), flat);
          flat += dim;
        }
      }
    }
  }

  // The ring backward: K/V travel as in the forward pass; with each shard
  // travels its dK/dV accumulator (fp32), one step behind: after step s a
  // rank passes the accumulator of the shard it just used to the next rank,
  // which uses that shard at step s+1, and the transfer overlaps that step's
  // compute. After the last step the accumulator of shard r+1 holds every
  // rank's contribution and one more hop hands it to its owner. Every step
  // uses the global out and lse, so each step's gradients are exact partial
  // sums (FlashAttention-2's backward, split over key shards).
  template <class Exec>
  void backward_ring(const TensorView<const T>& q, const TensorView<const T>& k, const TensorView<const T>& v,
                     const TensorView<const T>& out, const TensorView<const float>& lse,
                     const TensorView<const T>& dout, const TensorView<T>& dq, const TensorView<T>& dk,
                     const TensorView<T>& dv, std::span<float> dsinks, Exec& exec) {
    std::fill(dq_acc_.begin(), dq_acc_.end(), 0.0f);
    std::fill(dkv_ring_[0].begin(), dkv_ring_[0].end(), 0.0f);
    pack(k, v, ring_[0].data());
    const int next = (rank_ + 1) % size_, prev = (rank_ - 1 + size_) % size_;
    const variants::Standard variant{options_.scale, {options_.softcap}, {}};
    detail::InFlight<4> requests({true, false, true, false});
    std::exception_ptr failure;
    const auto bytes = [&](int r, std::size_t elem) {
      return static_cast<int>(shard_elements(r) * static_cast<index_t>(elem));
    };
    for (int s = 0; s < size_; ++s) {
      const int src = (rank_ - s + size_) % size_;
      T* cur = ring_[static_cast<std::size_t>(s % 2)].data();
      T* nxt = ring_[static_cast<std::size_t>((s + 1) % 2)].data();
      float* acc = dkv_ring_[static_cast<std::size_t>(s % 2)].data();
      if (s + 1 < size_) {
        const int incoming = (src - 1 + size_) % size_;
        MPI_Irecv(nxt, bytes(incoming, sizeof(T)), MPI_BYTE, prev, detail::kRingTag, comm_, &requests[0]);
        MPI_Isend(cur, bytes(src, sizeof(T)), MPI_BYTE, next, detail::kRingTag, comm_, &requests[1]);
      }
      const Step& st = steps_[static_cast<std::size_t>(s)];
      // After a failure this rank only forwards shards and accumulators.
      const bool compute = st.plan && !failure;
      if (compute) {
        try {
          const auto [kv_k, kv_v] = unpack_views(cur, src);
          const AttentionInputs<T> in{q, kv_k, kv_v, layout_->layout() == Layout::thd ? &st.table : nullptr};
          const auto [gk, gv] = unpack_views(dkv_step_.data(), src);
          const AttentionGrads<T> grads{dq_step_.view(),
                                        TensorView<T>(const_cast<T*>(gk.data()), gk.shape(), gk.strides()),
                                        TensorView<T>(const_cast<T*>(gv.data()), gv.shape(), gv.strides())};
          detail::ProgressingExec<std::remove_reference_t<Exec>> pexec{exec, requests.data(), 4};
          attention_backward(*st.plan, in, out, lse, dout, grads, variant, pexec);
          const T* g = dq_step_.data();
          for (std::size_t e = 0; e < dq_acc_.size(); ++e) dq_acc_[e] += to_float(g[e]);
        } catch (...) {
          failure = std::current_exception();
        }
      }
      // The accumulator of shard src arrives (requests 2 and 3: the hop
      // posted after the previous step) and this step's dK/dV join it.
      MPI_Waitall(4, requests.data(), MPI_STATUSES_IGNORE);
      if (compute && !failure) {
        const index_t n = shard_elements(src);
        for (index_t e = 0; e < n; ++e) acc[e] += to_float(dkv_step_[static_cast<std::size_t>(e)]);
      }
      float* other = dkv_ring_[static_cast<std::size_t>((s + 1) % 2)].data();
      // Next hop: the accumulator of shard src goes on; the next step's
      // shard's accumulator comes from prev. After the last step this is the
      // hop home.
      MPI_Irecv(other, bytes((src - 1 + size_) % size_, sizeof(float)), MPI_BYTE, prev, detail::kRingTag + 1, comm_,
                &requests[2]);
      MPI_Isend(acc, bytes(src, sizeof(float)), MPI_BYTE, next, detail::kRingTag + 1, comm_, &requests[3]);
    }
    MPI_Waitall(2, requests.data() + 2, MPI_STATUSES_IGNORE);
    detail::agree_on_completion(comm_, failure, "ring_attention_backward");
    // Own shard's accumulator, complete: after P hops it is back.
    const float* own = dkv_ring_[static_cast<std::size_t>(size_ % 2)].data();
    const index_t kv_tokens = shard_tokens(rank_);
    for_each_row(dk, kv_heads_, dk_, [&](T* row, index_t stride, index_t flat) {
      for (index_t e = 0; e < dk_; ++e) row[e * stride] = from_float<T>(own[flat + e]);
    });
    const float* own_v = own + kv_tokens * kv_heads_ * dk_;
    for_each_row(dv, kv_heads_, dv_, [&](T* row, index_t stride, index_t flat) {
      for (index_t e = 0; e < dv_; ++e) row[e * stride] = from_float<T>(own_v[flat + e]);
    });
    for_each_row(dq, heads_, dk_, [&](T* row, index_t stride, index_t flat) {
      for (index_t e = 0; e < dk_; ++e) row[e * stride] = from_float<T>(dq_acc_[static_cast<std::size_t>(flat + e)]);
    });
    if (!dsinks.empty() && !sinks_.empty()) sinks_gradient(out, lse, dout, dsinks);
  }

  // d sink_h = -sum_i exp(sink_h - lse_i) * D_i with D_i = dout_i . out_i,
  // over every rank's rows (the sink is one logit in every row's softmax).
  void sinks_gradient(const TensorView<const T>& out, const TensorView<const float>& lse,
                      const TensorView<const T>& dout, std::span<float> dsinks) const {
    const bool bshd = layout_->layout() == Layout::bshd;
    const index_t n = layout_->local_tokens(rank_);
    const index_t outer = bshd ? layout_->batch() : 1;
    std::vector<double> local(static_cast<std::size_t>(heads_), 0.0), total(local.size(), 0.0);
    for (index_t b = 0; b < outer; ++b) {
      for (index_t t = 0; t < n; ++t) {
        for (index_t h = 0; h < heads_; ++h) {
          const float l = lse.data()[bshd ? b * lse.stride(0) + h * lse.stride(1) + t * lse.stride(2)
                                          : h * lse.stride(0) + t * lse.stride(1)];
          const index_t o =
              bshd ? b * out.stride(0) + t * out.stride(1) + h * out.stride(2) : t * out.stride(0) + h * out.stride(1);
          const index_t g = bshd ? b * dout.stride(0) + t * dout.stride(1) + h * dout.stride(2)
                                 : t * dout.stride(0) + h * dout.stride(1);
          float d = 0.0f;
          for (index_t e = 0; e < dv_; ++e) {
            d += to_float(dout.data()[g + e * dout.stride(-1)]) * to_float(out.data()[o + e * out.stride(-1)]);
          }
          local[static_cast<std::size_t>(h)] -= std::exp(sinks_[static_cast<std::size_t>(h)] - l) * d;
        }
      }
    }
    MPI_Allreduce(local.data(), total.data(), static_cast<int>(heads_), MPI_DOUBLE, MPI_SUM, comm_);
    for (index_t h = 0; h < heads_; ++h)
      dsinks[static_cast<std::size_t>(h)] = static_cast<float>(total[static_cast<std::size_t>(h)]);
  }

  template <class Exec>
  void forward_all_gather(const TensorView<const T>& q, const TensorView<const T>& k, const TensorView<const T>& v,
                          const TensorView<T>& out, const TensorView<float>& lse, Exec& exec) {
    pack(k, v, send_.data());
    MPI_Allgatherv(send_.data(), counts_[static_cast<std::size_t>(rank_)], MPI_BYTE, gathered_.data(), counts_.data(),
                   displs_.data(), MPI_BYTE, comm_);
    // Per sequence, every rank's share in rank order: the key order the
    // gathered map (and so the plan's mask) assumes.
    const ShardLayout& l = *layout_;
    const bool bshd = l.layout() == Layout::bshd;
    const index_t seq = bshd && l.batch() > 0 ? l.global_len(0) : 0;
    const index_t krow = kv_heads_ * dk_, vrow = kv_heads_ * dv_;
    for (index_t b = 0; b < l.batch(); ++b) {
      index_t dst_token = bshd ? b * seq : l.global_offset(b);
      for (int r = 0; r < size_; ++r) {
        const T* base = gathered_.data() + displs_[static_cast<std::size_t>(r)] / static_cast<int>(sizeof(T));
        const index_t n = l.local_len(r, b);
        const index_t src_token = bshd ? b * l.local_tokens(r) : l.local_offset(r, b);
        const T* ks = base + src_token * krow;
        const T* vs = base + shard_tokens(r) * krow + src_token * vrow;
        std::copy(ks, ks + n * krow, full_k_.data() + dst_token * krow);
        std::copy(vs, vs + n * vrow, full_v_.data() + dst_token * vrow);
        dst_token += n;
      }
    }
    const index_t outer = bshd ? l.batch() : 1;
    const index_t tokens = bshd ? seq : l.global_tokens();
    const Extents ks = bshd ? seqattn::detail::make_extents({outer, tokens, kv_heads_, dk_})
                            : seqattn::detail::make_extents({tokens, kv_heads_, dk_});
    const Extents vs = bshd ? seqattn::detail::make_extents({outer, tokens, kv_heads_, dv_})
                            : seqattn::detail::make_extents({tokens, kv_heads_, dv_});
    const Step& st = steps_[0];
    const AttentionInputs<T> in{q, TensorView<const T>(full_k_.data(), ks), TensorView<const T>(full_v_.data(), vs),
                                bshd ? nullptr : &st.table};
    const variants::Standard variant{options_.scale, {options_.softcap}, {sinks_}};
    std::exception_ptr failure;
    try {
      attention_forward(*st.plan, in, out, lse, variant, exec);
    } catch (...) {
      failure = std::current_exception();
    }
    detail::agree_on_completion(comm_, failure, "ring_attention_forward");
  }

  MPI_Comm comm_;
  std::shared_ptr<const ShardLayout> layout_;
  index_t heads_, kv_heads_, dk_, dv_;
  RingOptions options_;
  std::vector<float> sinks_;  // a copy: options.sinks may not outlive the plan
  int rank_ = 0, size_ = 1;
  std::vector<Step> steps_;
  std::vector<bool> skip_;
  // Ring: two wire buffers, the step's output and the running merge.
  std::array<std::vector<T>, 2> ring_;
  Tensor<T> step_out_;
  Tensor<float> step_lse_;
  std::vector<float> acc_;
  std::vector<SoftmaxState> state_;
  std::vector<RingStepTiming> timings_;
  // Backward: the travelling dK/dV accumulators, dQ, one step's gradients.
  std::array<std::vector<float>, 2> dkv_ring_;
  std::vector<float> dq_acc_;
  Tensor<T> dq_step_;
  std::vector<T> dkv_step_;
  // All-gather: staging and the reordered keys and values.
  std::vector<T> send_, gathered_, full_k_, full_v_;
  std::vector<int> counts_, displs_;
};

// One call: plans (collectively) and runs. Reuse a RingPlan to plan once.
template <AttentionBackend Backend = backends::Highway, class T, MaskDescription M, ExecutionPolicy Exec>
void ring_attention_forward(MPI_Comm comm, const ShardLayout& layout, TensorView<const T> q, TensorView<const T> k,
                            TensorView<const T> v, const M& mask, std::type_identity_t<TensorView<T>> out,
                            TensorView<float> lse, const RingOptions& options, Exec&& exec) {
  const bool bshd = layout.layout() == Layout::bshd;
  const int h_axis = bshd ? 2 : 1;
  // Shapes are checked collectively by the plan and the call.
  const auto extent = [&](const TensorView<const T>& x, int axis) {
    return x.rank() > axis ? x.extent(axis) : index_t{0};
  };
  RingPlan<T, Backend> plan(comm, layout, extent(q, h_axis), extent(k, h_axis), extent(q, h_axis + 1),
                            extent(v, h_axis + 1), mask, options, std::max(1, static_cast<int>(exec.workers())));
  plan.forward(q, k, v, out, lse, exec);
}

template <class T, AttentionBackend Backend, ExecutionPolicy Exec>
void ring_attention_forward(RingPlan<T, Backend>& plan, TensorView<const T> q, TensorView<const T> k,
                            TensorView<const T> v, std::type_identity_t<TensorView<T>> out, TensorView<float> lse,
                            Exec&& exec) {
  plan.forward(q, k, v, out, lse, exec);
}

template <class T, AttentionBackend Backend, ExecutionPolicy Exec>
void ring_attention_backward(RingPlan<T, Backend>& plan, TensorView<const T> q, TensorView<const T> k,
                             TensorView<const T> v, std::type_identity_t<TensorView<const T>> out,
                             TensorView<const float> lse, std::type_identity_t<TensorView<const T>> dout,
                             std::type_identity_t<TensorView<T>> dq, std::type_identity_t<TensorView<T>> dk,
                             std::type_identity_t<TensorView<T>> dv, Exec&& exec) {
  plan.backward(q, k, v, out, lse, dout, dq, dk, dv, {}, exec);
}

}  // namespace seqattn::cp
