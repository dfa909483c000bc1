// The C++ interface seqattn._core offers seqattn._cuda: the masks (Python
// mask objects, the masks seqattn.jax registered) stay in _core, and _cuda,
// a separate extension module built only with CUDA, asks _core for the
// BlockMask of a call. _core publishes one CoreApi as the capsule
// `_core._core_api` (named kCoreApiCapsule); _cuda checks its version when it
// is imported. Both modules are built from the same sources by the same
// compiler, so C++ types cross; exceptions do not: a failure comes back as a
// CoreError, which the caller rethrows as its own exception.
#pragma once

#include <Python.h>
#include <cstdint>
#include <memory>
#include <string>

#include "seqattn/attention/inputs.hpp"
#include "seqattn/core/tensor.hpp"
#include "seqattn/masks/block_mask.hpp"

namespace seqattn::python {

inline constexpr const char* kCoreApiCapsule = "seqattn._core.CoreApi";
inline constexpr std::uint32_t kCoreApiVersion = 1;

// Why a CoreApi call failed: kind 1 a seqattn::invalid_argument (ValueError),
// 2 out of memory (MemoryError), 3 anything else (RuntimeError).
struct CoreError {
  int kind = 0;
  std::string message;
};

// Segment ids and positions of an XLA call, on the host, [rows, S]; a view
// without data: not given (kv ids default to the q ids, kv positions to the q positions).
struct CoreFfiIds {
  TensorView<const std::int32_t> q_ids, kv_ids, q_pos, kv_pos;
};

struct CoreApi {
  std::uint32_t version = kCoreApiVersion;
  // The BlockMask of `mask` (a seqattn.Mask object; None: full) for `shape`,
  // tiled by `block`: what plan_attention builds from a mask (validating it
  // against the lengths and heads). Needs the GIL. Null on failure, `error` set.
  std::shared_ptr<const BlockMask> (*block_mask)(PyObject* mask, const AttentionShape& shape, BlockShape block,
                                                 bool store_tile_bits, CoreError& error) = nullptr;
  // The same for the mask seqattn.jax registered as `mask_id`, inside a
  // document mask over `ids` when q ids are given (jax_ffi.cpp's call_plan).
  // Needs no GIL.
  std::shared_ptr<const BlockMask> (*ffi_block_mask)(std::int64_t mask_id, const CoreFfiIds& ids,
                                                     const AttentionShape& shape, BlockShape block,
                                                     bool store_tile_bits, CoreError& error) = nullptr;
};

}  // namespace seqattn::python
