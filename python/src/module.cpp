// NB_MODULE of seqattn._core: the pieces in the order they depend on each other.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>
#include <stdexcept>
#include <string>

#include "seqattn/core/checked.hpp"
#include "seqattn/core/error.hpp"
#include "seqattn/dispatch.hpp"
#include "seqattn/version.hpp"

#include "bindings.hpp"
#include "internal.hpp"

namespace nb = nanobind;

NB_MODULE(_core, m) {
  m.doc() = "seqattn C++ core: descriptors, masks and the CPU attention engine";
  // nanobind already maps std::invalid_argument to ValueError and
  // std::bad_alloc to MemoryError with what(); registering seqattn's own
  // types keeps that true whatever nanobind's defaults, so out_of_memory's
  // message (the request in bytes) always reaches Python.
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const std::invalid_argument& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const seqattn::out_of_memory& e) {
      PyErr_SetString(PyExc_MemoryError, e.what());
    }
  });
  // The kernels' target, chosen for this CPU (src/dispatch.cc), and whether
  // bf16 prefill may use AVX512_BF16's pair dot there.
  m.attr("simd_target") = seqattn::dispatch::best_simd_target();
  m.attr("bf16_dot_instruction") = seqattn::dispatch::bf16_dot_instruction();
  // Tests run every target's kernels in one process (src/dispatch.cc).
  m.def("_available_simd_targets", &seqattn::dispatch::available_simd_targets,
        "The SIMD targets compiled into the module that this CPU runs, best first.");
  m.def(
      "_use_simd_target_for_test",
      [](const std::string& name) {
        seqattn::dispatch::use_simd_target_for_test(name);
        return std::string(seqattn::dispatch::best_simd_target());
      },
      nb::arg("name"),
      "Tests only: run the kernels of target `name` from now on ('' restores the CPU's choice); "
      "returns the target now chosen.");
  m.attr("MAX_THREADS") = seqattn::limits::kMaxThreads;
  seqattn::python::bind_descriptors(m);
  seqattn::python::bind_masks(m);
  seqattn::python::bind_attention(m);
  seqattn::python::bind_jax_ffi(m);
  seqattn::python::bind_core_api(m);
#ifdef SEQATTN_PY_HAVE_SPLASH
  bind_splash(m);
#endif
#ifdef SEQATTN_PY_HAVE_FLEX
  bind_flex(m);
#endif
}
