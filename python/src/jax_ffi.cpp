// XLA FFI handlers: seqattn's CPU engine as JAX custom calls (seqattn.jax).
//
// Masks cannot travel as FFI attributes (only scalars and strings do), so a
// Python mask is registered once (register_ffi_mask) and the call carries its
// index as the static attribute `mask_id`. Segment ids and positions are
// operands (traced arrays); a zero-size operand means "not given". Plans are
// cached per (mask, shape, pass, threads), and a call's segment ids refine
// the static plan as its operand (plans of document masks over ids, cached
// per ids, only where the mask knows where a sequence starts), so a jitted
// step plans each distinct call once (call_plan).
//
// Layout: BSHD with any number of leading dims folded into the batch, which
// is what vmap with vmap_method="broadcast_all" hands over: q [..., S, H, D],
// ids [..., S], lse [..., H, S].
#include <array>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <nanobind/nanobind.h>
#include <string>
#include <vector>

#include "bindings.hpp"
#include "core_api.hpp"
#include "ffi_common.hpp"
#include "internal.hpp"

#ifdef SEQATTN_PY_HAVE_XLA_FFI
#include "seqattn/core/bfloat16.hpp"
#include "seqattn/masks/document.hpp"

#include "xla/ffi/api/ffi.h"

// Set by python/CMakeLists.txt from the jaxlib whose headers are used.
#ifndef SEQATTN_PY_XLA_FFI_JAXLIB_VERSION
#define SEQATTN_PY_XLA_FFI_JAXLIB_VERSION "unknown"
#endif
#endif

