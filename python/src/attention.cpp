// Attention on the CPU engine (Highway backend, this module's static SIMD
// target) for NumPy / DLPack arrays: forward (out, LSE) and backward.
#include "seqattn/attention.hpp"

#include <map>
#include <memory>
#include <mutex>
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/tuple.h>
#include <optional>
#include <thread>
#include <tuple>

#include "bindings.hpp"
#include "internal.hpp"

namespace seqattn::python {
namespace {

int resolve_threads(int threads) {
  detail::require(threads >= 0, "attention: threads must be >= 0 (0 = all hardware threads), got ", threads);
  if (threads == 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  detail::require(threads <= limits::kMaxThreads, "attention: threads must be at most ", limits::kMaxThreads,
                  " (limits::kMaxThreads), got ", threads);
  return threads;
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

EngineCall make_call(nb::handle mask, const std::optional<SegmentTable>& table, float scale, float softcap,
                     const std::optional<CpuArray<float>>& sinks, int threads) {
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
                const std::optional<CpuArray<float>>& sinks, int threads) {
  using T = Engine<Py>;
  const auto qv = engine_view(q, "q"), kv = engine_view(k, "k"), vv = engine_view(v, "v");
  const bool thd = segments.has_value();
  const std::optional<SegmentTable> table = thd ? std::optional<SegmentTable>(segments->table()) : std::nullopt;
  const EngineCall call = make_call(mask, table, scale, softcap, sinks, threads);
  Tensor<T> out(out_extents(qv, vv, thd), T{});
  Tensor<float> lse(lse_extents(qv, thd), -std::numeric_limits<float>::infinity());
  {
    nb::gil_scoped_release release;
    run_forward<T>(call, qv, kv, vv, out.view(), lse.view());
  }
  const Extents shape = out.shape();
  return std::make_pair(to_numpy<Py>(std::move(out), shape), to_numpy(std::move(lse)));
}

template <class Py>
auto backward_py(const CpuArray<Py>& q, const CpuArray<Py>& k, const CpuArray<Py>& v, const CpuArray<Py>& out,
                 const CpuArray<float>& lse, const CpuArray<Py>& dout, nb::handle mask,
                 const std::optional<Segments>& segments, float scale, float softcap, int threads) {
  using T = Engine<Py>;
  const auto qv = engine_view(q, "q"), kv = engine_view(k, "k"), vv = engine_view(v, "v");
  const bool thd = segments.has_value();
  const std::optional<SegmentTable> table = thd ? std::optional<SegmentTable>(segments->table()) : std::nullopt;
  const EngineCall call = make_call(mask, table, scale, softcap, std::nullopt, threads);
  Tensor<T> dq(qv.shape(), T{}), dk(kv.shape(), T{}), dv(vv.shape(), T{});
  {
    nb::gil_scoped_release release;
    run_backward<T>(call, qv, kv, vv, engine_view(out, "out"), view_of(lse, "lse"), engine_view(dout, "dout"),
                    dq.view(), dk.view(), dv.view());
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

}  // namespace

template <class T>
void run_forward(const EngineCall& call, TensorView<const T> q, TensorView<const T> k, TensorView<const T> v,
                 TensorView<T> out, TensorView<float> lse) {
  const AttentionInputs<T> in{q, k, v, call.segments};
  const AttentionShape shape = shape_of(in);
  const int threads = resolve_threads(call.threads);
  const AnyMask mask = call.mask ? *call.mask : AnyMask();
  const auto plan = plan_attention<backends::Highway>(shape, mask, PlanOptions{}, threads);
  const variants::Standard variant{call.scale, {call.softcap}, {call.sinks}};
  with_executor(threads, [&](auto& exec) { attention_forward(plan, in, out, lse, variant, exec); });
}

template <class T>
void run_backward(const EngineCall& call, TensorView<const T> q, TensorView<const T> k, TensorView<const T> v,
                  TensorView<const T> out, TensorView<const float> lse, TensorView<const T> dout, TensorView<T> dq,
                  TensorView<T> dk, TensorView<T> dv) {
  const AttentionInputs<T> in{q, k, v, call.segments};
  const AttentionShape shape = shape_of(in);
  const int threads = resolve_threads(call.threads);
  const AnyMask mask = call.mask ? *call.mask : AnyMask();
  PlanOptions options;
  options.backward = true;
  const auto plan = plan_attention<backends::Highway>(shape, mask, options, threads);
  const variants::Standard variant{call.scale, {call.softcap}, {call.sinks}};
  with_executor(threads, [&](auto& exec) {
    attention_backward(plan, in, out, lse, dout, AttentionGrads<T>{dq, dk, dv}, variant, exec);
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
}

}  // namespace seqattn::python
