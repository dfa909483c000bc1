// The contract between the files of the `seqattn._core` extension module.
//
// module.cpp owns NB_MODULE(_core, m). CMake globs python/src/*.cpp and
// defines SEQATTN_PY_HAVE_SPLASH / SEQATTN_PY_HAVE_FLEX when
// splash_bindings.cpp / flex_bindings.cpp exist; the module then calls
// bind_splash(m) / bind_flex(m) after every class below is registered, so a
// bind_* function may take the mask objects (`seqattn._core.Mask`) as
// `nanobind::handle` / `nanobind::object` arguments and read them with
// mask_from_python.
//
// Conventions every binding file follows: errors are thrown as
// seqattn::invalid_argument (or std::invalid_argument) and reach Python as
// ValueError with the same message; long computations release the GIL.
#pragma once

#include <memory>
#include <nanobind/nanobind.h>
#include <string>

#include "seqattn/masks/any_mask.hpp"
#include "seqattn/masks/block_mask.hpp"

namespace seqattn::python {

// The type-erased description behind a Python mask object (any subclass of
// seqattn._core.Mask, composed with &, |, ~ or not). Throws
// seqattn::invalid_argument ("<what>: expected a seqattn mask, got <type>")
// when `obj` is not one. The reference lives as long as the Python object.
const AnyMask& mask_from_python(nanobind::handle obj, const char* what = "mask");

// Wraps a C++ description as a Python mask object (seqattn._core.Mask),
// printed as `repr`.
nanobind::object mask_to_python(AnyMask mask, const std::string& repr = "Mask(<C++>)");

// The BlockMask behind a Python seqattn._core.BlockMask (Mask.block_mask(...)),
// shared with the Python object; throws like mask_from_python otherwise.
std::shared_ptr<const BlockMask> block_mask_from_python(nanobind::handle obj, const char* what = "block_mask");
nanobind::object block_mask_to_python(std::shared_ptr<const BlockMask> block_mask);

}  // namespace seqattn::python

// The names the binding files use unqualified.
using seqattn::python::block_mask_from_python;
using seqattn::python::block_mask_to_python;
using seqattn::python::mask_from_python;
using seqattn::python::mask_to_python;

// Optional parts of the module, defined in their own files when present.
void bind_splash(nanobind::module_& m);
void bind_flex(nanobind::module_& m);
