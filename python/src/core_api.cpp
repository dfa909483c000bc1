// seqattn._core's side of the CoreApi (core_api.hpp): the BlockMasks that
// seqattn._cuda plans with, from Python mask objects and from the masks
// seqattn.jax registered.
#include "core_api.hpp"

#include <exception>
#include <memory>
#include <nanobind/nanobind.h>
#include <new>
#include <stdexcept>
#include <utility>

#include "seqattn/core/error.hpp"
#include "seqattn/masks/any_mask.hpp"

#include "bindings.hpp"
#include "internal.hpp"

namespace seqattn::python {

namespace {

// Runs `build`, turning an exception into `error` (exceptions do not cross
// into the other module).
template <class Build>
std::shared_ptr<const BlockMask> guarded(CoreError& error, Build&& build) {
  error = {};
  try {
    return build();
  } catch (const std::invalid_argument& e) {
    error = {1, e.what()};
  } catch (const std::bad_alloc& e) {
    error = {2, e.what()};
  } catch (const nb::python_error& e) {
    error = {3, e.what()};
  } catch (const std::exception& e) {
    error = {3, e.what()};
  }
  return nullptr;
}

std::shared_ptr<const BlockMask> build(const AnyMask& mask, const AttentionShape& shape, BlockShape block,
                                       bool store_tile_bits) {
  return std::make_shared<const BlockMask>(
      build_block_mask(mask, shape.lengths, shape.heads, block, BlockMaskOptions{store_tile_bits}));
}

std::shared_ptr<const BlockMask> block_mask_of_object(PyObject* mask, const AttentionShape& shape, BlockShape block,
                                                      bool store_tile_bits, CoreError& error) {
  return guarded(error, [&] {
    const nb::handle h(mask);
    const AnyMask any = h.is_valid() && !h.is_none() ? mask_from_python(h) : AnyMask();
    return build(any, shape, block, store_tile_bits);
  });
}

std::shared_ptr<const BlockMask> block_mask_of_ffi(std::int64_t mask_id, const CoreFfiIds& ids,
                                                   const AttentionShape& shape, BlockShape block, bool store_tile_bits,
                                                   CoreError& error) {
  return guarded(error, [&] { return build(ffi_call_mask(mask_id, ids), shape, block, store_tile_bits); });
}

}  // namespace

void bind_core_api(nb::module_& m) {
  static const CoreApi api = [] {
    CoreApi a;
    a.block_mask = &block_mask_of_object;
    a.ffi_block_mask = &block_mask_of_ffi;
    return a;
  }();
  m.attr("_core_api") = nb::capsule(&api, kCoreApiCapsule);
}

}  // namespace seqattn::python