namespace seqattn::python {

#ifdef SEQATTN_PY_HAVE_XLA_FFI
namespace ffi = xla::ffi;
using ffi_buffers::by_storage_type;
using ffi_buffers::dims_of;
using ffi_buffers::fold_leading;
using ffi_buffers::input;
using ffi_buffers::output;

namespace {

// Registered masks live for the process: a compiled computation may run long
// after the Python object that named its mask is gone.
std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}
std::vector<AnyMask>& registry() {
  static auto* masks = new std::vector<AnyMask>();
  return *masks;
}

AnyMask registered_mask(std::int64_t id) {
  std::lock_guard lock(registry_mutex());
  detail::require(id >= 0 && id < static_cast<std::int64_t>(registry().size()), "seqattn.jax: mask id ", id,
                  " was never registered");
  return registry()[static_cast<std::size_t>(id)];
}

TensorView<const std::int32_t> ids_view(ffi::Buffer<ffi::S32> b, const char* name) {
  if (b.element_count() == 0) return {};
  return TensorView<const std::int32_t>(b.typed_data(), fold_leading(dims_of(b.dimensions()), 1, name));
}

// The segment-id operands of a call, by value (q ids, kv ids, q positions,
// kv positions back to back, and how many of each; 0: not given).
struct IdOperands {
  std::vector<std::int32_t> values;
  std::array<std::int64_t, 4> sizes{};
  bool operator==(const IdOperands&) const = default;
};

IdOperands id_operands(std::initializer_list<ffi::Buffer<ffi::S32>> buffers) {
  IdOperands ids;
  std::size_t i = 0;
  for (const auto& b : buffers) {
    const auto n = static_cast<std::int64_t>(b.element_count());
    ids.sizes[i++] = n;
    ids.values.insert(ids.values.end(), b.typed_data(), b.typed_data() + n);
  }
  return ids;
}

// What a plan is made for: the registered mask, the shape, the pass, the
// threads and the segment ids (none for a static mask).
struct PlanKey {
  std::int64_t mask_id = 0;
  bool backward = false;
  int threads = 1;
  AttentionShape shape;
  IdOperands ids;
  bool operator==(const PlanKey&) const = default;
};

std::mutex& plan_cache_mutex() {
  static std::mutex m;
  return m;
}
PlanCacheStats& plan_cache_stats() {
  static PlanCacheStats s;
  return s;
}

// A jitted step calls each layer's attention with the same static mask and
// shape, and with the same segment ids in every layer and in the backward
// pass: each distinct key is planned once.
using EnginePlanCache = PlanCache<PlanKey, EnginePlan>;

// The plan of one call. Static masks: a few shapes at a time are kept (a
// model calls attention with a handful). With segment ids: the static plan
// with the ids as its operand where that is their document mask
// (plan_with_segment_ids), so new ids every step plan nothing; else the
// document mask over them, owning its layout, in a cache of its own so that
// new ids every step do not push the static plans out (a step needs two:
// forward and backward).
CallPlan call_plan(std::int64_t mask_id, const AttentionShape& shape, bool backward, int threads,
                   ffi::Buffer<ffi::S32> q_ids, ffi::Buffer<ffi::S32> kv_ids, ffi::Buffer<ffi::S32> q_pos,
                   ffi::Buffer<ffi::S32> kv_pos) {
  // Never destroyed, like the registry.
  static auto* static_plans = new EnginePlanCache(32, plan_cache_mutex(), plan_cache_stats());
  static auto* id_plans = new EnginePlanCache(4, plan_cache_mutex(), plan_cache_stats());
  const AnyMask& mask = registered_mask(mask_id);
  auto static_plan = static_plans->get(PlanKey{mask_id, backward, threads, shape, {}},
                                       [&] { return plan_engine(shape, mask, backward, threads); });
  const auto qi = ids_view(q_ids, "q_segment_ids");
  if (qi.rank() == 0) return {std::move(static_plan), nullptr};
  const auto ki = kv_ids.element_count() == 0 ? qi : ids_view(kv_ids, "kv_segment_ids");
  const auto qp = ids_view(q_pos, "q_positions");
  const auto kp = kv_pos.element_count() == 0 ? qp : ids_view(kv_pos, "kv_positions");
  auto ids = std::make_shared<const SegmentIds>(SegmentIds::from_segment_ids(qi, ki, qp, kp));
  return plan_with_segment_ids(std::move(static_plan), mask, std::move(ids), [&](const AnyMask& document) {
    return id_plans->get(PlanKey{mask_id, backward, threads, shape, id_operands({q_ids, kv_ids, q_pos, kv_pos})},
                         [&] { return plan_engine(shape, document, backward, threads); });
  });
}

constexpr const char* kDtypeError = "seqattn.jax: q must be float32 or bfloat16";

RunOptions run_options(float scale, float softcap, std::int64_t threads) {
  RunOptions o;
  o.scale = scale;
  o.softcap = softcap;
  o.threads = resolve_threads(threads);
  return o;
}

template <class T>
void forward_typed(ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v, ffi::Buffer<ffi::S32> q_ids,
                   ffi::Buffer<ffi::S32> kv_ids, ffi::Buffer<ffi::S32> q_pos, ffi::Buffer<ffi::S32> kv_pos,
                   ffi::Result<ffi::AnyBuffer>& out, ffi::Result<ffi::Buffer<ffi::F32>>& lse, std::int64_t mask_id,
                   const RunOptions& options) {
  AttentionInputs<T> in{input<T>(q, 3, "q"), input<T>(k, 3, "k"), input<T>(v, 3, "v"), nullptr};
  const AttentionShape shape = shape_of(in);
  check_run_options(options, shape);
  const CallPlan call = call_plan(mask_id, shape, false, options.threads, q_ids, kv_ids, q_pos, kv_pos);
  in.segment_ids = call.ids.get();
  const auto lse_dims = fold_leading(dims_of(lse->dimensions()), 2, "lse");
  run_forward<T>(*call.plan, options, in, output<T>(out, 3, "out"), TensorView<float>(lse->typed_data(), lse_dims));
}

ffi::Error forward_impl(ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v, ffi::Buffer<ffi::S32> q_ids,
                        ffi::Buffer<ffi::S32> kv_ids, ffi::Buffer<ffi::S32> q_pos, ffi::Buffer<ffi::S32> kv_pos,
                        ffi::Result<ffi::AnyBuffer> out, ffi::Result<ffi::Buffer<ffi::F32>> lse, std::int64_t mask_id,
                        float scale, float softcap, std::int64_t threads) {
  const RunOptions options = run_options(scale, softcap, threads);
  return by_storage_type<float, bfloat16>(q.element_type(), kDtypeError, [&](auto t) {
    forward_typed<decltype(t)>(q, k, v, q_ids, kv_ids, q_pos, kv_pos, out, lse, mask_id, options);
  });
}

template <class T>
void backward_typed(ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v, ffi::AnyBuffer out, ffi::Buffer<ffi::F32> lse,
                    ffi::AnyBuffer dout, ffi::Buffer<ffi::S32> q_ids, ffi::Buffer<ffi::S32> kv_ids,
                    ffi::Buffer<ffi::S32> q_pos, ffi::Buffer<ffi::S32> kv_pos, ffi::Result<ffi::AnyBuffer>& dq,
                    ffi::Result<ffi::AnyBuffer>& dk, ffi::Result<ffi::AnyBuffer>& dv, std::int64_t mask_id,
                    const RunOptions& options) {
  AttentionInputs<T> in{input<T>(q, 3, "q"), input<T>(k, 3, "k"), input<T>(v, 3, "v"), nullptr};
  const AttentionShape shape = shape_of(in);
  check_run_options(options, shape);
  const CallPlan call = call_plan(mask_id, shape, true, options.threads, q_ids, kv_ids, q_pos, kv_pos);
  in.segment_ids = call.ids.get();
  const auto lse_dims = fold_leading(dims_of(lse.dimensions()), 2, "lse");
  // Gradient rows no query sees are not all written by the engine's THD
  // path; BSHD writes every element, but zeroing first keeps that a detail.
  const auto zero = [](TensorView<T> t) { std::fill(t.data(), t.data() + t.size(), T{}); };
  const auto dqv = output<T>(dq, 3, "dq"), dkv = output<T>(dk, 3, "dk"), dvv = output<T>(dv, 3, "dv");
  zero(dqv);
  zero(dkv);
  zero(dvv);
  run_backward<T>(*call.plan, options, in, input<T>(out, 3, "out"), TensorView<const float>(lse.typed_data(), lse_dims),
                  input<T>(dout, 3, "dout"), dqv, dkv, dvv);
}

ffi::Error backward_impl(ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v, ffi::AnyBuffer out,
                         ffi::Buffer<ffi::F32> lse, ffi::AnyBuffer dout, ffi::Buffer<ffi::S32> q_ids,
                         ffi::Buffer<ffi::S32> kv_ids, ffi::Buffer<ffi::S32> q_pos, ffi::Buffer<ffi::S32> kv_pos,
                         ffi::Result<ffi::AnyBuffer> dq, ffi::Result<ffi::AnyBuffer> dk, ffi::Result<ffi::AnyBuffer> dv,
                         std::int64_t mask_id, float scale, float softcap, std::int64_t threads) {
  const RunOptions options = run_options(scale, softcap, threads);
  return by_storage_type<float, bfloat16>(q.element_type(), kDtypeError, [&](auto t) {
    backward_typed<decltype(t)>(q, k, v, out, lse, dout, q_ids, kv_ids, q_pos, kv_pos, dq, dk, dv, mask_id, options);
  });
}

}  // namespace

