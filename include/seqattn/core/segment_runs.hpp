// The one parser of segment-id runs, shared by sequence descriptors
// (descriptors/detail/thd_rows.hpp) and document masks (masks/document.hpp).
// docs/semantics/sequence-descriptors.md §7 states the same rules in prose.
//
// Rules, for one row of ids[0, len) and, optionally, positions pos[0, len):
//
//   R1. Id 0 is padding: a padding token belongs to no run and its position
//       is never read. Padding may sit anywhere (before, between and after
//       runs).
//   R2. A negative id is an error.
//   R3. A run is a maximal stretch of consecutive tokens with the same
//       non-zero id. Only a change of id (to another id or to padding) ends a
//       run; positions never split one (a position reset inside a stretch of
//       equal ids is not a new run, as in TransformerEngine's boundary rule).
//   R4. Each id forms at most one run per row: an id that appears again after
//       its run ended is an error. Ids need not be ordered or dense here.
//   R5. Positions, when asked for, are summarized per run:
//         RunPositions::none         not read (first/min/max stay 0);
//         RunPositions::range        first, min and max over the run, any values;
//         RunPositions::consecutive  must count up by one from the run's first
//                                    position (an error otherwise), so
//                                    min = first and max = first + length - 1.
//
// Runs are reported in token order. Callers layer their own rules on top
// through the Rules hook `on_run_start`, called when a run starts (before any
// token after its first is examined), with the id, its first token, its first
// position and how many runs precede it in the row:
//   - descriptors (TE semantics): ids number the runs 1, 2, 3, ... in order
//     of appearance, and no id exceeds max_segments_per_seq;
//   - DocumentLayout: the first position of each run is >= 0.
// The Rules type also words the errors of R2, R4 and R5 (StandardRunRules
// gives the default wording: argument, shape, row, token, offending value).
//
// Cost: one pass over the ids (and positions), vectorized over whole blocks
// inside long runs; per run, O(1) unless ids stop increasing, in which case
// R4 is checked through a hash map built on first need.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>

#include "seqattn/core/error.hpp"
#include "seqattn/core/tensor.hpp"

namespace seqattn::detail {

// A row of ids or positions; Unit = the token axis is contiguous.
template <bool Unit>
struct RowPtr {
  const std::int32_t* p;
  index_t step;
  std::int32_t operator[](index_t t) const { return Unit ? p[t] : p[t * step]; }
};

enum class RunPositions { none, range, consecutive };

// One run of one row, in row-local token indices.
struct ParsedRun {
  std::int32_t id = 0;
  index_t begin = 0;  // first token
  index_t end = 0;    // one past the last token
  std::int32_t first_pos = 0, min_pos = 0, max_pos = 0;

  index_t length() const { return end - begin; }
};

// The hooks a caller gives the parser: its extra rules and the wording of
// every error (each error hook must throw).
template <class R>
concept SegmentRunRules = requires(R& r, std::int32_t id, index_t t, const ParsedRun& earlier) {
  r.on_run_start(id, t, id, t);                // (id, first token, first position, runs before it)
  r.negative_id(t, id);                        // R2
  r.repeated_id(t, id, earlier);               // R4: `earlier` is the id's previous run
  r.positions_not_consecutive(t, id, id, id);  // R5: (token, id, its position, the previous one)
};

// The default wording: "<arg> of shape S, row r, token t: ...". Where is a
// callable returning the "<arg> of shape S, row r" part (built only when an
// error is thrown).
template <class Where>
struct StandardRunRules {
  Where where;

