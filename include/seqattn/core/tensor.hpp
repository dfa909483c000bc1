// N-d shapes, non-owning strided views and owning tensors.
//
// Inputs of any rank arrive as `TensorView<const T>` (a pointer, extents and
// element strides; nothing is copied). Outputs the library produces are
// returned as `Tensor<T>`, which owns contiguous row-major storage and hands
// out views of itself. Rank is dynamic (at most kMaxRank) because segment ids
// may carry any number of extra leading "vmapped" batch dimensions.
#pragma once

#include <algorithm>
#include <array>
#include <cassert>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <ostream>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "seqattn/core/checked.hpp"
#include "seqattn/core/error.hpp"

namespace seqattn {

using index_t = std::ptrdiff_t;
inline constexpr int kMaxRank = 8;

// A small fixed-capacity list of dimensions: used for shapes and strides.
class Extents {
 public:
  constexpr Extents() = default;
  // Extents{2, 3} or Extents{2, ids.size()}: any integer types, so that a
  // size_t (a vector's size) needs no cast, which a std::initializer_list of
  // index_t would make a narrowing error. Lists of one type take the first
  // constructor, mixed types the second (two or more extents: a single integer
  // does not convert to Extents implicitly). A value beyond index_t becomes
  // negative and every size check rejects it as a negative extent.
  template <std::integral I>
  constexpr Extents(std::initializer_list<I> dims) {  // NOLINT(google-explicit-constructor)
    if (dims.size() > static_cast<std::size_t>(kMaxRank)) {
      detail::throw_invalid("Extents: rank ", dims.size(), " exceeds kMaxRank=", kMaxRank);
    }
    for (const I d : dims) dims_[static_cast<std::size_t>(rank_++)] = static_cast<index_t>(d);
  }
  template <std::integral... I>
  requires(sizeof...(I) >= 2 && sizeof...(I) <= kMaxRank) constexpr Extents(I... dims)  // NOLINT
      : dims_{static_cast<index_t>(dims)...}, rank_(static_cast<int>(sizeof...(I))) {}
  explicit Extents(std::span<const index_t> dims) {
    if (dims.size() > static_cast<std::size_t>(kMaxRank)) {
      detail::throw_invalid("Extents: rank ", dims.size(), " exceeds kMaxRank=", kMaxRank);
    }
    for (index_t d : dims) dims_[static_cast<std::size_t>(rank_++)] = d;
  }

  constexpr int rank() const { return rank_; }
  constexpr index_t operator[](int i) const { return dims_[static_cast<std::size_t>(i)]; }
  constexpr index_t& operator[](int i) { return dims_[static_cast<std::size_t>(i)]; }
  constexpr index_t back() const { return dims_[static_cast<std::size_t>(rank_ - 1)]; }
  std::span<const index_t> dims() const { return {dims_.data(), static_cast<std::size_t>(rank_)}; }

  // Number of elements (1 for rank 0). Throws when the product of the
  // extents does not fit in index_t (with a zero extent the size is 0).
  constexpr index_t size() const {
    index_t n = 1;
    bool fits = true;
    for (int i = 0; i < rank_; ++i) {
      const index_t d = dims_[static_cast<std::size_t>(i)];
      if (d == 0) return 0;
      fits = fits && detail::mul_fits(n, d, n);
    }
    if (!fits) detail::throw_invalid("Extents: the product of ", to_string(), " overflows 64-bit size arithmetic");
    return n;
  }
  bool any_negative() const {
    for (int i = 0; i < rank_; ++i) {
      if (dims_[static_cast<std::size_t>(i)] < 0) return true;
    }
    return false;
  }

  void push_back(index_t d) {
    if (rank_ == kMaxRank) detail::throw_invalid("Extents: rank exceeds kMaxRank=", kMaxRank);
    dims_[static_cast<std::size_t>(rank_++)] = d;
  }
  // The first / last n dimensions.
  Extents first(int n) const { return Extents(dims().first(static_cast<std::size_t>(n))); }
  Extents last(int n) const { return Extents(dims().last(static_cast<std::size_t>(n))); }
  Extents drop_first(int n) const { return last(rank_ - n); }
  Extents drop_last(int n) const { return first(rank_ - n); }
  Extents concat(const Extents& tail) const {
    Extents out = *this;
    for (index_t d : tail.dims()) out.push_back(d);
    return out;
  }

  friend constexpr bool operator==(const Extents& a, const Extents& b) {
    if (a.rank_ != b.rank_) return false;
    for (int i = 0; i < a.rank_; ++i) {
      if (a[i] != b[i]) return false;
    }
    return true;
  }

