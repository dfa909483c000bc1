// NB_MODULE of seqattn._core: the pieces in the order they depend on each other.
#include <nanobind/nanobind.h>
#include <stdexcept>

#include "seqattn/core/simd.hpp"
#include "seqattn/version.hpp"

#include "bindings.hpp"
#include "internal.hpp"

namespace nb = nanobind;

NB_MODULE(_core, m) {
  m.doc() = "seqattn C++ core: descriptors, masks and the CPU attention engine";
  // nanobind already maps std::invalid_argument to ValueError; registering
  // seqattn's own type first keeps that true whatever nanobind's defaults.
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const std::invalid_argument& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    }
  });
  m.attr("simd_target") = seqattn::static_simd_target();
  seqattn::python::bind_descriptors(m);
  seqattn::python::bind_masks(m);
  seqattn::python::bind_attention(m);
  seqattn::python::bind_jax_ffi(m);
#ifdef SEQATTN_PY_HAVE_SPLASH
  bind_splash(m);
#endif
#ifdef SEQATTN_PY_HAVE_FLEX
  bind_flex(m);
#endif
}
