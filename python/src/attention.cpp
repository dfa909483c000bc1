// Attention on the CPU engine (backends::Dispatched: the Highway kernels of the
// best target this CPU has, src/dispatch.cc) for NumPy / DLPack arrays:
// plans (seqattn.plan: the BlockMask and the work partition of one call
// shape, made once and run any number of times), forward (out, LSE) and
// backward. The engine half (plan_engine, run_forward, run_backward) is
// shared with the XLA FFI handlers (jax_ffi.cpp).
#include "seqattn/attention.hpp"

#include <map>
#include <memory>
#include <mutex>
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "seqattn/attention/segment_ids.hpp"
#include "seqattn/dispatch.hpp"
#include "seqattn/masks/document.hpp"

#include "bindings.hpp"
#include "internal.hpp"

namespace seqattn::python {

int resolve_threads(std::int64_t threads) {
  detail::require(threads >= 0, "attention: threads must be >= 0 (0 = all hardware threads), got ", threads);
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  detail::require(threads <= limits::kMaxThreads, "attention: threads must be at most ", limits::kMaxThreads,
                  " (limits::kMaxThreads), got ", threads);
  return static_cast<int>(threads);
}

std::shared_ptr<const EnginePlan> plan_engine(const AttentionShape& shape, const AnyMask& mask, bool backward,
                                              int threads) {
  PlanOptions options;
  options.backward = backward;
  return std::make_shared<const EnginePlan>(plan_attention<backends::Dispatched>(shape, mask, options, threads));
}

CallPlan plan_with_segment_ids(std::shared_ptr<const EnginePlan> static_plan, const AnyMask& mask,
                               std::shared_ptr<const SegmentIds> ids, const PlanDocument& plan_document) {
  const AttentionShape& shape = static_plan->shape();
  ids->require_fits(shape, "attention");
  if (ids->same_as_document_mask(mask, shape)) return {std::move(static_plan), std::move(ids)};
  return {plan_document(AnyMask(document_mask(ids->layout(), mask), ids->shared_layout())), nullptr};
}

namespace {

variants::Standard variant_of(const RunOptions& o) { return {o.scale, {o.softcap}, {o.sinks}}; }

// One pool per thread count, kept for the life of the process: starting
// threads per call would cost more than small attention calls. Deliberately
// never destroyed, so no join runs during interpreter shutdown.
execution::ThreadPool& pool_for(int threads) {
  static std::mutex mutex;
  static auto* pools = new std::map<int, std::unique_ptr<execution::ThreadPool>>();
  std::lock_guard lock(mutex);
  auto& p = (*pools)[threads];
  if (!p) p = std::make_unique<execution::ThreadPool>(threads);
  return *p;
}

template <class Fn>
void with_executor(int threads, Fn&& fn) {
  if (threads == 1) {
    execution::Serial serial;
    fn(serial);
  } else {
    fn(pool_for(threads));
  }
}

}  // namespace

void check_run_options(const RunOptions& options, const AttentionShape& shape) {
  detail::check_variant(variant_of(options), shape);
}

template <class T>
void run_forward(const EnginePlan& plan, const RunOptions& options, const AttentionInputs<T>& in, TensorView<T> out,
                 TensorView<float> lse) {
  with_executor(options.threads, [&](auto& exec) { attention_forward(plan, in, out, lse, variant_of(options), exec); });
}

template <class T>
void run_backward(const EnginePlan& plan, const RunOptions& options, const AttentionInputs<T>& in,
                  TensorView<const T> out, TensorView<const float> lse, TensorView<const T> dout, TensorView<T> dq,
                  TensorView<T> dk, TensorView<T> dv) {
  with_executor(options.threads, [&](auto& exec) {
    attention_backward(plan, in, out, lse, dout, AttentionGrads<T>{dq, dk, dv}, variant_of(options), exec);
  });
}

template void run_forward<float>(const EnginePlan&, const RunOptions&, const AttentionInputs<float>&, TensorView<float>,
                                 TensorView<float>);
template void run_forward<bfloat16>(const EnginePlan&, const RunOptions&, const AttentionInputs<bfloat16>&,
                                    TensorView<bfloat16>, TensorView<float>);
template void run_backward<float>(const EnginePlan&, const RunOptions&, const AttentionInputs<float>&,
                                  TensorView<const float>, TensorView<const float>, TensorView<const float>,
                                  TensorView<float>, TensorView<float>, TensorView<float>);
template void run_backward<bfloat16>(const EnginePlan&, const RunOptions&, const AttentionInputs<bfloat16>&,
                                     TensorView<const bfloat16>, TensorView<const float>, TensorView<const bfloat16>,
                                     TensorView<bfloat16>, TensorView<bfloat16>, TensorView<bfloat16>);

namespace {

using SegmentArray = nb::ndarray<const std::int32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

// seqattn._core._Segments: a THD segment table, from its four columns
// (cu_seqlens, PackedSegments) or parsed from segment ids.
struct Segments {
  OwnedSegmentTable table;
};

Segments segments_from_columns(const SegmentArray& q_offsets, const SegmentArray& q_lens,
                               const SegmentArray& kv_offsets, const SegmentArray& kv_lens) {
  auto vec = [](const SegmentArray& a) { return std::vector<std::int32_t>(a.data(), a.data() + a.shape(0)); };
  return {{vec(q_offsets), vec(q_lens), vec(kv_offsets), vec(kv_lens)}};
}

// THD segment ids, [T] or [rows, S] (rows packed back to back): parsed by
// the one segment-run parser (core/segment_runs.hpp, through DocumentLayout),
// so its rules and messages hold here as for BSHD ids.
Segments segments_from_ids(const CpuArray<std::int32_t>& q_ids, const std::optional<CpuArray<std::int32_t>>& kv_ids,
                           std::int64_t q_tokens, std::int64_t kv_tokens) {
  const auto rows = [](TensorView<const std::int32_t> ids, std::int64_t tokens, const char* name) {
    detail::require((ids.rank() == 1 || ids.rank() == 2) && ids.size() == tokens, "attention: THD ", name,
                    " must have one id per token, as [T] or [rows, S] with rows * S = T = ", tokens, ", got shape ",
                    ids.shape());
    return ids.rank() == 2 ? ids : ids.reshape(Extents{1, ids.extent(0)});
  };
  const auto q = rows(view_of(q_ids, "segment_ids"), q_tokens, "segment_ids");
  const auto kv = kv_ids ? rows(view_of(*kv_ids, "kv_segment_ids"), kv_tokens, "kv_segment_ids") : q;
  detail::require(q.extent(0) == kv.extent(0),
                  "attention: THD segment_ids and kv_segment_ids must have as many rows, "
                  "got shapes ",
                  q.shape(), " and ", kv.shape());
  nb::gil_scoped_release release;
  return {DocumentLayout::from_segment_ids(q, kv, {}, {}).segment_table("attention")};
}

// seqattn._core._Plan: the engine's plan for one call shape, with the THD
// segment table it was made for (BSHD: none) and the mask it was made for
// (BSHD segment ids of a call refine it: plan_with_segment_ids). Its
// BlockMask keeps the mask, and what the mask owns, alive.
struct PyPlan {
  std::shared_ptr<const EnginePlan> plan;
  AnyMask mask;
  std::optional<Segments> segments;
  int threads = 1;