  // "(2, 1, 8)"; a rank-1 shape prints as "(8,)" like NumPy so it reads as a shape.
  std::string to_string() const {
    std::string s = "(";
    for (int i = 0; i < rank_; ++i) {
      if (i) s += ", ";
      s += std::to_string(dims_[static_cast<std::size_t>(i)]);
    }
    if (rank_ == 1) s += ",";
    return s + ")";
  }
  friend std::ostream& operator<<(std::ostream& os, const Extents& e) { return os << e.to_string(); }

 private:
  std::array<index_t, kMaxRank> dims_{};
  int rank_ = 0;
};

using Strides = Extents;

// Row-major (C order) element strides for a shape. Strides past a zero
// extent are never used to address an element; they saturate instead of
// overflowing (a shape of size 0 may have huge other extents).
inline Strides row_major_strides(const Extents& shape) {
  Strides s = shape;
  index_t step = 1;
  for (int i = shape.rank() - 1; i >= 0; --i) {
    s[i] = step;
    if (!detail::mul_fits(step, shape[i], step)) step = std::numeric_limits<index_t>::max();
  }
  return s;
}

namespace detail {
// Extents built by push_back. GCC 12 reports a false -Wmaybe-uninitialized for
// brace-initialized Extents temporaries in some inlining contexts (some bf16
// instantiations of the attention problem, the scenario headers), so those
// build their shapes through this.
inline Extents make_extents(std::initializer_list<index_t> dims) {
  Extents e;
  for (index_t d : dims) e.push_back(d);
  return e;
}

// Throws unless `shape` is a valid size for a buffer seqattn allocates:
// non-negative extents, at most limits::kMaxTensorElements elements.
inline index_t checked_tensor_size(const Extents& shape, const char* what) {
  if (shape.any_negative()) throw_invalid(what, ": shape ", shape, " has a negative extent");
  index_t n = 1;
  for (const index_t d : shape.dims()) {
    if (d == 0) return 0;
    if (!mul_fits(n, d, n) || n > limits::kMaxTensorElements) {
      throw_invalid(what, ": shape ", shape, " has more than the limit of ", limits::kMaxTensorElements,
                    " elements (limits::kMaxTensorElements)");
    }
  }
  return n;
}
}  // namespace detail

// Non-owning strided N-d view. Strides are in elements and may be zero
// (broadcast) or arbitrary (a slice of a larger tensor).
template <class T>
class TensorView {
 public:
  using element_type = T;
  using value_type = std::remove_cv_t<T>;

  TensorView() = default;
  TensorView(T* data, const Extents& shape) : data_(data), shape_(shape), strides_(row_major_strides(shape)) {}
  TensorView(T* data, const Extents& shape, const Strides& strides) : data_(data), shape_(shape), strides_(strides) {
    detail::require(shape.rank() == strides.rank(), "TensorView: shape ", shape, " and strides ", strides,
                    " differ in rank");
  }
  // A rank-1 view of a contiguous range.
  explicit TensorView(std::span<T> values) : TensorView(values.data(), Extents{static_cast<index_t>(values.size())}) {}
  // A row-major view of `shape` over an existing buffer (a std::vector, an
  // array, memory from another library), checked to be large enough:
  //   std::vector<float> q(tokens * heads * dim);
  //   seqattn::TensorView<const float> qv(q, {tokens, heads, dim});
  TensorView(std::span<T> buffer, const Extents& shape) : TensorView(buffer.data(), shape) {
    const index_t needed = detail::checked_tensor_size(shape, "TensorView");
    detail::require(static_cast<std::size_t>(needed) <= buffer.size(), "TensorView: shape ", shape, " needs ", needed,
                    " elements but the buffer holds ", buffer.size());
  }

  // View of T converts to view of const T.
  template <class U>
  requires(!std::is_same_v<U, T> && std::is_convertible_v<U (*)[], T (*)[]>)
      TensorView(const TensorView<U>& other)  // NOLINT(google-explicit-constructor)
      : data_(other.data()), shape_(other.shape()), strides_(other.strides()) {}

  T* data() const { return data_; }
  const Extents& shape() const { return shape_; }
  const Strides& strides() const { return strides_; }
  int rank() const { return shape_.rank(); }
  index_t extent(int d) const { return shape_[d < 0 ? d + rank() : d]; }
  index_t stride(int d) const { return strides_[d < 0 ? d + rank() : d]; }
  index_t size() const { return shape_.size(); }
  bool empty() const { return size() == 0; }

  bool is_contiguous() const { return strides_ == row_major_strides(shape_) || size() <= 1; }

  template <class... I>
  T& operator()(I... idx) const {
    static_assert((std::is_integral_v<I> && ...), "indices must be integers");
    assert(static_cast<int>(sizeof...(I)) == rank());
    index_t offset = 0;
    int d = 0;
    ((offset += static_cast<index_t>(idx) * strides_[d++]), ...);
    return data_[offset];
  }