AnyMask ffi_call_mask(std::int64_t mask_id, const CoreFfiIds& ids) {
  if (ids.q_ids.rank() == 0) return registered_mask(mask_id);
  const auto ki = ids.kv_ids.rank() == 0 ? ids.q_ids : ids.kv_ids;
  const auto kp = ids.kv_pos.rank() == 0 ? ids.q_pos : ids.kv_pos;
  auto layout = std::make_shared<const DocumentLayout>(DocumentLayout::from_segment_ids(ids.q_ids, ki, ids.q_pos, kp));
  return AnyMask(document_mask(*layout, registered_mask(mask_id)), layout);
}

XLA_FFI_DEFINE_HANDLER(kAttentionForward, forward_impl, ffi_signatures::forward(ffi::Ffi::Bind()));
XLA_FFI_DEFINE_HANDLER(kAttentionBackward, backward_impl, ffi_signatures::backward(ffi::Ffi::Bind()));

void bind_jax_ffi(nb::module_& m) {
  m.attr("has_xla_ffi") = true;
  // seqattn.jax refuses a jax whose XLA runtime implements an older FFI API
  // than the headers these handlers were compiled against.
  m.attr("xla_ffi_api_version") = nb::make_tuple(XLA_FFI_API_MAJOR, XLA_FFI_API_MINOR);
  m.attr("xla_ffi_jaxlib_version") = SEQATTN_PY_XLA_FFI_JAXLIB_VERSION;
  m.def("ffi_handlers", [] {
    nb::dict d;
    d["seqattn_attention_forward"] = nb::capsule(reinterpret_cast<void*>(kAttentionForward));
    d["seqattn_attention_backward"] = nb::capsule(reinterpret_cast<void*>(kAttentionBackward));
    return d;
  });
  m.def(
      "_ffi_plan_cache_stats",
      [] {
        std::lock_guard lock(plan_cache_mutex());
        return nb::make_tuple(plan_cache_stats().plans, plan_cache_stats().hits);
      },
      "(plans made, calls served from the cache) by the XLA FFI handlers' plan cache.");
  m.def(
      "register_ffi_mask",
      [](nb::handle mask) {
        const AnyMask& any = mask_from_python(mask, "seqattn.jax mask");
        std::lock_guard lock(registry_mutex());
        registry().push_back(any);
        return static_cast<std::int64_t>(registry().size() - 1);
      },
      nb::arg("mask"), "Keeps the mask for the life of the process; returns the id the FFI calls carry.");
}

#else

AnyMask ffi_call_mask(std::int64_t, const CoreFfiIds&) {
  detail::throw_invalid("seqattn.jax: this build of seqattn has no XLA FFI handlers (no mask was registered)");
}

void bind_jax_ffi(nb::module_& m) {
  m.attr("has_xla_ffi") = false;
  m.attr("xla_ffi_api_version") = nb::none();
  m.attr("xla_ffi_jaxlib_version") = nb::none();
}

#endif

}  // namespace seqattn::python
