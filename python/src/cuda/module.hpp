// Shared by the files of seqattn._cuda (module.cpp, jax_ffi_cuda.cpp).
#pragma once

#include <Python.h>
#include <cstdint>
#include <memory>
#include <nanobind/nanobind.h>

#include "seqattn/attention/inputs.hpp"
#include "seqattn/masks/block_mask.hpp"

#include "../core_api.hpp"

namespace seqattn::python::cuda_module {

// The BlockMask of a Python mask object (None: full) for `shape`, built by
// seqattn._core; its errors rethrown here (ValueError for a bad mask).
std::shared_ptr<const BlockMask> core_block_mask(PyObject* mask, const AttentionShape& shape, BlockShape block);

// The BlockMask of a seqattn.jax call (registered mask, host segment ids) at
// the Cuda backend's tiles.
std::shared_ptr<const BlockMask> core_ffi_block_mask(std::int64_t mask_id, const CoreFfiIds& ids,
                                                     const AttentionShape& shape);

[[noreturn]] void rethrow(const CoreError& error);

// The XLA FFI handlers for platform CUDA (jax_ffi_cuda.cpp): has_xla_ffi and
// ffi_handlers(), as seqattn._core has them for the CPU.
void bind_cuda_jax_ffi(nanobind::module_& m);

}  // namespace seqattn::python::cuda_module