  void on_run_start(std::int32_t, index_t, std::int32_t, index_t) const {}
  [[noreturn]] void negative_id(index_t t, std::int32_t v) const {
    throw_invalid(where(), ", token ", t, ": negative segment id ", v, " (0 is padding, real ids start at 1)");
  }
  [[noreturn]] void repeated_id(index_t t, std::int32_t v, const ParsedRun& earlier) const {
    throw_invalid(where(), ", token ", t, ": segment id ", v, " appears again after its run ended at token ",
                  earlier.end - 1, "; each segment must be one contiguous run (padding only between segments)");
  }
  [[noreturn]] void positions_not_consecutive(index_t t, std::int32_t v, std::int32_t p, std::int32_t prev) const {
    throw_invalid(where(), ", token ", t, ": positions within segment ", v, " must count up by one, got ", p, " after ",
                  prev);
  }
};

inline constexpr index_t kScanBlock = 32;

// Parses rows into runs; keep one per thread and reuse it across rows (its
// buffers keep their capacity).
class SegmentRunParser {
 public:
  // Makes room for `runs` runs per row up front (optional: the buffer grows
  // on demand otherwise).
  void reserve(index_t runs) {
    if (runs > 0 && static_cast<std::size_t>(runs) > runs_.capacity)
      runs_.reallocate(static_cast<std::size_t>(runs), 0);
  }

  // Parses one row; the result stays valid until the next parse.
  template <RunPositions Positions, bool Unit, SegmentRunRules Rules>
  std::span<const ParsedRun> parse(RowPtr<Unit> ids, RowPtr<Unit> pos, index_t len, Rules& rules) {
    if (indexed_) {
      by_id_.clear();
      indexed_ = false;
    }
    // Hot loop per run: the run count, the buffer and the R4 state live in
    // locals (registers), each run's fields are stored once, straight into
    // the buffer, and the buffer is only resized on a cold path.
    ParsedRun* out = runs_.data;
    std::size_t capacity = runs_.capacity, n = 0;
    std::int32_t max_id = 0;  // runs so far have ids <= max_id; a larger id is new (R4) without a lookup
    bool indexed = false;     // by_id_ holds every run so far (built once ids stop increasing)
    index_t t = 0;
    while (t < len) {
      const std::int32_t v = ids[t];
      if (v == 0) {  // R1
        ++t;
        continue;
      }
      if (v < 0) [[unlikely]]
        rules.negative_id(t, v);  // R2
      if (v > max_id) [[likely]] {
        max_id = v;
        if (indexed) [[unlikely]]
          by_id_.emplace(v, n);
      } else {
        indexed = check_new(t, v, n, indexed, rules);
      }
      std::int32_t first_pos = 0, lo = 0, hi = 0;
      if constexpr (Positions != RunPositions::none) first_pos = pos[t];
      rules.on_run_start(v, t, first_pos, static_cast<index_t>(n));
      const index_t begin = t++;
      if constexpr (Positions == RunPositions::consecutive) {
        t = scan_consecutive(ids, pos, len, t, v, begin, first_pos, rules);
        lo = first_pos;
        hi = static_cast<std::int32_t>(static_cast<std::int64_t>(first_pos) + (t - 1 - begin));
      } else if constexpr (Positions == RunPositions::range) {
        lo = hi = first_pos;
        t = scan_range(ids, pos, len, t, v, lo, hi);
      } else {
        t = scan_ids(ids, len, t, v);
      }
      if (n == capacity) [[unlikely]] {
        runs_.reallocate(std::max<std::size_t>(64, 2 * n), n);
        out = runs_.data;
        capacity = runs_.capacity;
      }
      std::construct_at(out + n++, ParsedRun{v, begin, t, first_pos, lo, hi});
    }
    count_ = n;
    return runs();
  }

  std::span<const ParsedRun> runs() const { return {runs_.data, count_}; }

 private:
  // R3 without positions: the end of the run of v that continues at token t.
  // Whole blocks inside the run are compared branch-free (vectorized); a
  // probe of the block's last token skips blocks where the run visibly ends
  // (short segments), which are done token by token.
  template <bool Unit>
  static index_t scan_ids(RowPtr<Unit> ids, index_t len, index_t t, std::int32_t v) {
    if constexpr (Unit) {
      while (t + kScanBlock <= len && ids[t + kScanBlock - 1] == v) {
        std::int32_t differs = 0;
        for (index_t k = 0; k < kScanBlock; ++k) differs |= ids[t + k] ^ v;
        if (differs != 0) break;
        t += kScanBlock;
      }
    }
    while (t < len && ids[t] == v) ++t;
    return t;
  }

