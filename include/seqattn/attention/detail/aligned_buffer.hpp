// 64-byte aligned buffers of the CPU engine's tiles and packed K/V (no
// hwy::AllocateAligned: it needs libhwy).
#pragma once

#include <algorithm>
#include <cstddef>
#include <memory>
#include <new>

#include "seqattn/core/checked.hpp"

namespace seqattn::detail {

// n elements of T, 64-byte aligned, zeroed unless its owner writes every
// element before reading it (Uninitialized).
template <class T>
class AlignedBuffer {
 public:
  struct Uninitialized {};
  AlignedBuffer() = default;
  explicit AlignedBuffer(index_t n) : AlignedBuffer(n, Uninitialized{}) { std::fill_n(data_.get(), n, T{}); }
  AlignedBuffer(index_t n, Uninitialized)
      : data_(static_cast<T*>(
            ::operator new (static_cast<std::size_t>(std::max<index_t>(n, 1)) * sizeof(T), std::align_val_t{64}))),
        size_(n) {}
  T* get() const { return data_.get(); }
  index_t size() const { return size_; }

 private:
  struct Free {
    void operator()(T* p) const { ::operator delete (p, std::align_val_t{64}); }
  };
  std::unique_ptr<T, Free> data_;
  index_t size_ = 0;
};

using AlignedFloats = AlignedBuffer<float>;

}  // namespace seqattn::detail
