// Attention on the CPU engine (backends::Dispatched: the Highway kernels of the
// best target this CPU has, src/dispatch.cc) for NumPy / DLPack arrays:
// forward (out, LSE) and backward.
#include "seqattn/attention.hpp"

#include <map>
#include <memory>
#include <mutex>
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>
#include <optional>
#include <thread>
#include <tuple>
#include <vector>

#include "seqattn/dispatch.hpp"
#include "seqattn/masks/document.hpp"

#include "bindings.hpp"
#include "internal.hpp"

namespace seqattn::python {
namespace {

// Range-checked in 64 bits, then narrowed: 2^32 + 1 must not become 1.
int resolve_threads(std::int64_t threads) {
  detail::require(threads >= 0, "attention: threads must be >= 0 (0 = all hardware threads), got ", threads);
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  detail::require(threads <= limits::kMaxThreads, "attention: threads must be at most ", limits::kMaxThreads,
                  " (limits::kMaxThreads), got ", threads);
  return static_cast<int>(threads);
}

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

using SegmentArray = nb::ndarray<const std::int32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

struct Segments {
  SegmentArray q_offsets, q_lens, kv_offsets, kv_lens;
  SegmentTable table() const {
    auto span = [](const SegmentArray& a) { return std::span<const std::int32_t>(a.data(), a.shape(0)); };
    return {span(q_offsets), span(q_lens), span(kv_offsets), span(kv_lens)};
  }
};

// Python storage type -> engine storage type: bf16 arrives as uint16 bits.
template <class Py>
using Engine = std::conditional_t<std::is_same_v<Py, std::uint16_t>, bfloat16, Py>;

template <class Py>
TensorView<const Engine<Py>> engine_view(const CpuArray<Py>& a, const char* name) {
  const TensorView<const Py> v = view_of(a, name);
  return TensorView<const Engine<Py>>(reinterpret_cast<const Engine<Py>*>(v.data()), v.shape(), v.strides());
}

template <class T>
Extents out_extents(TensorView<const T> q, TensorView<const T> v, bool thd) {
  detail::require(q.rank() == (thd ? 3 : 4) && v.rank() == q.rank(), "attention: q must have rank ", thd ? 3 : 4,
                  thd ? " (THD layout: [tokens, heads, dim])" : " (BSHD layout: [batch, seq, heads, dim])", ", got q ",
                  q.shape(), " and v ", v.shape());
  Extents e = q.shape();
  e[e.rank() - 1] = v.extent(-1);
  return e;
}

template <class T>
Extents lse_extents(TensorView<const T> q, bool thd) {
  return thd ? Extents{q.extent(1), q.extent(0)} : Extents{q.extent(0), q.extent(2), q.extent(1)};
}

// Validates a call completely (q, k, v and the segments, the threads, the
// mask against the shape, the plan's options, scale / softcap / sinks), then
// calls body(run): body allocates what it needs, then calls
// run(fn), and fn(plan, inputs, variant, executor) runs the engine.
template <class T, class Body>
void with_checked_plan(const EngineCall& call, const AttentionInputs<T>& in, bool backward, Body&& body) {
  const AttentionShape shape = shape_of(in);
  const int threads = resolve_threads(call.threads);
  const AnyMask mask = call.mask ? *call.mask : AnyMask();
  PlanOptions options;
  options.backward = backward;
  const auto plan = plan_attention<backends::Dispatched>(shape, mask, options, threads);
  const variants::Standard variant{call.scale, {call.softcap}, {call.sinks}};
  detail::check_variant(variant, shape);
  body([&](auto&& fn) { with_executor(threads, [&](auto& exec) { fn(plan, in, variant, exec); }); });
}

EngineCall make_call(nb::handle mask, const std::optional<SegmentTable>& table, float scale, float softcap,
                     const std::optional<CpuArray<float>>& sinks, std::int64_t threads) {
  EngineCall c;
  c.mask = mask.is_none() ? nullptr : &mask_from_python(mask);
  c.segments = table ? &*table : nullptr;
  c.scale = scale;
  c.softcap = softcap;
  if (sinks) {
    const TensorView<const float> s = view_of(*sinks, "sinks");
    detail::require(s.rank() == 1 && (s.is_contiguous() || s.size() <= 1),
                    "attention: sinks must be a contiguous "
                    "1-D array of one logit per query head, got shape ",
                    s.shape());
    c.sinks = std::span<const float>(s.data(), static_cast<std::size_t>(s.size()));
  }
  c.threads = threads;
  return c;
}

template <class Py>
auto forward_py(const CpuArray<Py>& q, const CpuArray<Py>& k, const CpuArray<Py>& v, nb::handle mask,
                const std::optional<Segments>& segments, float scale, float softcap,
                const std::optional<CpuArray<float>>& sinks, std::int64_t threads) {
  using T = Engine<Py>;
  const auto qv = engine_view(q, "q"), kv = engine_view(k, "k"), vv = engine_view(v, "v");
  const bool thd = segments.has_value();
  const std::optional<SegmentTable> table = thd ? std::optional<SegmentTable>(segments->table()) : std::nullopt;
  const EngineCall call = make_call(mask, table, scale, softcap, sinks, threads);
  Tensor<T> out;
  Tensor<float> lse;
  {
    nb::gil_scoped_release release;
    // Outputs are allocated only once the inputs, the mask and the options
    // have passed every check: a bad call fails at once, whatever its size.
    with_checked_plan<T>(call, AttentionInputs<T>{qv, kv, vv, call.segments}, false, [&](const auto& run) {
      out = allocate_result("attention: out", out_extents(qv, vv, thd), T{});
      lse = allocate_result("attention: lse", lse_extents(qv, thd), -std::numeric_limits<float>::infinity());
      run([&](const auto& plan, const auto& in, const auto& variant, auto& exec) {
        attention_forward(plan, in, out.view(), lse.view(), variant, exec);
      });
    });
  }
  const Extents shape = out.shape();
  return std::make_pair(to_numpy<Py>(std::move(out), shape), to_numpy(std::move(lse)));
}

template <class Py>
auto backward_py(const CpuArray<Py>& q, const CpuArray<Py>& k, const CpuArray<Py>& v, const CpuArray<Py>& out,
                 const CpuArray<float>& lse, const CpuArray<Py>& dout, nb::handle mask,
                 const std::optional<Segments>& segments, float scale, float softcap, std::int64_t threads) {
  using T = Engine<Py>;
  const auto qv = engine_view(q, "q"), kv = engine_view(k, "k"), vv = engine_view(v, "v");
  const auto outv = engine_view(out, "out"), doutv = engine_view(dout, "dout");
  const TensorView<const float> lsev = view_of(lse, "lse");
  const bool thd = segments.has_value();
  const std::optional<SegmentTable> table = thd ? std::optional<SegmentTable>(segments->table()) : std::nullopt;
  const EngineCall call = make_call(mask, table, scale, softcap, std::nullopt, threads);
  Tensor<T> dq, dk, dv;
  {
    nb::gil_scoped_release release;
    with_checked_plan<T>(call, AttentionInputs<T>{qv, kv, vv, call.segments}, true, [&](const auto& run) {
      // The engine's own checks of out, lse and dout (same names and
      // messages), done here so that they too come before the allocations.
      detail::require_shape(outv, out_extents(qv, vv, thd), "attention_backward: out");
      detail::require_shape(lsev, lse_extents(qv, thd), "attention_backward: lse");
      detail::require_shape(doutv, out_extents(qv, vv, thd), "attention_backward: dout");
      dq = allocate_result("attention_backward: dq", qv.shape(), T{});
      dk = allocate_result("attention_backward: dk", kv.shape(), T{});
      dv = allocate_result("attention_backward: dv", vv.shape(), T{});
      run([&](const auto& plan, const auto& in, const auto& variant, auto& exec) {
        attention_backward(plan, in, outv, lsev, doutv, AttentionGrads<T>{dq.view(), dk.view(), dv.view()}, variant,
                           exec);
      });
    });
  }
  const Extents sq = dq.shape(), sk = dk.shape(), sv = dv.shape();
  return std::make_tuple(to_numpy<Py>(std::move(dq), sq), to_numpy<Py>(std::move(dk), sk),
                         to_numpy<Py>(std::move(dv), sv));
}

template <class Py>
void def_attention(nb::module_& m, const char* suffix) {
  const std::string fwd = std::string("attention_forward_") + suffix;
  const std::string bwd = std::string("attention_backward_") + suffix;
  m.def(fwd.c_str(), &forward_py<Py>, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("mask").none(),
        nb::arg("segments").none(), nb::arg("scale"), nb::arg("softcap"), nb::arg("sinks").none(), nb::arg("threads"));
  m.def(bwd.c_str(), &backward_py<Py>, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"), nb::arg("lse"),
        nb::arg("dout"), nb::arg("mask").none(), nb::arg("segments").none(), nb::arg("scale"), nb::arg("softcap"),
        nb::arg("threads"));
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

// The mask the XLA handler runs (jax_ffi.cpp's call_mask: a document mask
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
  static const float probe = 0.0f;  // shape_of looks at shapes only; non-null says "has data"
  const auto view = [](const Extents& e) {
    Strides zero;
    for (int d = 0; d < e.rank(); ++d) zero.push_back(0);
    return TensorView<const float>(&probe, e, zero);
  };
  const Extents qe = folded_bshd(q, "q"), ke = folded_bshd(k, "k"), ve = folded_bshd(v, "v");
  const AttentionShape shape = shape_of(AttentionInputs<float>{view(qe), view(ke), view(ve), nullptr});
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
// will read them (jax_ffi.cpp's call_mask: the key side defaults to the
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

template <class T>
void run_forward(const EngineCall& call, TensorView<const T> q, TensorView<const T> k, TensorView<const T> v,
                 TensorView<T> out, TensorView<float> lse) {
  with_checked_plan<T>(call, AttentionInputs<T>{q, k, v, call.segments}, false, [&](const auto& run) {
    run([&](const auto& plan, const auto& in, const auto& variant, auto& exec) {
      attention_forward(plan, in, out, lse, variant, exec);
    });
  });
}

template <class T>
void run_backward(const EngineCall& call, TensorView<const T> q, TensorView<const T> k, TensorView<const T> v,
                  TensorView<const T> out, TensorView<const float> lse, TensorView<const T> dout, TensorView<T> dq,
                  TensorView<T> dk, TensorView<T> dv) {
  with_checked_plan<T>(call, AttentionInputs<T>{q, k, v, call.segments}, true, [&](const auto& run) {
    run([&](const auto& plan, const auto& in, const auto& variant, auto& exec) {
      attention_backward(plan, in, out, lse, dout, AttentionGrads<T>{dq, dk, dv}, variant, exec);
    });
  });
}

template void run_forward<float>(const EngineCall&, TensorView<const float>, TensorView<const float>,
                                 TensorView<const float>, TensorView<float>, TensorView<float>);
template void run_forward<bfloat16>(const EngineCall&, TensorView<const bfloat16>, TensorView<const bfloat16>,
                                    TensorView<const bfloat16>, TensorView<bfloat16>, TensorView<float>);
template void run_backward<float>(const EngineCall&, TensorView<const float>, TensorView<const float>,
                                  TensorView<const float>, TensorView<const float>, TensorView<const float>,
                                  TensorView<const float>, TensorView<float>, TensorView<float>, TensorView<float>);
template void run_backward<bfloat16>(const EngineCall&, TensorView<const bfloat16>, TensorView<const bfloat16>,
                                     TensorView<const bfloat16>, TensorView<const bfloat16>, TensorView<const float>,
                                     TensorView<const bfloat16>, TensorView<bfloat16>, TensorView<bfloat16>,
                                     TensorView<bfloat16>);

void bind_attention(nb::module_& m) {
  nb::class_<Segments>(m, "_Segments", "THD segment table: int32 q_offsets, q_lens, kv_offsets, kv_lens")
      .def(nb::init<SegmentArray, SegmentArray, SegmentArray, SegmentArray>(), nb::arg("q_offsets"), nb::arg("q_lens"),
           nb::arg("kv_offsets"), nb::arg("kv_lens"));
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