  bool thd() const { return segments.has_value(); }
  bool backward() const { return plan->options().backward; }
};

Extents extents_of(const std::vector<std::int64_t>& dims) {
  Extents e;
  detail::require(dims.size() <= static_cast<std::size_t>(kMaxRank), "attention: at most ", kMaxRank,
                  " dims are supported, got ", dims.size());
  for (std::int64_t d : dims) e.push_back(static_cast<index_t>(d));
  return e;
}

// A view of `shape` with no data behind it: shape_of reads shapes only.
TensorView<const float> shape_probe(const Extents& shape) {
  static const float probe = 0.0f;  // non-null says "has data"
  Strides zero;
  for (int d = 0; d < shape.rank(); ++d) zero.push_back(0);
  return TensorView<const float>(&probe, shape, zero);
}

PyPlan make_plan(const std::vector<std::int64_t>& q, const std::vector<std::int64_t>& k,
                 const std::vector<std::int64_t>& v, nb::handle mask, std::optional<Segments> segments, bool backward,
                 std::int64_t threads) {
  PyPlan p;
  p.segments = std::move(segments);
  const SegmentTable table = p.segments ? p.segments->table.view() : SegmentTable{};
  const AttentionShape shape = shape_of(AttentionInputs<float>{shape_probe(extents_of(q)), shape_probe(extents_of(k)),
                                                               shape_probe(extents_of(v)), p.thd() ? &table : nullptr});
  p.threads = resolve_threads(threads);
  p.mask = mask.is_none() ? AnyMask() : mask_from_python(mask);
  nb::gil_scoped_release release;
  p.plan = plan_engine(shape, p.mask, backward, p.threads);
  return p;
}

std::string plan_repr(const PyPlan& p) {
  return detail::concat("seqattn.Plan(", p.plan->shape(), p.backward() ? ", forward and backward" : ", forward", ", ",
                        p.threads, p.threads == 1 ? " thread)" : " threads)");
}

RunOptions run_options(const PyPlan& plan, float scale, float softcap, const std::optional<CpuArray<float>>& sinks,
                       std::optional<std::int64_t> threads) {
  RunOptions o;
  o.scale = scale;
  o.softcap = softcap;
  if (sinks) {
    const TensorView<const float> s = view_of(*sinks, "sinks");
    detail::require(s.rank() == 1 && (s.is_contiguous() || s.size() <= 1),
                    "attention: sinks must be a contiguous 1-D array of one logit per query head, got shape ",
                    s.shape());
    o.sinks = std::span<const float>(s.data(), static_cast<std::size_t>(s.size()));
  }
  o.threads = threads ? resolve_threads(*threads) : plan.threads;
  return o;
}

// Python storage type -> engine storage type: bf16 arrives as uint16 bits.
template <class Py>
using Engine = std::conditional_t<std::is_same_v<Py, std::uint16_t>, bfloat16, Py>;

template <class Py>
TensorView<const Engine<Py>> engine_view(const CpuArray<Py>& a, const char* name) {
  const TensorView<const Py> v = view_of(a, name);
  return TensorView<const Engine<Py>>(reinterpret_cast<const Engine<Py>*>(v.data()), v.shape(), v.strides());
}

template <class T>
Extents out_extents(TensorView<const T> q, TensorView<const T> v) {
  Extents e = q.shape();
  e[e.rank() - 1] = v.extent(-1);
  return e;
}

template <class T>
Extents lse_extents(TensorView<const T> q, bool thd) {
  return thd ? Extents{q.extent(1), q.extent(0)} : Extents{q.extent(0), q.extent(2), q.extent(1)};
}

// A BSHD call's segment ids ([B, S] int32, the key side and positions
// optional), as seqattn.attention passes them.
struct IdArrays {
  std::optional<CpuArray<std::int32_t>> segment_ids, kv_segment_ids, positions, kv_positions;
  bool given() const { return segment_ids.has_value(); }
};

// The inputs of a planned call, checked against the plan (the layout, then
// the shape it was made for) before anything is allocated, and the plan that
// runs it: the plan itself, with the call's segment ids as its operand where
// that is their document mask, else a plan of that document mask made now.
template <class T>
struct PlannedCall {
  AttentionInputs<T> in;
  CallPlan run;
};

template <class T>
PlannedCall<T> planned_call(const PyPlan& plan, const SegmentTable& table, TensorView<const T> q, TensorView<const T> k,
                            TensorView<const T> v, const IdArrays& ids, const char* who) {
  const int rank = plan.thd() ? 3 : 4;
  detail::require(q.rank() == rank, who, ": the plan was made for the ", plan.thd() ? "THD" : "BSHD",
                  " layout (q of rank ", rank, "), got q of shape ", q.shape());
  PlannedCall<T> c{{q, k, v, plan.thd() ? &table : nullptr}, {plan.plan, nullptr}};
  plan.plan->require_shape(shape_of(c.in), who);
  if (!ids.given()) return c;
  detail::require(!plan.thd(), who, ": segment_ids of a THD call describe its segments and are planned with it");
  const auto view = [](const std::optional<CpuArray<std::int32_t>>& a, const char* name) {
    return a ? view_of(*a, name) : TensorView<const std::int32_t>{};
  };
  auto parsed = std::make_shared<const SegmentIds>(
      SegmentIds::from_segment_ids(view(ids.segment_ids, "segment_ids"), view(ids.kv_segment_ids, "kv_segment_ids"),
                                   view(ids.positions, "positions"), view(ids.kv_positions, "kv_positions")));
  const bool backward = plan.backward();
  c.run = plan_with_segment_ids(plan.plan, plan.mask, std::move(parsed), [&](const AnyMask& document) {
    return plan_engine(plan.plan->shape(), document, backward, plan.threads);
  });
  c.in.segment_ids = c.run.ids.get();
  return c;
}

template <class Py>
auto forward_py(const CpuArray<Py>& q, const CpuArray<Py>& k, const CpuArray<Py>& v, const PyPlan& plan, float scale,
                float softcap, const std::optional<CpuArray<float>>& sinks, std::optional<std::int64_t> threads,
                const IdArrays& ids) {
  using T = Engine<Py>;
  const auto qv = engine_view(q, "q"), kv = engine_view(k, "k"), vv = engine_view(v, "v");
  const SegmentTable table = plan.thd() ? plan.segments->table.view() : SegmentTable{};
  const RunOptions options = run_options(plan, scale, softcap, sinks, threads);
  Tensor<T> out;
  Tensor<float> lse;
  {
    nb::gil_scoped_release release;
    // Outputs are allocated only once the inputs, the plan and the options
    // have passed every check: a bad call fails at once, whatever its size.
    const PlannedCall<T> call = planned_call(plan, table, qv, kv, vv, ids, "attention");
    check_run_options(options, plan.plan->shape());
    out = allocate_result("attention: out", out_extents(qv, vv), T{});
    lse = allocate_result("attention: lse", lse_extents(qv, plan.thd()), -std::numeric_limits<float>::infinity());
    run_forward(*call.run.plan, options, call.in, out.view(), lse.view());
  }
  const Extents shape = out.shape();
  return std::make_pair(to_numpy<Py>(std::move(out), shape), to_numpy(std::move(lse)));
}

template <class Py>
auto backward_py(const CpuArray<Py>& q, const CpuArray<Py>& k, const CpuArray<Py>& v, const CpuArray<Py>& out,
                 const CpuArray<float>& lse, const CpuArray<Py>& dout, const PyPlan& plan, float scale, float softcap,
                 std::optional<std::int64_t> threads, const IdArrays& ids) {
  using T = Engine<Py>;
  const auto qv = engine_view(q, "q"), kv = engine_view(k, "k"), vv = engine_view(v, "v");
  const auto outv = engine_view(out, "out"), doutv = engine_view(dout, "dout");
  const TensorView<const float> lsev = view_of(lse, "lse");
  const SegmentTable table = plan.thd() ? plan.segments->table.view() : SegmentTable{};
  const RunOptions options = run_options(plan, scale, softcap, std::nullopt, threads);
  Tensor<T> dq, dk, dv;
  {
    nb::gil_scoped_release release;
    detail::require(plan.backward(),
                    "attention_backward: the plan was made for the forward pass only; make it with "
                    "seqattn.plan(..., backward=True)");
    const PlannedCall<T> call = planned_call(plan, table, qv, kv, vv, ids, "attention_backward");
    check_run_options(options, plan.plan->shape());
    // The engine's own checks of out, lse and dout (same names and
    // messages), done here so that they too come before the allocations.
    detail::require_shape(outv, out_extents(qv, vv), "attention_backward: out");
    detail::require_shape(lsev, lse_extents(qv, plan.thd()), "attention_backward: lse");
    detail::require_shape(doutv, out_extents(qv, vv), "attention_backward: dout");
    dq = allocate_result("attention_backward: dq", qv.shape(), T{});
    dk = allocate_result("attention_backward: dk", kv.shape(), T{});
    dv = allocate_result("attention_backward: dv", vv.shape(), T{});
    run_backward(*call.run.plan, options, call.in, outv, lsev, doutv, dq.view(), dk.view(), dv.view());
  }
  const Extents sq = dq.shape(), sk = dk.shape(), sv = dv.shape();
  return std::make_tuple(to_numpy<Py>(std::move(dq), sq), to_numpy<Py>(std::move(dk), sk),
                         to_numpy<Py>(std::move(dv), sv));
}

using IdArg = std::optional<CpuArray<std::int32_t>>;

template <class Py>
void def_attention(nb::module_& m, const char* suffix) {
  const std::string fwd = std::string("attention_forward_") + suffix;
  const std::string bwd = std::string("attention_backward_") + suffix;
  m.def(
      fwd.c_str(),
      [](const CpuArray<Py>& q, const CpuArray<Py>& k, const CpuArray<Py>& v, const PyPlan& plan, float scale,
         float softcap, const std::optional<CpuArray<float>>& sinks, std::optional<std::int64_t> threads,
         const IdArg& segment_ids, const IdArg& kv_segment_ids, const IdArg& positions, const IdArg& kv_positions) {
        return forward_py<Py>(q, k, v, plan, scale, softcap, sinks, threads,
                              {segment_ids, kv_segment_ids, positions, kv_positions});
      },
      nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("plan"), nb::arg("scale"), nb::arg("softcap"),
      nb::arg("sinks").none(), nb::arg("threads").none(), nb::arg("segment_ids").none() = nb::none(),
      nb::arg("kv_segment_ids").none() = nb::none(), nb::arg("positions").none() = nb::none(),
      nb::arg("kv_positions").none() = nb::none());
  m.def(
      bwd.c_str(),
      [](const CpuArray<Py>& q, const CpuArray<Py>& k, const CpuArray<Py>& v, const CpuArray<Py>& out,
         const CpuArray<float>& lse, const CpuArray<Py>& dout, const PyPlan& plan, float scale, float softcap,
         std::optional<std::int64_t> threads, const IdArg& segment_ids, const IdArg& kv_segment_ids,
         const IdArg& positions, const IdArg& kv_positions) {
        return backward_py<Py>(q, k, v, out, lse, dout, plan, scale, softcap, threads,
                               {segment_ids, kv_segment_ids, positions, kv_positions});
      },
      nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"), nb::arg("lse"), nb::arg("dout"), nb::arg("plan"),
      nb::arg("scale"), nb::arg("softcap"), nb::arg("threads").none(), nb::arg("segment_ids").none() = nb::none(),
      nb::arg("kv_segment_ids").none() = nb::none(), nb::arg("positions").none() = nb::none(),
      nb::arg("kv_positions").none() = nb::none());
}

// [..., S, H, D] -> [prod(...), S, H, D], as the XLA FFI handlers fold the
// leading (batch and vmapped) dims.
Extents folded_bshd(const std::vector<index_t>& dims, const char* name) {
  detail::require(dims.size() >= 4, "attention: ", name, " must be [..., S, H, D] with at least one batch dim, got ",
                  dims.size(), " dims");
  index_t leading = 1;
  for (std::size_t d = 0; d < dims.size(); ++d) {
    detail::require(dims[d] >= 0, "attention: ", name, " has a negative extent ", dims[d]);
    if (d + 3 < dims.size()) leading = detail::checked_mul(leading, dims[d], name);
  }
  const std::size_t r = dims.size();
  Extents e;
  e.push_back(leading);
  for (std::size_t d = r - 3; d < r; ++d) e.push_back(dims[d]);
  detail::checked_tensor_size(e, name);
  return e;
}

// The segment-id operands a seqattn.jax call passes (their shapes are the
// call's: [..., S] of q or of k, checked in Python).
struct IdOperands {
  bool segment_ids = false, kv_segment_ids = false, positions = false, kv_positions = false;
};

// The mask the XLA handler runs (jax_ffi.cpp's call_plan: the document mask
// around the mask when segment ids are given, with the key side defaulting to
// the query side), checked for `batch` sequences of the call's lengths. Probe
// ids stand in for the traced ones: the checks that fail here depend on the
// shapes only, and all-padding ids pass every check of the values.
void check_handler_mask(const AnyMask& mask, const IdOperands& ids, index_t batch, index_t q_len, index_t kv_len,
                        index_t heads) {
  const RaggedLengths lengths = RaggedLengths::uniform(batch, q_len, kv_len);
  if (!ids.segment_ids) {
    detail::check_mask(mask, lengths, heads);
    return;
  }
  static const std::int32_t padding = 0;
  const auto probe = [](index_t rows, index_t tokens) {
    return TensorView<const std::int32_t>(&padding, Extents{rows, tokens}, Strides{0, 0});
  };
  const auto q_ids = probe(batch, q_len);
  const auto kv_ids = ids.kv_segment_ids ? probe(batch, kv_len) : q_ids;
  const auto q_pos = ids.positions ? probe(batch, q_len) : TensorView<const std::int32_t>{};
  const auto kv_pos = ids.kv_positions ? probe(batch, kv_len) : q_pos;
  const DocumentLayout layout = DocumentLayout::from_segment_ids(q_ids, kv_ids, q_pos, kv_pos);
  detail::check_mask(AnyMask(document_mask(layout, mask)), lengths, heads);
}

// Everything the engine checks that does not depend on the values: the
// shapes, the head ratio, scale / softcap / threads, the segment ids' shapes
// and the mask against the lengths and heads. seqattn.jax calls it while
// tracing, so that these errors are ValueErrors with the engine's message
// rather than XLA runtime errors.
//
// Under vmap the handler sees the vmapped dims folded into the batch, and
// vmap(jit(f)) traces f without them: the batch here may be a divisor of the
// one that runs. A mask with a batch of its own that is a multiple of the
// traced batch is therefore checked for its own batch (lengths and heads
// still exactly); one that is not a multiple fits no vmap and is refused.
// `exact_batch`: the caller knows no vmap is in play (concrete inputs, an
// eager call), so the batch here is the one that runs and nothing is relaxed.
void check_attention_call(const std::vector<index_t>& q, const std::vector<index_t>& k, const std::vector<index_t>& v,
                          nb::handle mask, bool segment_ids, float scale, float softcap, std::int64_t threads,
                          bool kv_segment_ids, bool positions, bool kv_positions, bool exact_batch) {
  const Extents qe = folded_bshd(q, "q"), ke = folded_bshd(k, "k"), ve = folded_bshd(v, "v");
  const AttentionShape shape =
      shape_of(AttentionInputs<float>{shape_probe(qe), shape_probe(ke), shape_probe(ve), nullptr});
  resolve_threads(threads);
  detail::check_variant(variants::Standard{scale, {softcap}, {}}, shape);
  const PyMask* m = nullptr;
  if (!mask.is_none()) {
    PyMask* cast = nullptr;
    if (!nb::try_cast<PyMask*>(mask, cast) || cast == nullptr) {
      mask_from_python(mask, "seqattn.jax mask");  // throws, naming the type
      return;
    }
    m = cast;
  }
  const AnyMask any = m ? m->mask : AnyMask();
  const IdOperands ids{segment_ids, kv_segment_ids, positions, kv_positions};
  const index_t traced_batch = qe[0];
  try {
    check_handler_mask(any, ids, traced_batch, qe[1], ke[1], shape.heads);
  } catch (const invalid_argument&) {
    const std::optional<index_t> own = !m ? std::nullopt : m->lengths ? m->lengths->batch() : m->batch;
    const bool vmap_can_fit =
        !exact_batch && own && traced_batch > 0 && *own > traced_batch && *own % traced_batch == 0;
    if (!vmap_can_fit) throw;
    check_handler_mask(any, ids, *own, qe[1], ke[1], shape.heads);
  }
}

// The values of segment ids known while tracing, checked as the XLA handler
// will read them (jax_ffi.cpp's call_plan: the key side defaults to the
// query side), so that malformed ones are ValueErrors rather than errors of
// the compiled call.
void check_segment_ids_call(const CpuArray<std::int32_t>& segment_ids,
                            const std::optional<CpuArray<std::int32_t>>& kv_segment_ids,
                            const std::optional<CpuArray<std::int32_t>>& positions,
                            const std::optional<CpuArray<std::int32_t>>& kv_positions) {
  const auto q_ids = view_of(segment_ids, "segment_ids");
  const auto kv_ids = kv_segment_ids ? view_of(*kv_segment_ids, "kv_segment_ids") : q_ids;
  const auto q_pos = positions ? view_of(*positions, "positions") : TensorView<const std::int32_t>{};
  const auto kv_pos = kv_positions ? view_of(*kv_positions, "kv_positions") : q_pos;
  nb::gil_scoped_release release;
  (void)DocumentLayout::from_segment_ids(q_ids, kv_ids, q_pos, kv_pos);
}

}  // namespace

void bind_attention(nb::module_& m) {
  nb::class_<Segments>(m, "_Segments", "A THD segment table (int32 q_offsets, q_lens, kv_offsets, kv_lens)")
      .def(
          "__init__",
          [](Segments* self, const SegmentArray& qo, const SegmentArray& ql, const SegmentArray& ko,
             const SegmentArray& kl) { new (self) Segments(segments_from_columns(qo, ql, ko, kl)); },
          nb::arg("q_offsets"), nb::arg("q_lens"), nb::arg("kv_offsets"), nb::arg("kv_lens"))
      .def_static("from_ids", &segments_from_ids, nb::arg("segment_ids"), nb::arg("kv_segment_ids").none(),
                  nb::arg("q_tokens"), nb::arg("kv_tokens"),
                  "The segments of THD segment ids [T] or [rows, S] (runs of equal non-zero ids; rows back to back).")
      .def_prop_ro("num_segments", [](const Segments& s) { return s.table.q_lens.size(); });
  nb::class_<PyPlan>(m, "_Plan", "The engine's plan of one call shape (seqattn.plan)")
      .def_prop_ro("backward", &PyPlan::backward)
      .def_prop_ro("threads", [](const PyPlan& p) { return p.threads; })
      .def_prop_ro("thd", &PyPlan::thd)
      .def("__repr__", &plan_repr);
  m.def("_plan", &make_plan, nb::arg("q_shape"), nb::arg("k_shape"), nb::arg("v_shape"), nb::arg("mask").none(),
        nb::arg("segments").none(), nb::arg("backward"), nb::arg("threads"));
  def_attention<float>(m, "f32");
  def_attention<std::uint16_t>(m, "bf16");
  m.def("_check_attention", &check_attention_call, nb::arg("q_shape"), nb::arg("k_shape"), nb::arg("v_shape"),
        nb::arg("mask").none(), nb::arg("segment_ids"), nb::arg("scale"), nb::arg("softcap"), nb::arg("threads"),
        nb::arg("kv_segment_ids") = false, nb::arg("positions") = false, nb::arg("kv_positions") = false,
        nb::arg("exact_batch") = false,
        "The engine's checks that need no data (shapes, heads, options, the mask), for seqattn.jax at trace time.");
  m.def("_check_segment_ids", &check_segment_ids_call, nb::arg("segment_ids"), nb::arg("kv_segment_ids").none(),
        nb::arg("positions").none(), nb::arg("kv_positions").none(),
        "The engine's checks of concrete segment ids and positions (int32 [..., S]), for seqattn.jax.");
}

}  // namespace seqattn::python
