// Whether the arguments of a call share memory.
//
// A kernel that writes a result while it still reads an input (dk over k, dq
// over dout) or writes two results into the same bytes (dq and dk in one
// buffer) returns silently wrong values. Calls check their arguments' memory
// up front with require_disjoint, before anything is written:
//
//   detail::require_disjoint("attention_backward",
//                            {footprint("dq", dq), footprint("dk", dk)},     // written
//                            {footprint("q", q), footprint("dout", dout)});  // read
//
// Two views conflict when one of their elements shares a byte, not merely
// when their address ranges intersect: results interleaved in one buffer,
// like dq, dk and dv of a fused [tokens, 3, heads, dim] gradient, are
// accepted. The test costs O(1) when the address ranges are apart (separate
// buffers) and otherwise one step per contiguous run of the view with fewer
// runs; after kMaxOverlapSteps steps it gives up and reports a possible
// overlap, naming both arguments, rather than risk a wrong result.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <iterator>
#include <span>
#include <utility>

#include "seqattn/core/checked.hpp"
#include "seqattn/core/error.hpp"
#include "seqattn/core/tensor.hpp"

namespace seqattn::detail {

// The bytes one argument covers: a strided view's elements, with its name and
// shape for messages. Empty (no data or no elements): covers nothing.
struct MemoryFootprint {
  const char* name = "";
  std::uintptr_t first = 0;  // address of element (0, ..., 0)
  index_t element_bytes = 0;
  Extents shape;
  Strides byte_strides;
  bool empty() const { return first == 0 || shape.size() == 0; }
};

template <class T>
MemoryFootprint footprint(const char* name, const TensorView<T>& view) {
  MemoryFootprint f{name, reinterpret_cast<std::uintptr_t>(view.data()), static_cast<index_t>(sizeof(T)), view.shape(),
                    view.strides()};
  for (int d = 0; d < f.byte_strides.rank(); ++d) {
    f.byte_strides[d] = checked_mul(f.byte_strides[d], f.element_bytes, name);
  }
  return f;
}

template <class T>
MemoryFootprint footprint(const char* name, std::span<T> values) {
  return {name, reinterpret_cast<std::uintptr_t>(values.data()), static_cast<index_t>(sizeof(T)),
          Extents{static_cast<index_t>(values.size())}, Strides{static_cast<index_t>(sizeof(T))}};
}

namespace overlap {

inline constexpr index_t kMaxOverlapSteps = index_t{1} << 26;
// Bytes a view may span: addresses relative to either view then fit in index_t.
inline constexpr index_t kMaxSpanBytes = index_t{1} << 61;

// A view as contiguous runs of `run` bytes at lowest + sum(i[d] * stride[d]),
// dimensions sorted by decreasing stride, all strides positive.
struct Runs {
  std::uintptr_t lowest = 0;
  index_t run = 0;
  int rank = 0;
  std::array<index_t, kMaxRank> extent{}, stride{};
  std::array<index_t, kMaxRank + 1> hull{};  // bytes spanned by dimensions d.. and the run
  bool self_overlapping = false;             // two elements share a byte
  index_t count() const {
    index_t n = 1;
    for (int d = 0; d < rank; ++d) n = checked_mul(n, extent[static_cast<std::size_t>(d)], "memory overlap: runs");
    return n;
  }
};

inline Runs runs_of(const MemoryFootprint& f) {
  Runs r;
  std::array<std::pair<index_t, index_t>, kMaxRank> dims{};  // (stride, extent), stride > 0
  int n = 0;
  index_t down = 0;  // bytes below `first` that negative strides reach
  for (int d = 0; d < f.shape.rank(); ++d) {
    const index_t e = f.shape[d], s = f.byte_strides[d];
    if (e == 1) continue;
    if (s == 0) {
      r.self_overlapping = true;  // broadcast: every index of d is the same element
      continue;
    }
    const index_t span = checked_mul(e - 1, s < 0 ? -s : s, f.name);
    if (s < 0) down = checked_add(down, span, f.name);
    dims[static_cast<std::size_t>(n++)] = {s < 0 ? -s : s, e};
  }
  // Increasing stride. Insertion sort: at most kMaxRank entries, and GCC 12's
  // std::sort on a prefix of a std::array trips a false -Warray-bounds at -O3.
  for (int i = 1; i < n; ++i) {
    for (int j = i; j > 0 && dims[static_cast<std::size_t>(j)] < dims[static_cast<std::size_t>(j - 1)]; --j) {
      std::swap(dims[static_cast<std::size_t>(j)], dims[static_cast<std::size_t>(j - 1)]);
    }
  }
  r.lowest = f.first - static_cast<std::uintptr_t>(down);
  // Merge the innermost dimensions whose steps touch or overlap the run.
  r.run = f.element_bytes;
  int inner = 0;
  for (; inner < n && dims[static_cast<std::size_t>(inner)].first <= r.run; ++inner) {
    const auto [s, e] = dims[static_cast<std::size_t>(inner)];
    r.self_overlapping = r.self_overlapping || s < r.run;
    r.run = checked_add(checked_mul(e - 1, s, f.name), r.run, f.name);
  }
  for (int d = n - 1; d >= inner; --d) {
    r.stride[static_cast<std::size_t>(r.rank)] = dims[static_cast<std::size_t>(d)].first;
    r.extent[static_cast<std::size_t>(r.rank)] = dims[static_cast<std::size_t>(d)].second;
    ++r.rank;
  }
  r.hull[static_cast<std::size_t>(r.rank)] = r.run;
  for (int d = r.rank - 1; d >= 0; --d) {
    const auto u = static_cast<std::size_t>(d);
    r.hull[u] = checked_add(checked_mul(r.extent[u] - 1, r.stride[u], f.name), r.hull[u + 1], f.name);
  }
  require(r.hull[0] <= kMaxSpanBytes, "memory overlap: ", f.name, " ", f.shape, " spans ", r.hull[0],
          " bytes, more than ", kMaxSpanBytes);
  return r;
}

// Indices i in [0, extent) whose block [base + i * stride, + block) meets
// [lo, hi) (offsets relative to one origin).
inline std::pair<index_t, index_t> blocks_meeting(index_t base, index_t stride, index_t extent, index_t block,
                                                  index_t lo, index_t hi) {
  auto floor_div = [](index_t a, index_t b) { return a / b - (a % b != 0 && a < 0 ? 1 : 0); };
  const index_t first = std::max<index_t>(0, floor_div(lo - block - base, stride) + 1);
  const index_t last = std::min<index_t>(extent - 1, floor_div(hi - 1 - base, stride));
  return {first, std::max(first, last + 1)};
}

struct Search {
  const Runs& a;
  const Runs& b;
  index_t origin_b = 0;  // b.lowest - a.lowest
  index_t steps = 0;
  bool exhausted = false;