  T& at(std::span<const index_t> idx) const {
    assert(static_cast<int>(idx.size()) == rank());
    index_t offset = 0;
    for (int d = 0; d < rank(); ++d) offset += idx[static_cast<std::size_t>(d)] * strides_[d];
    return data_[offset];
  }

  // Fix dimension `dim` at index `i`; the result has one dimension fewer.
  TensorView select(int dim, index_t i) const {
    Extents shape;
    Strides strides;
    for (int d = 0; d < rank(); ++d) {
      if (d == dim) continue;
      shape.push_back(shape_[d]);
      strides.push_back(strides_[d]);
    }
    return TensorView(data_ + i * strides_[dim], shape, strides);
  }

  // Keep [begin, end) of dimension `dim`.
  TensorView slice(int dim, index_t begin, index_t end) const {
    Extents shape = shape_;
    shape[dim] = end - begin;
    return TensorView(data_ + begin * strides_[dim], shape, strides_);
  }

  // Same elements, new shape; only for contiguous views.
  TensorView reshape(const Extents& shape) const {
    detail::require(is_contiguous(), "TensorView::reshape: view of shape ", shape_, " with strides ", strides_,
                    " is not contiguous");
    detail::require(shape.size() == size(), "TensorView::reshape: cannot reshape ", shape_, " into ", shape);
    return TensorView(data_, shape);
  }

 private:
  T* data_ = nullptr;
  Extents shape_;
  Strides strides_;
};

template <class T>
TensorView(T*, const Extents&) -> TensorView<T>;

// Owning, contiguous, row-major tensor.
template <class T>
class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(const Extents& shape)
      : shape_(shape), values_(static_cast<std::size_t>(detail::checked_tensor_size(shape_, "Tensor"))) {}
  Tensor(const Extents& shape, const T& fill)
      : shape_(shape), values_(static_cast<std::size_t>(detail::checked_tensor_size(shape_, "Tensor")), fill) {}
  Tensor(const Extents& shape, std::vector<T> values) : shape_(shape), values_(std::move(values)) {
    detail::require(static_cast<index_t>(values_.size()) == detail::checked_tensor_size(shape_, "Tensor"),
                    "Tensor: ", values_.size(), " values do not fill shape ", shape_);
  }

  const Extents& shape() const { return shape_; }
  int rank() const { return shape_.rank(); }
  index_t extent(int d) const { return shape_[d < 0 ? d + rank() : d]; }
  index_t size() const { return static_cast<index_t>(values_.size()); }
  bool empty() const { return values_.empty(); }
  T* data() { return values_.data(); }
  const T* data() const { return values_.data(); }
  std::span<T> values() { return values_; }
  std::span<const T> values() const { return values_; }

  TensorView<T> view() { return TensorView<T>(values_.data(), shape_); }
  TensorView<const T> view() const { return TensorView<const T>(values_.data(), shape_); }
  operator TensorView<T>() { return view(); }              // NOLINT(google-explicit-constructor)
  operator TensorView<const T>() const { return view(); }  // NOLINT(google-explicit-constructor)

  template <class... I>
  T& operator()(I... idx) {
    return view()(idx...);
  }
  template <class... I>
  const T& operator()(I... idx) const {
    return view()(idx...);
  }

  // Element-wise equality of shape and values.
  friend bool operator==(const Tensor& a, const Tensor& b) { return a.shape_ == b.shape_ && a.values_ == b.values_; }

 private:
  Extents shape_;
  std::vector<T> values_;
};

// Copies a view (any strides) into a new contiguous tensor.
template <class T>
Tensor<std::remove_cv_t<T>> to_tensor(TensorView<T> view) {
  Tensor<std::remove_cv_t<T>> out(view.shape());
  std::vector<index_t> idx(static_cast<std::size_t>(view.rank()), 0);
  const index_t n = out.size();
  for (index_t flat = 0; flat < n; ++flat) {
    out.data()[flat] = view.at(idx);
    for (int d = view.rank() - 1; d >= 0; --d) {
      if (++idx[static_cast<std::size_t>(d)] < view.extent(d)) break;
      idx[static_cast<std::size_t>(d)] = 0;
    }
  }
  return out;
}

namespace detail {

// Throws unless `view` has exactly `rank` dimensions, none negative.
template <class T>
void require_rank(const TensorView<T>& view, int rank, const char* name) {
  require(view.rank() == rank, name, " must have rank ", rank, ", got shape ", view.shape());
  require(!view.shape().any_negative(), name, " has a negative extent: shape ", view.shape());
}

// Throws unless `view` has exactly the shape `expected`.
template <class T>
void require_shape(const TensorView<T>& view, const Extents& expected, const char* name) {
  require(view.shape() == expected, name, " must have shape ", expected, ", got ", view.shape());
}

}  // namespace detail
}  // namespace seqattn
