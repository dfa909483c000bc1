// seqattn._cuda: backends::Cuda for the Python package, a module of its own so
// that seqattn._core (the CPU wheel) never needs the CUDA libraries. Built when
// nvcc is found (python/CMakeLists.txt, option SEQATTN_PYTHON_CUDA); links the
// CUDA runtime statically. Masks stay in seqattn._core, which builds the
// BlockMask of a call through its CoreApi (core_api.hpp).
//
// Tensors arrive as (data pointer, shape, strides in elements), BSHD, on the
// device: seqattn.torch passes its CUDA tensors' pointers and strides (no
// copy, no DLPack stream handshake), and the XLA handlers (jax_ffi_cuda.cpp)
// their device buffers. Every call runs on the stream it is given.
#include "module.hpp"

#include <cstdint>
#include <memory>
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "seqattn/core/error.hpp"

#include "../core_api.hpp"
#include "engine.hpp"

namespace nb = nanobind;

namespace seqattn::python::cuda_module {

namespace {

const CoreApi* g_core = nullptr;

// (data pointer, shape, strides) of one tensor.
using PyTensor = std::tuple<std::uintptr_t, std::vector<std::int64_t>, std::vector<std::int64_t>>;

Extents extents(const std::vector<std::int64_t>& dims, const char* who, const char* name) {
  detail::require(dims.size() <= static_cast<std::size_t>(kMaxRank), who, ": ", name, " has ", dims.size(),
                  " dims, at most ", kMaxRank, " are supported");
  Extents e;
  for (std::int64_t d : dims) e.push_back(static_cast<index_t>(d));
  return e;
}

template <class T>
TensorView<T> view(const PyTensor& t, const char* who, const char* name) {
  const auto& [ptr, shape, strides] = t;
  detail::require(shape.size() == strides.size(), who, ": ", name, " has ", shape.size(), " extents but ",
                  strides.size(), " strides");
  return TensorView<T>(reinterpret_cast<T*>(ptr), extents(shape, who, name), extents(strides, who, name));
}

// A view of `shape` with no data behind it: shape_of reads shapes only.
TensorView<const float> shape_probe(const Extents& shape) {
  static const float probe = 0.0f;
  Strides zero;
  for (int d = 0; d < shape.rank(); ++d) zero.push_back(0);
  return TensorView<const float>(&probe, shape, zero);
}

cuda_engine::RunOptions run_options(float scale, float softcap, const std::optional<std::vector<float>>& sinks) {
  cuda_engine::RunOptions o;
  o.scale = scale;
  o.softcap = softcap;
  if (sinks) o.sinks = std::span<const float>(sinks->data(), sinks->size());
  return o;
}

struct PyPlan {
  std::shared_ptr<const cuda_engine::Plan> plan;
};

std::string plan_repr(const PyPlan& p) {
  const bool backward = cuda_engine::plan_backward(*p.plan);
  return detail::concat("seqattn.CudaPlan(", cuda_engine::plan_shape(*p.plan),
                        backward ? ", forward and backward" : ", forward", ", device ",
                        cuda_engine::plan_device(*p.plan), ")");
}

// q, k, v shapes (BSHD) -> the call shape; the checks planning does on the
// host. No CUDA call.
AttentionShape checked_shape(const std::vector<std::int64_t>& q, const std::vector<std::int64_t>& k,
                             const std::vector<std::int64_t>& v, bool backward) {
  constexpr const char* kWho = "seqattn._cuda.plan";
  detail::require(q.size() == 4 && k.size() == 4 && v.size() == 4, kWho,
                  ": q, k, v must be BSHD [B, S, H, D] (the CUDA module takes no THD), got ranks ", q.size(), ", ",
                  k.size(), ", ", v.size());
  const AttentionShape shape =
      shape_of(AttentionInputs<float>{shape_probe(extents(q, kWho, "q")), shape_probe(extents(k, kWho, "k")),
                                      shape_probe(extents(v, kWho, "v")), nullptr});
  cuda_engine::check_plan_request(shape, backward);
  return shape;
}

PyPlan make_plan(const std::vector<std::int64_t>& q, const std::vector<std::int64_t>& k,
                 const std::vector<std::int64_t>& v, nb::handle mask, bool backward, int device) {
  const AttentionShape shape = checked_shape(q, k, v, backward);
  const BlockShape block = cuda_engine::block_shape();
  std::shared_ptr<const BlockMask> bm = core_block_mask(mask.ptr(), shape, block);
  detail::require(device >= 0, "seqattn._cuda.plan: device must be a CUDA device index >= 0, got ", device);
  nb::gil_scoped_release release;
  return {cuda_engine::make_plan(shape, std::move(bm), backward, device)};
}

// The checks of a call that need no device: the shape, the mask against it
// (the BlockMask is built and dropped). seqattn.torch runs them before it
// allocates anything on the device.
void check_plan(const std::vector<std::int64_t>& q, const std::vector<std::int64_t>& k,
                const std::vector<std::int64_t>& v, nb::handle mask, bool backward) {
  const AttentionShape shape = checked_shape(q, k, v, backward);
  (void)core_block_mask(mask.ptr(), shape, cuda_engine::block_shape());
}

template <class T>
void forward_py(const PyPlan& plan, const PyTensor& q, const PyTensor& k, const PyTensor& v, const PyTensor& out,
                const PyTensor& lse, float scale, float softcap, const std::optional<std::vector<float>>& sinks,
                std::uintptr_t stream) {
  constexpr const char* kWho = "seqattn._cuda.forward";
  const AttentionInputs<T> in{view<const T>(q, kWho, "q"), view<const T>(k, kWho, "k"), view<const T>(v, kWho, "v"),
                              nullptr};
  const auto outv = view<T>(out, kWho, "out");
  const auto lsev = view<float>(lse, kWho, "lse");
  const cuda_engine::RunOptions options = run_options(scale, softcap, sinks);
  nb::gil_scoped_release release;
  cuda_engine::forward<T>(*plan.plan, options, in, outv, lsev, reinterpret_cast<void*>(stream));
}

template <class T>
void backward_py(const PyPlan& plan, const PyTensor& q, const PyTensor& k, const PyTensor& v, const PyTensor& out,
                 const PyTensor& lse, const PyTensor& dout, const PyTensor& dq, const PyTensor& dk, const PyTensor& dv,
                 float scale, float softcap, const std::optional<std::vector<float>>& sinks, std::uintptr_t stream) {
  constexpr const char* kWho = "seqattn._cuda.backward";
  detail::require(cuda_engine::plan_backward(*plan.plan),
                  "attention_backward: the plan was made for the forward pass only (backward=False)");
  const AttentionInputs<T> in{view<const T>(q, kWho, "q"), view<const T>(k, kWho, "k"), view<const T>(v, kWho, "v"),
                              nullptr};
  const cuda_engine::RunOptions options = run_options(scale, softcap, sinks);
  const auto outv = view<const T>(out, kWho, "out"), doutv = view<const T>(dout, kWho, "dout");
  const auto lsev = view<const float>(lse, kWho, "lse");
  const auto dqv = view<T>(dq, kWho, "dq"), dkv = view<T>(dk, kWho, "dk"), dvv = view<T>(dv, kWho, "dv");
  nb::gil_scoped_release release;
  cuda_engine::backward<T>(*plan.plan, options, in, outv, lsev, doutv, dqv, dkv, dvv, reinterpret_cast<void*>(stream));
}

// name(dtype, plan, ...): the bfloat16 or float16 function (the dtype is
// checked first, then the plan's type).
template <class... Args>
void def_typed(nb::module_& m, const char* name, void (*bf16)(const PyPlan&, Args...),
               void (*f16)(const PyPlan&, Args...)) {
  m.def(name, [name, bf16, f16](const std::string& dtype, nb::handle plan, Args... args) {
    const bool is_bf16 = dtype == "bfloat16";
    if (!is_bf16 && dtype != "float16") {
      detail::throw_invalid(name, ": dtype must be 'bfloat16' or 'float16' (backends::Cuda's storage), got '", dtype,
                            "'");
    }
    PyPlan* p = nullptr;
    if (!nb::try_cast<PyPlan*>(plan, p) || p == nullptr) {
      detail::throw_invalid(name, ": plan must be a seqattn._cuda._Plan, got ", nb::type_name(plan.type()).c_str());
    }
    return is_bf16 ? bf16(*p, args...) : f16(*p, args...);
  });
}

}  // namespace

std::shared_ptr<const BlockMask> core_block_mask(PyObject* mask, const AttentionShape& shape, BlockShape block) {
  CoreError error;
  auto bm = g_core->block_mask(mask, shape, block, true, error);
  if (!bm) rethrow(error);
  return bm;
}

std::shared_ptr<const BlockMask> core_ffi_block_mask(std::int64_t mask_id, const CoreFfiIds& ids,
                                                     const AttentionShape& shape) {
  CoreError error;
  auto bm = g_core->ffi_block_mask(mask_id, ids, shape, cuda_engine::block_shape(), true, error);
  if (!bm) rethrow(error);
  return bm;
}

[[noreturn]] void rethrow(const CoreError& error) {
  switch (error.kind) {
    case 1:
      detail::throw_invalid(error.message);
    case 2:
      throw out_of_memory(error.message, 0);
    default:
      throw std::runtime_error(error.message);
  }
}

}  // namespace seqattn::python::cuda_module