  bool spend() {
    if (++steps > kMaxOverlapSteps) exhausted = true;
    return !exhausted;
  }
  // Does some run of b, under b's dimension d at offset base, meet [lo, hi)?
  bool b_meets(int d, index_t base, index_t lo, index_t hi) {
    if (!spend()) return true;
    const auto u = static_cast<std::size_t>(d);
    if (d == b.rank) return base < hi && lo < base + b.run;
    const auto [first, end] = blocks_meeting(base, b.stride[u], b.extent[u], b.hull[u + 1], lo, hi);
    for (index_t i = first; i < end; ++i) {
      if (b_meets(d + 1, base + i * b.stride[u], lo, hi)) return true;
    }
    return false;
  }
  // Does some run of a, under a's dimension d at offset base, meet a run of b?
  bool a_meets_b(int d, index_t base) {
    if (!spend()) return true;
    const auto u = static_cast<std::size_t>(d);
    if (d == a.rank) return b_meets(0, origin_b, base, base + a.run);
    const auto [first, end] =
        blocks_meeting(base, a.stride[u], a.extent[u], a.hull[u + 1], origin_b, origin_b + b.hull[0]);
    for (index_t i = first; i < end; ++i) {
      if (a_meets_b(d + 1, base + i * a.stride[u])) return true;
    }
    return false;
  }
};

}  // namespace overlap

// Throws, naming both arguments and their shapes, when a byte belongs to an
// element of `a` and to an element of `b` (or when that cannot be ruled out
// within overlap::kMaxOverlapSteps steps).
inline void require_disjoint(const char* who, const MemoryFootprint& a, const MemoryFootprint& b) {
  if (a.empty() || b.empty()) return;
  const overlap::Runs ra = overlap::runs_of(a), rb = overlap::runs_of(b);
  const std::uintptr_t a_end = ra.lowest + static_cast<std::uintptr_t>(ra.hull[0]);
  const std::uintptr_t b_end = rb.lowest + static_cast<std::uintptr_t>(rb.hull[0]);
  if (a_end <= rb.lowest || b_end <= ra.lowest) return;
  // The view with fewer runs drives the search; offsets are relative to it.
  const bool a_first = ra.count() <= rb.count();
  const overlap::Runs& driver = a_first ? ra : rb;
  const overlap::Runs& other = a_first ? rb : ra;
  overlap::Search search{driver, other, static_cast<index_t>(other.lowest - driver.lowest)};
  if (!search.a_meets_b(0, 0)) return;
  throw_invalid(who, ": ", a.name, " ", a.shape, " and ", b.name, " ", b.shape,
                search.exhausted ? " may overlap in memory (their elements interleave too finely to rule it out)"
                                 : " overlap in memory",
                "; a result must not share memory with an input or with another result: use separate buffers");
}

// Every written argument against every read one and against the other
// written ones; a written argument whose own elements share memory (a zero
// stride) is refused too: its element would be written more than once.
inline void require_disjoint(const char* who, std::initializer_list<MemoryFootprint> written,
                             std::initializer_list<MemoryFootprint> read) {
  for (auto w = written.begin(); w != written.end(); ++w) {
    if (!w->empty() && overlap::runs_of(*w).self_overlapping) {
      Strides strides = w->byte_strides;
      for (int d = 0; d < strides.rank(); ++d) strides[d] /= w->element_bytes;
      throw_invalid(who, ": ", w->name, " ", w->shape, " with strides ", strides,
                    " has elements that overlap in memory (a zero or too small stride): its results would be written "
                    "over each other");
    }
    for (const MemoryFootprint& r : read) require_disjoint(who, *w, r);
    for (auto other = std::next(w); other != written.end(); ++other) require_disjoint(who, *w, *other);
  }
}

}  // namespace seqattn::detail