  // R3 with RunPositions::range: as scan_ids, folding positions into [lo, hi].
  template <bool Unit>
  static index_t scan_range(RowPtr<Unit> ids, RowPtr<Unit> pos, index_t len, index_t t, std::int32_t v,
                            std::int32_t& lo_out, std::int32_t& hi_out) {
    std::int32_t lo = lo_out, hi = hi_out;
    if constexpr (Unit) {
      while (t + kScanBlock <= len && ids[t + kScanBlock - 1] == v) {
        std::int32_t differs = 0, block_lo = lo, block_hi = hi;
        for (index_t k = 0; k < kScanBlock; ++k) {
          differs |= ids[t + k] ^ v;
          block_lo = std::min(block_lo, pos[t + k]);
          block_hi = std::max(block_hi, pos[t + k]);
        }
        if (differs != 0) break;
        lo = block_lo;
        hi = block_hi;
        t += kScanBlock;
      }
    }
    for (; t < len && ids[t] == v; ++t) {
      lo = std::min(lo, pos[t]);
      hi = std::max(hi, pos[t]);
    }
    lo_out = lo;
    hi_out = hi;
    return t;
  }

  // R3 + R5 with RunPositions::consecutive: token t must hold position
  // first_pos + (t - begin), compared in 64 bits (no wrap past INT32_MAX).
  template <bool Unit, class Rules>
  static index_t scan_consecutive(RowPtr<Unit> ids, RowPtr<Unit> pos, index_t len, index_t t, std::int32_t v,
                                  index_t begin, std::int32_t first_pos, Rules& rules) {
    const auto expected = [&](index_t at) { return static_cast<std::int64_t>(first_pos) + (at - begin); };
    if constexpr (Unit) {
      // Blocks whose expected positions all fit int32 compare branch-free.
      while (t + kScanBlock <= len && ids[t + kScanBlock - 1] == v &&
             expected(t + kScanBlock - 1) <= std::numeric_limits<std::int32_t>::max()) {
        const auto base = static_cast<std::int32_t>(expected(t));
        std::int32_t differs = 0;
        for (index_t k = 0; k < kScanBlock; ++k) {
          differs |= (ids[t + k] ^ v) | (pos[t + k] ^ (base + static_cast<std::int32_t>(k)));
        }
        if (differs != 0) break;
        t += kScanBlock;
      }
    }
    for (; t < len && ids[t] == v; ++t) {
      if (pos[t] != expected(t)) [[unlikely]]
        rules.positions_not_consecutive(t, v, pos[t], pos[t - 1]);
    }
    return t;
  }

  // R4 for an id not larger than every earlier one (ids stopped increasing):
  // index the n runs so far by id on first need, then look it up.
  // Returns true (the runs are now indexed).
  template <class Rules>
  [[gnu::noinline]] bool check_new(index_t t, std::int32_t v, std::size_t n, bool indexed, Rules& rules) {
    if (!indexed) {
      for (std::size_t r = 0; r < n; ++r) by_id_.emplace(runs_.data[r].id, r);
      indexed_ = true;
    }
    if (const auto it = by_id_.find(v); it != by_id_.end()) rules.repeated_id(t, v, runs_.data[it->second]);
    by_id_.emplace(v, n);
    return true;
  }

  // Room for runs without initializing it (a vector would zero what reserve
  // asks for); the first count_ are the last row's runs.
  struct Buffer {
    ParsedRun* data = nullptr;
    std::size_t capacity = 0;

    Buffer() = default;
    Buffer(const Buffer&) = delete;
    Buffer& operator=(const Buffer&) = delete;
    ~Buffer() {
      if (data != nullptr) std::allocator<ParsedRun>().deallocate(data, capacity);
    }
    // Grows to `size` runs, keeping the first `keep`.
    [[gnu::noinline]] void reallocate(std::size_t size, std::size_t keep) {
      ParsedRun* grown = std::allocator<ParsedRun>().allocate(size);
      if (keep > 0) std::uninitialized_copy_n(data, keep, grown);
      if (data != nullptr) std::allocator<ParsedRun>().deallocate(data, capacity);
      data = grown;
      capacity = size;
    }
  };

  Buffer runs_;
  std::size_t count_ = 0;
  std::unordered_map<std::int32_t, std::size_t> by_id_;  // id -> run, once indexed_
  bool indexed_ = false;
};

}  // namespace seqattn::detail