NB_MODULE(_cuda, m) {
  using namespace seqattn::python;
  using namespace seqattn::python::cuda_module;
  m.doc() = "seqattn's CUDA backend (backends::Cuda) for seqattn.torch and seqattn.jax";
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const std::invalid_argument& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const seqattn::out_of_memory& e) {
      PyErr_SetString(PyExc_MemoryError, e.what());
    }
  });
  // The masks live in seqattn._core: its CoreApi, checked once here.
  nb::object capsule = nb::module_::import_("seqattn._core").attr("_core_api");
  auto* api = static_cast<const CoreApi*>(PyCapsule_GetPointer(capsule.ptr(), kCoreApiCapsule));
  if (api == nullptr) throw nb::python_error();
  if (api->version != kCoreApiVersion) {
    throw nb::import_error(seqattn::detail::concat("seqattn._cuda was built for seqattn._core's CoreApi version ",
                                                   kCoreApiVersion, " but seqattn._core offers version ", api->version,
                                                   ": reinstall seqattn")
                               .c_str());
  }
  g_core = api;

  m.attr("runtime_version") = cuda_engine::runtime_version();
  m.attr("block_shape") = nb::make_tuple(cuda_engine::block_shape().q, cuda_engine::block_shape().kv);
  m.def(
      "device_count",
      [] {
        std::string why;
        const int n = cuda_engine::device_count(&why);
        return std::make_pair(n, why);
      },
      "(number of CUDA devices, why there are none: '' when there are); no exception without a driver or device.");
  nb::class_<PyPlan>(m, "_Plan", "A plan of backends::Cuda for one call shape, on one device")
      .def_prop_ro("backward", [](const PyPlan& p) { return cuda_engine::plan_backward(*p.plan); })
      .def_prop_ro("device", [](const PyPlan& p) { return cuda_engine::plan_device(*p.plan); })
      .def("__repr__", &plan_repr);
  m.def("_plan", &make_plan, nb::arg("q_shape"), nb::arg("k_shape"), nb::arg("v_shape"), nb::arg("mask").none(),
        nb::arg("backward"), nb::arg("device"),
        "Plans BSHD shapes under a seqattn mask (None: full) on CUDA device `device` (uploads the mask).");
  m.def("_check_plan", &check_plan, nb::arg("q_shape"), nb::arg("k_shape"), nb::arg("v_shape"), nb::arg("mask").none(),
        nb::arg("backward") = false, "What _plan checks before it touches the GPU; raises ValueError.");
  def_typed(m, "_forward", &forward_py<seqattn::bfloat16>, &forward_py<seqattn::float16>);
  def_typed(m, "_backward", &backward_py<seqattn::bfloat16>, &backward_py<seqattn::float16>);
  bind_cuda_jax_ffi(m);
}
