// seqattn._cpu: which CPU features seqattn._core needs and this CPU lacks.
//
// _core is compiled for x86-64-v3 (AVX2, FMA, BMI2, ...), beside kernels for
// AVX-512 chosen at run time, so on an older CPU merely loading it could
// execute an illegal instruction. This module is compiled for the baseline
// ISA, with the plain C API (no nanobind: nothing of it may need more), and
// seqattn/__init__.py asks it first, to raise an ImportError that names what
// is missing.
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

namespace {

PyObject* missing_features(PyObject*, PyObject*) {
  PyObject* missing = PyList_New(0);
  if (missing == nullptr) return nullptr;
#if defined(SEQATTN_CPU_CHECK_X86_64_V3) && (defined(__x86_64__) || defined(__i386__))
  unsigned a = 0, b = 0, c = 0, d = 0;
  const unsigned max_leaf = __get_cpuid_max(0, nullptr);
  unsigned ecx1 = 0, ebx7 = 0, ecx_ext = 0;
  if (max_leaf >= 1) {
    __cpuid(1, a, b, c, d);
    ecx1 = c;
  }
  if (max_leaf >= 7) {
    __cpuid_count(7, 0, a, b, c, d);
    ebx7 = b;
  }
  if (__get_cpuid_max(0x80000000u, nullptr) >= 0x80000001u) {
    __cpuid(0x80000001u, a, b, c, d);
    ecx_ext = c;
  }
  // The OS must save the AVX registers (XCR0 bits 1 and 2) for AVX to be usable.
  bool os_avx = false;
  if ((ecx1 >> 27) & 1u) {  // OSXSAVE
    unsigned lo = 0, hi = 0;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    os_avx = (lo & 6u) == 6u;
  }
  struct Feature {
    const char* name;
    bool present;
  };
  const Feature features[] = {
      {"SSE3", ((ecx1 >> 0) & 1u) != 0},         {"SSSE3", ((ecx1 >> 9) & 1u) != 0},
      {"SSE4.1", ((ecx1 >> 19) & 1u) != 0},      {"SSE4.2", ((ecx1 >> 20) & 1u) != 0},
      {"POPCNT", ((ecx1 >> 23) & 1u) != 0},      {"CMPXCHG16B", ((ecx1 >> 13) & 1u) != 0},
      {"MOVBE", ((ecx1 >> 22) & 1u) != 0},       {"AVX", ((ecx1 >> 28) & 1u) != 0 && os_avx},
      {"FMA", ((ecx1 >> 12) & 1u) != 0},         {"F16C", ((ecx1 >> 29) & 1u) != 0},
      {"AVX2", ((ebx7 >> 5) & 1u) != 0},         {"BMI1", ((ebx7 >> 3) & 1u) != 0},
      {"BMI2", ((ebx7 >> 8) & 1u) != 0},         {"LZCNT", ((ecx_ext >> 5) & 1u) != 0},
      {"LAHF-SAHF", ((ecx_ext >> 0) & 1u) != 0},
  };
  for (const Feature& f : features) {
    if (f.present) continue;
    PyObject* name = PyUnicode_FromString(f.name);
    if (name == nullptr || PyList_Append(missing, name) != 0) {
      Py_XDECREF(name);
      Py_DECREF(missing);
      return nullptr;
    }
    Py_DECREF(name);
  }
#endif
  return missing;
}

PyMethodDef methods[] = {
    {"missing_features", missing_features, METH_NOARGS,
     "The CPU features seqattn._core was compiled to require that this CPU lacks (empty: it can load)."},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef module = {PyModuleDef_HEAD_INIT,
                      "_cpu",
                      "seqattn's CPU check, run before seqattn._core is loaded.",
                      -1,
                      methods,
                      nullptr,
                      nullptr,
                      nullptr,
                      nullptr};

}  // namespace

PyMODINIT_FUNC PyInit__cpu() { return PyModule_Create(&module); }
