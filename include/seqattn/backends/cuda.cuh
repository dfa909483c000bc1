// backends::Cuda: the attention engine on NVIDIA GPUs (sm_80 and newer), as
// an AttentionBackend policy. Compile with nvcc; link CUDA::cudart.
//
//   auto plan = seqattn::plan_attention<seqattn::backends::Cuda>(shape, mask);   // uploads the mask
//   seqattn::attention_forward(plan, inputs, out, lse, variant, seqattn::cuda::Stream{stream});
//
// The inputs are the usual AttentionInputs / TensorViews, over device memory
// (bf16 or fp16; seqattn::bfloat16 / seqattn::float16 are layout-compatible
// with __nv_bfloat16 / __half); THD segment tables stay on the host. Paged
// K/V: PagedAttentionInputs with device pages and a host block table and
// lengths (validated on the host like the CPU path, then uploaded as one page
// list). The call is asynchronous on the given stream; with
// execution::Serial it runs on the default stream and waits. Planning
// uploads the BlockMask (tile lists, full/partial flags, deduplicated tile
// bits) and allocates the split workspace once; a call allocates nothing
// (the page list's buffer grows once to the largest cache seen).
//
// Kernels (backends/cuda/): prefill on compute capability 9.x devices runs
// on the Hopper kernel (wgmma_forward_kernel.cuh: warpgroup MMAs) when the
// translation unit is compiled for sm_90a and defines SEQATTN_CUDA_WGMMA
// (see kWgmmaBuilt below; CMake's default architectures do both); otherwise,
// and for decode shapes and head dims over 128, on the mma.sync kernels of
// forward_kernel.cuh. Both share the tile scheduler, loads, mask, online
// softmax and epilogue (forward_tiles.cuh, online_softmax.cuh,
// forward_epilogue.cuh).
//
// Backward (attention_backward; plan with PlanOptions::backward = true): dQ,
// dK, dV and the sinks' gradient for every mask kind, GQA, BSHD and THD, the
// same variants, head dims up to 128, deterministic (no atomics: a key pass
// over the transposed device mask, a query pass over the forward one;
// backends/cuda/backward_kernel.cuh). Planning also uploads the transposed
// mask and allocates the per-row workspace. dsinks may be host memory (the
// call then waits for the stream before it returns) or device memory.
//
// Score variants run as device score hooks (backends/cuda/score_hooks.cuh;
// every kernel is a template over one hook type):
//   - Default, Scale, Softcap, Sinks, Alibi, Standard and Chains of them take
//     the built-in hooks, compiled once per configuration: PlainScores (scale
//     only, folded into the exponent) or SoftcapAlibiScores (softcap, then
//     ALiBi: in a Chain softcap must come before ALiBi, or the call throws).
//   - Any other variant runs its own score hooks in device code
//     (VariantScores, compiled in the .cu that calls attention_forward /
//     attention_backward with it): variants::Bias with a bias function,
//     variants::ScoreMod with its fn (and grad for the backward pass), and a
//     variant type of your own with `score(float s, const ScoreIndex&)` and
//     `score_grad(...)`; in a Chain also with Scale, Sinks, Softcap and Alibi
//     parts, applied in Chain order. Those functions must be callable in
//     device code: a functor whose operator() is SEQATTN_HOST_DEVICE
//     (seqattn/core/host_device.hpp, __host__ __device__ under nvcc), so that
//     the same variant also runs on the CPU backends; a host-only function
//     fails to compile ("calling a __host__ function from a __device__
//     function"). nvcc's __device__ lambdas need --extended-lambda. The
//     variant travels to the kernels by value: it must be trivially copyable
//     (device pointers and numbers, at most 2 KiB; checked at compile time).
//     ScoreIndex::batch is the sequence (THD: the segment), q and kv are
//     sequence-local. The hooks run on every pair of a visited tile inside
//     the sequence, masked pairs included (their results are dropped), never
//     on padding rows or keys past the end; -inf excludes a pair.
//   - A bias tensor: variants::Bias{variants::BiasTensor(view)} with a rank-4
//     fp32 view [batch or 1, heads or 1, q, kv] of device memory (strided, an
//     extent of 1 broadcasts). The call checks that it covers the shape and
//     that the pointer is device memory of the plan's device, throwing
//     before anything is uploaded or launched and naming the bias's shape.
//   - The backward pass uses the hook's score_grad in dS; a ScoreMod without
//     grad is refused at compile time (as on the CPU). Sinks come from
//     variants::Sinks (or Standard) only.
//
// Calls that reuse one plan are ordered on the GPU: a call's small uploads
// (sequence offsets, sinks, slopes, page list; skipped when unchanged) go
// into plan-owned buffers, and a call on another stream than the previous
// one first waits for it through an event, so one plan may serve several
// streams.
#pragma once

#include <array>
#include <atomic>
#include <cmath>
#include <cstring>
#include <cuda_runtime.h>
#include <memory>
#include <mutex>
#include <span>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "seqattn/attention/detail/problem.hpp"
#include "seqattn/attention/plan.hpp"
#include "seqattn/attention/run.hpp"
#include "seqattn/attention/variants.hpp"
#include "seqattn/backends/cuda/backward_kernel.cuh"
#include "seqattn/backends/cuda/forward_kernel.cuh"
#include "seqattn/backends/cuda/launch_plan.hpp"
#include "seqattn/backends/cuda/wgmma_forward_kernel.cuh"
#include "seqattn/backends/device_mask.hpp"
#include "seqattn/core/bfloat16.hpp"
#include "seqattn/core/error.hpp"
#include "seqattn/core/float16.hpp"

namespace seqattn::cuda {

// Whether this translation unit's kernels include the Hopper prefill kernel
// (backends/cuda/wgmma_forward_kernel.cuh): define SEQATTN_CUDA_WGMMA when
// the TU is compiled for sm_90a (-gencode arch=compute_90a,code=sm_90a; the
// CMake build does so when CMAKE_CUDA_ARCHITECTURES names 90a). Prefill on a
// compute capability 9.x device then takes it. Defined without sm_90a code,
// the kernel traps instead of computing.
#if defined(SEQATTN_CUDA_WGMMA)
inline constexpr bool kWgmmaBuilt = true;
#else
inline constexpr bool kWgmmaBuilt = false;
#endif

// Throws std::runtime_error naming the CUDA call that failed.
inline void check(cudaError_t status, const char* call) {
  if (status != cudaSuccess) {
    throw std::runtime_error(seqattn::detail::concat("Cuda backend: ", call, " failed: ", cudaGetErrorName(status),
                                                     " (", cudaGetErrorString(status), ")"));
  }
}

// Owning device allocation of n elements of T.
template <class T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t n) : size_(n) {
    if (n > 0) check(cudaMalloc(reinterpret_cast<void**>(&data_), n * sizeof(T)), "cudaMalloc");
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(size_, o.size_);
    return *this;
  }
  ~DeviceBuffer() {
    if (data_) cudaFree(data_);
  }
  T* data() const { return data_; }
  std::size_t size() const { return size_; }

  // Synchronous upload (planning only).
  void upload(std::span<const T> host) {
    seqattn::detail::require(host.size() <= size_, "DeviceBuffer::upload: ", host.size(), " elements into ", size_);
    if (!host.empty())
      check(cudaMemcpy(data_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy");
  }

 private:
  T* data_ = nullptr;
  std::size_t size_ = 0;
};

template <class T>
DeviceBuffer<T> upload(const std::vector<T>& host) {
  DeviceBuffer<T> buffer(host.size());
  buffer.upload(std::span<const T>(host));
  return buffer;
}

// The execution policy of the Cuda backend: the stream a call runs on. It is
// an ExecutionPolicy (one worker) so the generic attention_forward takes it.
struct Stream {
  cudaStream_t stream = nullptr;
  int workers() const { return 1; }
  template <class F>
  void parallel_for(index_t n, F&& f) const {
    for (index_t i = 0; i < n; ++i) f(i, 0);
  }
};

// What a plan made with PlanOptions::backward keeps for attention_backward.
struct DeviceBackwardPlan {
  backends::DeviceMaskLayout keys;  // the transposed BlockMask's layout (host copy)
  BackwardLaunchPlan launch;
  DeviceBuffer<std::int32_t> key_row_offsets;
  DeviceBuffer<backends::KvTileEntry> key_entries;
  DeviceBuffer<std::uint64_t> key_tile_bits;
  DeviceBuffer<WorkItem> query_items;
  DeviceBuffer<KeyWorkItem> key_items;
  DeviceBuffer<float> delta, lse_log2, sink_terms, dsinks;
  DeviceBuffer<detail::BackwardSequence> sequences;
  std::vector<detail::BackwardSequence> sequences_held, sequences_staged;
  std::array<const void*, 9> pointers_checked{};  // q, k, v, out, lse, dout, dq, dk, dv last found on this device
};

// What a plan keeps on the device.
struct DevicePlan {
  int device = 0;
  index_t num_sms = 0;
  backends::DeviceMaskLayout layout;  // host copy (inspection, tests)
  LaunchPlan launch;
  DeviceBuffer<std::int32_t> row_offsets;
  DeviceBuffer<backends::KvTileEntry> entries;
  DeviceBuffer<std::uint64_t> tile_bits;
  DeviceBuffer<WorkItem> items;
  DeviceBuffer<float> part_out, part_lse;
  // Per-call uploads, ordered by `last_call`.
  DeviceBuffer<detail::DeviceSequence> sequences;
  DeviceBuffer<float> sinks, slopes;
  // What the per-call buffers hold now: a call that would upload the same
  // bytes (the usual case when a plan is reused) skips the copy.
  std::vector<detail::DeviceSequence> sequences_held;
  std::vector<float> sinks_held, slopes_held;
  DeviceBuffer<std::int32_t> pages;  // paged K/V: the pages of every sequence, in order
  std::vector<std::int32_t> pages_held;
  // Host staging of a call's uploads, reused across calls.
  std::vector<detail::DeviceSequence> sequences_staged;
  std::vector<std::int32_t> pages_staged;
  std::mutex call_mutex;
  cudaEvent_t last_call = nullptr;
  cudaStream_t last_stream = nullptr;
  std::uint64_t calls = 0;
  std::array<const void*, 5> pointers_checked{};  // q, k, v, out, lse last found on this device
  std::unique_ptr<DeviceBackwardPlan> backward;   // with PlanOptions::backward

  DevicePlan() = default;
  DevicePlan(const DevicePlan&) = delete;
  DevicePlan& operator=(const DevicePlan&) = delete;
  ~DevicePlan() {
    if (last_call) cudaEventDestroy(last_call);
  }
};

// What a call uploads for its score variant (host spans), and the built-in
// variants' softcap.
struct DeviceVariant {
  float scale = 1.0f;
  float softcap = 0.0f;
  std::span<const float> sinks;   // host, per query head; empty: none
  std::span<const float> slopes;  // host ALiBi slopes; empty: none
};

namespace detail {

template <class V>
inline constexpr bool kAlwaysFalse = false;

// The built-in variants, which SoftcapAlibiScores or PlainScores run from
// the kernel parameters: Default, Scale, Softcap, Sinks, Alibi, Standard and
// Chains of them. Any other variant with a score hook runs its own hooks in
// device code (VariantScores).
template <class V>
struct IsBuiltinVariant
    : std::bool_constant<std::is_same_v<V, variants::Default> || std::is_same_v<V, variants::Scale> ||
                         std::is_same_v<V, variants::Softcap> || std::is_same_v<V, variants::Sinks> ||
                         std::is_same_v<V, variants::Alibi> || std::is_same_v<V, variants::Standard>> {};
template <class... Vs>
struct IsBuiltinVariant<variants::Chain<Vs...>> : std::bool_constant<(IsBuiltinVariant<Vs>::value && ...)> {};
template <class V>
inline constexpr bool kBuiltinVariant = IsBuiltinVariant<V>::value;

template <class V>
struct IsChain : std::false_type {};
template <class... Vs>
struct IsChain<variants::Chain<Vs...>> : std::true_type {};
template <class V>
struct IsBias : std::false_type {};
template <class F>
struct IsBias<variants::Bias<F>> : std::true_type {};
template <class V>
struct IsScoreMod : std::false_type {};
template <class F, class G>
struct IsScoreMod<variants::ScoreMod<F, G>> : std::true_type {};

// Adds one built-in variant's hooks to `d` (the scale comes from
// variant_scale, which already follows Chain's first-scale rule).
// `alibi_seen` enforces the order SoftcapAlibiScores applies them in:
// softcap, then ALiBi.
template <class V>
void add_variant(DeviceVariant& d, const V& v, bool& alibi_seen) {
  if constexpr (std::is_same_v<V, variants::Default> || std::is_same_v<V, variants::Scale>) {
  } else if constexpr (std::is_same_v<V, variants::Softcap>) {
    seqattn::detail::require(!alibi_seen || !(v.cap > 0.0f),
                             "Cuda backend: in a variant chain softcap must come before ALiBi (the kernel applies "
                             "softcap first)");
    d.softcap = v.cap;
  } else if constexpr (std::is_same_v<V, variants::Sinks>) {
    d.sinks = v.logits;
  } else if constexpr (std::is_same_v<V, variants::Alibi>) {
    d.slopes = v.slopes;
    alibi_seen = true;
  } else if constexpr (std::is_same_v<V, variants::Standard>) {
    add_variant(d, v.softcap, alibi_seen);
    add_variant(d, v.sinks, alibi_seen);
  } else if constexpr (requires { v.parts; }) {
    std::apply([&](const auto&... part) { (add_variant(d, part, alibi_seen), ...); }, v.parts);
  } else {
    static_assert(kAlwaysFalse<V>, "add_variant: not a built-in variant (kBuiltinVariant)");
  }
}

template <class V>
DeviceVariant device_variant(const V& v, index_t dk) {
  DeviceVariant d;
  d.scale = seqattn::detail::variant_scale(v, dk);
  bool alibi_seen = false;
  add_variant(d, v, alibi_seen);
  return d;
}

template <class... Parts, std::size_t... Is>
ScoreParts<Parts...> make_score_parts(std::index_sequence<Is...>, const Parts&... parts) {
  return {ScorePart<Is, Parts>{parts}...};
}
template <class... Parts>
ScoreParts<Parts...> make_score_parts(const Parts&... parts) {
  return make_score_parts(std::index_sequence_for<Parts...>{}, parts...);
}

// The device form of one part of a variant that runs its own score hooks
// (score_hooks.cuh), in Chain order; its sinks and ALiBi slopes go into `d`
// for the call's uploads. `slopes` is the plan's device buffer of the slopes.
template <class V>
auto device_part(const V& v, DeviceVariant& d, const float* slopes) {
  if constexpr (std::is_same_v<V, variants::Default> || std::is_same_v<V, variants::Scale>) {
    return ScoreIdentity{};
  } else if constexpr (std::is_same_v<V, variants::Sinks>) {
    d.sinks = v.logits;
    return ScoreIdentity{};
  } else if constexpr (std::is_same_v<V, variants::Softcap>) {
    return DeviceSoftcap{v.cap};
  } else if constexpr (std::is_same_v<V, variants::Alibi>) {
    d.slopes = v.slopes;
    return DeviceAlibi{slopes};
  } else if constexpr (std::is_same_v<V, variants::Standard>) {
    d.sinks = v.sinks.logits;
    return DeviceSoftcap{v.softcap.cap};
  } else if constexpr (IsChain<V>::value) {
    return std::apply([&](const auto&... part) { return make_score_parts(device_part(part, d, slopes)...); }, v.parts);
  } else if constexpr (IsBias<V>::value) {
    return DeviceBias<std::decay_t<decltype(v.bias)>>{v.bias};
  } else if constexpr (IsScoreMod<V>::value) {
    return DeviceScoreMod<std::decay_t<decltype(v.fn)>, std::decay_t<decltype(v.grad)>>{v.fn, v.grad};
  } else {
    static_assert(!HasSinkHook<V>,
                  "backends::Cuda takes sinks from variants::Sinks (or Standard) only, not from a sink hook of a "
                  "variant of your own");
    if constexpr (HasScoreHook<V>) {
      return DeviceVariantPart<V>{v};
    } else {
      return ScoreIdentity{};  // a scale of its own: variant_scale has it
    }
  }
}

// ALiBi parts of a variant (the plan holds one set of slopes).
template <class V>
struct AlibiParts : std::integral_constant<int, std::is_same_v<V, variants::Alibi> ? 1 : 0> {};
template <class... Vs>
struct AlibiParts<variants::Chain<Vs...>> : std::integral_constant<int, (0 + ... + AlibiParts<Vs>::value)> {};

// A kernel score hook travels to the device by value, as a kernel argument.
template <class Hook>
inline constexpr bool kHookFits = std::is_trivially_copyable_v<Hook> && sizeof(Hook) <= 2048;

// A variant that is not built in, as a kernel hook: its score hooks in device
// code, after the scale of variant_scale.
template <class V>
auto variant_scores(const V& v, index_t dk, DeviceVariant& d, const float* slopes) {
  static_assert(AlibiParts<V>::value <= 1, "backends::Cuda: at most one variants::Alibi in a variant");
  d.scale = seqattn::detail::variant_scale(v, dk);
  const auto part = device_part(v, d, slopes);
  const VariantScores<std::decay_t<decltype(part)>> hook{part, d.scale};
  static_assert(kHookFits<decltype(hook)>,
                "backends::Cuda passes a score variant to its kernels by value: it must be trivially copyable "
                "(hold device pointers and numbers, not containers) and at most 2 KiB");
  return hook;
}

template <class T>
using DeviceStorage = std::conditional_t<std::is_same_v<T, bfloat16>, bfloat16, float16>;

// Throws unless `p` is device memory of the current device (or managed).
inline void require_device_pointer(const void* p, const char* name, int device,
                                   const char* who = "attention_forward (Cuda)") {
  if (p == nullptr) return;
  cudaPointerAttributes attr{};
  check(cudaPointerGetAttributes(&attr, p), "cudaPointerGetAttributes");
  seqattn::detail::require(attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged, who, ": ", name,
                           " must point to device memory (cudaMalloc, a torch CUDA tensor, ...), got a host pointer");
  seqattn::detail::require(attr.type == cudaMemoryTypeManaged || attr.device == device, who, ": ", name,
                           " lives on device ", attr.device, " but the plan was made on device ", device);
}

// Throws unless every BiasTensor of a variant (in Chains too) points to device
// memory of the plan's device (before anything is uploaded or launched).
template <class V>
void require_variant_on_device(const V& v, int device, const char* who) {
  if constexpr (IsChain<V>::value) {
    std::apply([&](const auto&... part) { (require_variant_on_device(part, device, who), ...); }, v.parts);
  } else if constexpr (IsBias<V>::value) {
    if constexpr (std::is_same_v<std::decay_t<decltype(v.bias)>, variants::BiasTensor>) {
      const variants::BiasTensor& b = v.bias;
      const std::string name = seqattn::detail::concat("bias (variants::BiasTensor of shape (", b.batch, ", ", b.heads,
                                                       ", ", b.q, ", ", b.kv, "))");
      require_device_pointer(b.data, name.c_str(), device, who);
    }
  }
}

// Rows the kernels copy in 16-byte chunks (q, k, v, dout).
inline void require_row_layout(const seqattn::detail::TensorStrides& s, const void* base, const char* name,
                               const char* who = "attention_forward (Cuda)") {
  seqattn::detail::require(s.dim == 1, who, ": ", name,
                           " must be contiguous in the head dim (stride 1), got dim stride ", s.dim);
  seqattn::detail::require(s.token % 8 == 0 && s.head % 8 == 0 && reinterpret_cast<std::uintptr_t>(base) % 16 == 0, who,
                           ": ", name,
                           " rows must be 16-byte aligned: token and head strides multiples of 8 elements (got ",
                           s.token, " and ", s.head, ") and a 16-byte aligned base pointer");
}

// Rows the kernels write two elements at a time (out, dq, dk, dv).
inline void require_pair_layout(const seqattn::detail::TensorStrides& s, const void* base, const char* name,
                                const char* who) {
  seqattn::detail::require(
      s.dim == 1 && s.token % 2 == 0 && s.head % 2 == 0 && reinterpret_cast<std::uintptr_t>(base) % 4 == 0, who, ": ",
      name, " must be contiguous in the head dim with even token and head strides, got strides (token ", s.token,
      ", head ", s.head, ", dim ", s.dim, ")");
}

// Raises a kernel's dynamic shared memory limit once per device (the
// attribute is per device; setting it costs a driver call).
// One flag set per kernel instantiation.
template <auto kKernel>
void allow_shared_memory(int bytes, const char* what) {
  static std::atomic<std::uint64_t> done_devices{0};
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  const std::uint64_t bit = device < 64 ? std::uint64_t{1} << device : 0;
  if (bit != 0 && (done_devices.load(std::memory_order_acquire) & bit)) return;
  check(cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes), what);
  done_devices.fetch_or(bit, std::memory_order_acq_rel);
}

template <class T, int D, class Hook>
void launch_forward(const ForwardParams<T>& p, const LaunchPlan& lp, const Hook& hook, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(lp.items.size()), static_cast<unsigned>(lp.head_groups),
                  static_cast<unsigned>(lp.kv_splits));
  bool launched = false;
  if constexpr (D <= 128) {
    if (lp.decode) {
      auto* kernel = &decode_kernel<T, D, Hook>;
      constexpr int kSmem = DecodeConfig<D>::kSmemBytes;
      allow_shared_memory<&decode_kernel<T, D, Hook>>(kSmem, "cudaFuncSetAttribute(decode_kernel)");
      kernel<<<grid, kDecodeThreads, kSmem, stream>>>(p, hook);
      check(cudaGetLastError(), "decode_kernel launch");
      launched = true;
    }
#if defined(SEQATTN_CUDA_WGMMA)
    else if (lp.wgmma) {
      using Cfg = WgmmaConfig<D>;
      auto* kernel = &wgmma_forward_kernel<T, D, Hook>;
      allow_shared_memory<&wgmma_forward_kernel<T, D, Hook>>(Cfg::kSmemBytes,
                                                             "cudaFuncSetAttribute(wgmma_forward_kernel)");
      kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(p, hook);
      check(cudaGetLastError(), "wgmma_forward_kernel launch");
      launched = true;
    }
#endif
  }
  if (!launched) {
    using Cfg = KernelConfig<D>;
    auto* kernel = &forward_kernel<T, D, Hook>;
    allow_shared_memory<&forward_kernel<T, D, Hook>>(Cfg::kSmemBytes, "cudaFuncSetAttribute(forward_kernel)");
    kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(p, hook);
    check(cudaGetLastError(), "forward_kernel launch");
  }
  if (lp.kv_splits > 1) {
    merge_splits_kernel<T><<<dim3(grid.x, grid.y, 1), kMergeThreads, 0, stream>>>(p);
    check(cudaGetLastError(), "merge_splits_kernel launch");
  }
}

// SEQATTN_CUDA_SEPARATE_INSTANCES (an internal build detail of this
// repository's tests, benchmarks and examples; cmake/SeqattnCuda.cmake): every
// launch_forward<T, D, Hook> of the built-in hooks (PlainScores,
// SoftcapAlibiScores) is compiled once, in a generated instance file per
// configuration, instead of in every .cu that uses the backend. A variant's
// own hooks (VariantScores) are compiled where they are used. Consumers of
// the header never define it and see no difference.
#if defined(SEQATTN_CUDA_SEPARATE_INSTANCES) && !defined(SEQATTN_CUDA_INSTANCE_TU)
#define SEQATTN_CUDA_EXTERN_LAUNCH(T, D)                                                                    \
  extern template void launch_forward<T, D, PlainScores>(const ForwardParams<T>&, const LaunchPlan&,        \
                                                         const PlainScores&, cudaStream_t);                 \
  extern template void launch_forward<T, D, SoftcapAlibiScores>(const ForwardParams<T>&, const LaunchPlan&, \
                                                                const SoftcapAlibiScores&, cudaStream_t);
SEQATTN_CUDA_EXTERN_LAUNCH(bfloat16, 64)
SEQATTN_CUDA_EXTERN_LAUNCH(bfloat16, 128)
SEQATTN_CUDA_EXTERN_LAUNCH(bfloat16, 256)
SEQATTN_CUDA_EXTERN_LAUNCH(float16, 64)
SEQATTN_CUDA_EXTERN_LAUNCH(float16, 128)
SEQATTN_CUDA_EXTERN_LAUNCH(float16, 256)
#undef SEQATTN_CUDA_EXTERN_LAUNCH
#endif

// The built-in variants: plain scores (a positive scale, nothing else) fold
// the scale into the exponent (PlainScores); anything else takes
// SoftcapAlibiScores (forward and backward parameters name the variant's
// fields alike).
template <class Params>
bool modifies_scores(const Params& p) {
  return p.softcap_log2 != 0.0f || p.alibi_slopes != nullptr || !(p.scale_log2 > 0.0f);
}

// What Cuda passes to run / run_backward for the built-in variants: the hook
// is PlainScores or SoftcapAlibiScores, chosen from the parameters.
struct BuiltinScores {};

// Calls launch(hook) with the kernel hook of a call: for the built-in variants
// PlainScores or SoftcapAlibiScores, chosen from the parameters.
template <class Params, class Hook, class Launch>
void with_hook(const Params& p, const Hook& hook, Launch&& launch) {
  if constexpr (std::is_same_v<Hook, BuiltinScores>) {
    if (modifies_scores(p)) {
      launch(SoftcapAlibiScores{});
    } else {
      launch(PlainScores{});
    }
  } else {
    launch(hook);
  }
}

template <class T, int D, class Hook>
void launch_backward(const BackwardParams<T>& p, const BackwardLaunchPlan& lp, const Hook& hook, cudaStream_t stream) {
  const auto query_ctas = static_cast<unsigned>(lp.query_items.size());
  const auto heads = static_cast<unsigned>(p.heads), kv_heads = static_cast<unsigned>(p.heads / p.group);
  // No query at all (every q_len 0): the key pass alone writes dK = dV = 0.
  if (query_ctas > 0) {
    backward_rows_kernel<T><<<dim3(query_ctas, heads), kBackwardRowThreads, 0, stream>>>(p);
    check(cudaGetLastError(), "backward_rows_kernel launch");
  }
  if (p.dsinks) {
    sink_grad_kernel<T><<<heads, kSinkGradThreads, 0, stream>>>(p);
    check(cudaGetLastError(), "sink_grad_kernel launch");
  }
  constexpr int kKeySmem = KeyGradConfig<D>::kSmemBytes, kQuerySmem = QueryGradConfig<D>::kSmemBytes;
  allow_shared_memory<&key_grad_kernel<T, D, Hook>>(kKeySmem, "cudaFuncSetAttribute(key_grad_kernel)");
  allow_shared_memory<&query_grad_kernel<T, D, Hook>>(kQuerySmem, "cudaFuncSetAttribute(query_grad_kernel)");
  if (!lp.key_items.empty()) {
    key_grad_kernel<T, D, Hook>
        <<<dim3(static_cast<unsigned>(lp.key_items.size()), kv_heads), KeyGradConfig<D>::kThreads, kKeySmem, stream>>>(
            p, hook);
    check(cudaGetLastError(), "key_grad_kernel launch");
  }
  if (query_ctas > 0) {
    query_grad_kernel<T, D, Hook>
        <<<dim3(query_ctas, heads), QueryGradConfig<D>::kThreads, kQuerySmem, stream>>>(p, hook);
    check(cudaGetLastError(), "query_grad_kernel launch");
  }
}

#if defined(SEQATTN_CUDA_SEPARATE_INSTANCES) && !defined(SEQATTN_CUDA_INSTANCE_TU)
#define SEQATTN_CUDA_EXTERN_BACKWARD(T, D)                                                                            \
  extern template void launch_backward<T, D, PlainScores>(const BackwardParams<T>&, const BackwardLaunchPlan&,        \
                                                          const PlainScores&, cudaStream_t);                          \
  extern template void launch_backward<T, D, SoftcapAlibiScores>(const BackwardParams<T>&, const BackwardLaunchPlan&, \
                                                                 const SoftcapAlibiScores&, cudaStream_t);
SEQATTN_CUDA_EXTERN_BACKWARD(bfloat16, 64)
SEQATTN_CUDA_EXTERN_BACKWARD(bfloat16, 128)
SEQATTN_CUDA_EXTERN_BACKWARD(float16, 64)
SEQATTN_CUDA_EXTERN_BACKWARD(float16, 128)
#undef SEQATTN_CUDA_EXTERN_BACKWARD
#endif

}  // namespace detail
}  // namespace seqattn::cuda

namespace seqattn::backends {

struct Cuda {
  struct Work {
    std::shared_ptr<cuda::DevicePlan> device;
  };

  static const char* name() { return "Cuda"; }
  static constexpr BlockShape block_shape() { return {cuda::kBlockQ, cuda::kBlockKv}; }
  template <class T>
  static constexpr bool kStores = std::is_same_v<T, bfloat16> || std::is_same_v<T, float16>;

  static Support supports(const AttentionShape& s) {
    if (s.dk > cuda::kMaxHeadDim || s.dv > cuda::kMaxHeadDim) {
      return {detail::concat("head dims up to ", cuda::kMaxHeadDim, " (dk ", s.dk, ", dv ", s.dv, ")")};
    }
    if (s.dk % 8 != 0 || s.dv % 8 != 0) {
      return {detail::concat("head dims must be multiples of 8 (16-byte rows), got dk ", s.dk, ", dv ", s.dv)};
    }
    for (index_t b = 0; b < s.batch(); ++b) {
      if (s.q_len(b) > INT32_MAX - cuda::kBlockQ || s.kv_len(b) > INT32_MAX - cuda::kBlockKv) {
        return {detail::concat("sequence ", b, " is longer than 2^31 - 128 tokens")};
      }
    }
    return {};
  }

  static Work plan_work(const AttentionShape& shape, const BlockMask& bm, const PlanOptions& options, int) {
    auto d = std::make_shared<cuda::DevicePlan>();
    cuda::check(cudaGetDevice(&d->device), "cudaGetDevice");
    int sms = 0;
    cuda::check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, d->device), "cudaDeviceGetAttribute");
    d->num_sms = sms;
    d->layout = build_device_mask_layout(bm, "Cuda backend");
    d->launch = cuda::plan_launch(shape, d->layout, options, d->num_sms);
    int compute_major = 0;
    cuda::check(cudaDeviceGetAttribute(&compute_major, cudaDevAttrComputeCapabilityMajor, d->device),
                "cudaDeviceGetAttribute");
    d->launch.wgmma = cuda::use_wgmma(d->launch, compute_major, cuda::kWgmmaBuilt);
    d->row_offsets = cuda::upload(d->layout.row_offsets);
    d->entries = cuda::upload(d->layout.entries);
    d->tile_bits = cuda::upload(d->layout.tile_bits);
    d->items = cuda::upload(d->launch.items);
    d->part_out =
        cuda::DeviceBuffer<float>(static_cast<std::size_t>(d->launch.workspace_out_elems(shape.heads, shape.dv)));
    d->part_lse = cuda::DeviceBuffer<float>(static_cast<std::size_t>(d->launch.workspace_lse_elems(shape.heads)));
    d->sequences = cuda::DeviceBuffer<cuda::detail::DeviceSequence>(static_cast<std::size_t>(shape.batch()));
    d->sinks = cuda::DeviceBuffer<float>(static_cast<std::size_t>(shape.heads));
    d->slopes = cuda::DeviceBuffer<float>(static_cast<std::size_t>(shape.heads));
    cuda::check(cudaEventCreateWithFlags(&d->last_call, cudaEventDisableTiming), "cudaEventCreate");
    if (options.backward) d->backward = plan_backward(shape, bm, d->layout);
    return {std::move(d)};
  }

  // A call runs on the stream of a cuda::Stream executor and returns before
  // the GPU is done; any other executor runs it on the default stream and waits.
  template <class Exec>
  static constexpr bool kAsync = std::is_same_v<std::decay_t<Exec>, cuda::Stream>;
  template <class Exec>
  static cudaStream_t stream_of(const Exec& exec) {
    if constexpr (kAsync<Exec>) {
      return exec.stream;
    } else {
      return nullptr;
    }
  }

  template <class Backend, class T, class V, class Exec>
  static void forward(const AttentionPlan<Backend>& plan, const detail::AttentionProblem<T>& problem, const V& variant,
                      Exec& exec) {
    if constexpr (!kStores<T>) {
      detail::throw_invalid(
          "attention_forward: backend Cuda computes on bf16 or fp16 storage (seqattn::bfloat16, "
          "seqattn::float16); got fp32 inputs");
    } else {
      const cudaStream_t stream = stream_of(exec);
      if constexpr (cuda::detail::kBuiltinVariant<V>) {
        run(plan, problem, cuda::detail::device_variant(variant, problem.dk), cuda::detail::BuiltinScores{}, stream);
      } else {
        cuda::DevicePlan& d = *plan.work().device;
        cuda::detail::require_variant_on_device(variant, d.device, "attention_forward (Cuda)");
        cuda::DeviceVariant dv;
        const auto hook = cuda::detail::variant_scores(variant, problem.dk, dv, d.slopes.data());
        run(plan, problem, dv, hook, stream);
      }
      if (!kAsync<Exec>) cuda::check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    }
  }

  template <class Backend, class T, class V, class Exec>
  static void backward(const AttentionPlan<Backend>& plan, const detail::BackwardProblem<T>& problem, const V& variant,
                       Exec& exec) {
    if constexpr (!kStores<T>) {
      detail::throw_invalid(
          "attention_backward: backend Cuda computes on bf16 or fp16 storage (seqattn::bfloat16, "
          "seqattn::float16); got fp32 inputs");
    } else {
      const cudaStream_t stream = stream_of(exec);
      bool wait = false;
      if constexpr (cuda::detail::kBuiltinVariant<V>) {
        wait = run_backward(plan, problem, cuda::detail::device_variant(variant, problem.fwd.dk),
                            cuda::detail::BuiltinScores{}, stream);
      } else {
        static_assert(!HasScoreHook<V> || HasScoreGradHook<V>,
                      "attention_backward (Cuda): the variant's score hook has no score_grad");
        cuda::DevicePlan& d = *plan.work().device;
        cuda::detail::require_variant_on_device(variant, d.device, "attention_backward (Cuda)");
        cuda::DeviceVariant dv;
        const auto hook = cuda::detail::variant_scores(variant, problem.fwd.dk, dv, d.slopes.data());
        wait = run_backward(plan, problem, dv, hook, stream);
      }
      if (wait || !kAsync<Exec>) cuda::check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    }
  }

 private:
  static std::unique_ptr<cuda::DeviceBackwardPlan> plan_backward(const AttentionShape& shape, const BlockMask& bm,
                                                                 const DeviceMaskLayout& layout) {
    auto b = std::make_unique<cuda::DeviceBackwardPlan>();
    b->keys = build_device_mask_layout(bm.transposed(), "Cuda backend");
    b->launch = cuda::plan_backward_launch(shape, layout, b->keys);
    b->key_row_offsets = cuda::upload(b->keys.row_offsets);
    b->key_entries = cuda::upload(b->keys.entries);
    b->key_tile_bits = cuda::upload(b->keys.tile_bits);
    b->query_items = cuda::upload(b->launch.query_items);
    b->key_items = cuda::upload(b->launch.key_items);
    const auto rows = static_cast<std::size_t>(b->launch.workspace_rows(shape.heads));
    b->delta = cuda::DeviceBuffer<float>(rows);
    b->lse_log2 = cuda::DeviceBuffer<float>(rows);
    b->sink_terms = cuda::DeviceBuffer<float>(rows);
    b->dsinks = cuda::DeviceBuffer<float>(static_cast<std::size_t>(shape.heads));
    b->sequences = cuda::DeviceBuffer<cuda::detail::BackwardSequence>(static_cast<std::size_t>(shape.batch()));
    return b;
  }

  static void require_current_device(const cuda::DevicePlan& d, const char* who) {
    int device = 0;
    cuda::check(cudaGetDevice(&device), "cudaGetDevice");
    detail::require(device == d.device, who, ": the plan was made on device ", d.device, " but device ", device,
                    " is current");
  }

  // Calls on one stream are ordered already; another stream waits for the
  // previous call before its uploads overwrite the plan's buffers.
  static void order_after_last_call(cuda::DevicePlan& d, cudaStream_t stream) {
    if (d.calls > 0 && stream != d.last_stream) {
      cuda::check(cudaStreamWaitEvent(stream, d.last_call, 0), "cudaStreamWaitEvent");
    }
  }
  static void record_call(cuda::DevicePlan& d, cudaStream_t stream) {
    cuda::check(cudaEventRecord(d.last_call, stream), "cudaEventRecord");
    d.last_stream = stream;
    ++d.calls;
  }

  // Returns whether the caller must wait for the stream (dsinks in host memory).
  // Hook: cuda::detail::BuiltinScores or a VariantScores (score_hooks.cuh).
  template <class Backend, class T, class Hook>
  static bool run_backward(const AttentionPlan<Backend>& plan, const detail::BackwardProblem<T>& bp,
                           const cuda::DeviceVariant& variant, const Hook& hook, cudaStream_t stream) {
    static constexpr const char* kWho = "attention_backward (Cuda)";
    cuda::DevicePlan& d = *plan.work().device;
    detail::require(d.backward != nullptr,
                    "attention_backward: the plan was made without PlanOptions::backward = true");
    cuda::DeviceBackwardPlan& w = *d.backward;
    const cuda::BackwardLaunchPlan& lp = w.launch;
    const detail::AttentionProblem<T>& pr = bp.fwd;
    require_current_device(d, kWho);
    std::lock_guard lock(d.call_mutex);
    const std::array<const void*, 9> ptrs{pr.q,         pr.k,       pr.v,       pr.out,    pr.lse,
                                          bp.dout.data, bp.dq.data, bp.dk.data, bp.dv.data};
    if (ptrs != w.pointers_checked) {
      static constexpr std::array<const char*, 9> kNames{"q", "k", "v", "out", "lse", "dout", "dq", "dk", "dv"};
      for (std::size_t i = 0; i < ptrs.size(); ++i) {
        cuda::detail::require_device_pointer(ptrs[i], kNames[i], d.device, kWho);
      }
      w.pointers_checked = ptrs;
    }
    cuda::detail::require_row_layout(pr.q_strides, pr.q, "q", kWho);
    cuda::detail::require_row_layout(pr.k_strides, pr.k, "k", kWho);
    cuda::detail::require_row_layout(pr.v_strides, pr.v, "v", kWho);
    cuda::detail::require_row_layout(bp.dout.strides, bp.dout.data, "dout", kWho);
    detail::require(pr.out_strides.dim == 1, kWho, ": out must be contiguous in the head dim, got dim stride ",
                    pr.out_strides.dim);
    cuda::detail::require_pair_layout(bp.dq.strides, bp.dq.data, "dq", kWho);
    cuda::detail::require_pair_layout(bp.dk.strides, bp.dk.data, "dk", kWho);
    cuda::detail::require_pair_layout(bp.dv.strides, bp.dv.data, "dv", kWho);
    bool host_dsinks = false;
    if (!bp.dsinks.empty()) {
      cudaPointerAttributes attr{};
      cuda::check(cudaPointerGetAttributes(&attr, bp.dsinks.data()), "cudaPointerGetAttributes");
      host_dsinks = attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged;
      detail::require(host_dsinks || attr.type == cudaMemoryTypeManaged || attr.device == d.device, kWho,
                      ": dsinks lives on device ", attr.device, " but the plan was made on device ", d.device);
    }

    using S = cuda::detail::DeviceStorage<T>;
    cuda::detail::BackwardParams<S> p{};
    p.q = reinterpret_cast<const S*>(pr.q);
    p.k = reinterpret_cast<const S*>(pr.k);
    p.v = reinterpret_cast<const S*>(pr.v);
    p.out = reinterpret_cast<const S*>(pr.out);
    p.dout = reinterpret_cast<const S*>(bp.dout.data);
    p.dq_data = reinterpret_cast<S*>(bp.dq.data);
    p.dk_data = reinterpret_cast<S*>(bp.dk.data);
    p.dv_data = reinterpret_cast<S*>(bp.dv.data);
    p.lse = pr.lse;
    p.q_token_stride = pr.q_strides.token;
    p.q_head_stride = pr.q_strides.head;
    p.k_token_stride = pr.k_strides.token;
    p.k_head_stride = pr.k_strides.head;
    p.v_token_stride = pr.v_strides.token;
    p.v_head_stride = pr.v_strides.head;
    p.out_token_stride = pr.out_strides.token;
    p.out_head_stride = pr.out_strides.head;
    p.dout_token_stride = bp.dout.strides.token;
    p.dout_head_stride = bp.dout.strides.head;
    p.dq_token_stride = bp.dq.strides.token;
    p.dq_head_stride = bp.dq.strides.head;
    p.dk_token_stride = bp.dk.strides.token;
    p.dk_head_stride = bp.dk.strides.head;
    p.dv_token_stride = bp.dv.strides.token;
    p.dv_head_stride = bp.dv.strides.head;
    p.lse_token_stride = pr.lse_strides.token;
    p.lse_head_stride = pr.lse_strides.head;
    p.row_offsets = d.row_offsets.data();
    p.entries = reinterpret_cast<const int2*>(d.entries.data());
    p.tile_bits = reinterpret_cast<const unsigned long long*>(d.tile_bits.data());
    p.key_row_offsets = w.key_row_offsets.data();
    p.key_entries = reinterpret_cast<const int2*>(w.key_entries.data());
    p.key_tile_bits = reinterpret_cast<const unsigned long long*>(w.key_tile_bits.data());
    p.query_items = reinterpret_cast<const int2*>(w.query_items.data());
    p.key_items = reinterpret_cast<const int2*>(w.key_items.data());
    p.heads = static_cast<int>(pr.heads);
    p.group = static_cast<int>(pr.group);
    p.mask_heads = static_cast<int>(d.layout.mask_heads);
    p.dk = static_cast<int>(pr.dk);
    p.dv = static_cast<int>(pr.dv);
    p.scale = variant.scale;
    p.scale_log2 = variant.scale * cuda::detail::kLog2e;
    if (variant.softcap > 0.0f) {
      p.softcap_log2 = variant.softcap * cuda::detail::kLog2e;
      p.softcap_inner = variant.scale / variant.softcap;
    }
    p.delta = w.delta.data();
    p.lse_log2 = w.lse_log2.data();
    p.sink_terms = w.sink_terms.data();
    p.q_tokens = lp.q_tokens;

    std::vector<cuda::detail::BackwardSequence>& seqs = w.sequences_staged;
    seqs.resize(pr.sequences.size());
    for (std::size_t b = 0; b < seqs.size(); ++b) {
      const detail::SequenceGeometry& g = pr.sequences[b];
      seqs[b] = {g.q_base,
                 g.k_base,
                 g.v_base,
                 g.out_base,
                 g.lse_base,
                 bp.dout.base[b],
                 bp.dq.base[b],
                 bp.dk.base[b],
                 bp.dv.base[b],
                 static_cast<int>(g.q_len),
                 static_cast<int>(g.kv_len),
                 d.layout.row_base[b],
                 w.keys.row_base[b],
                 lp.q_token_base[b]};
    }
    order_after_last_call(d, stream);
    upload_if_changed(w.sequences.data(), std::span<const cuda::detail::BackwardSequence>(seqs), w.sequences_held,
                      stream, "cudaMemcpyAsync(backward sequences)");
    if (!variant.slopes.empty()) {
      upload_if_changed(d.slopes.data(), variant.slopes, d.slopes_held, stream, "cudaMemcpyAsync(ALiBi slopes)");
      p.alibi_slopes = d.slopes.data();
    }
    const bool sink_grad = !bp.dsinks.empty() && !variant.sinks.empty();
    if (sink_grad) {
      upload_if_changed(d.sinks.data(), variant.sinks, d.sinks_held, stream, "cudaMemcpyAsync(sinks)");
      p.sinks = d.sinks.data();
      p.dsinks = host_dsinks ? w.dsinks.data() : bp.dsinks.data();
    } else if (!bp.dsinks.empty()) {  // no sinks in the variant: their gradient is 0
      if (host_dsinks) {
        std::fill(bp.dsinks.begin(), bp.dsinks.end(), 0.0f);
        host_dsinks = false;
      } else {
        cuda::check(cudaMemsetAsync(bp.dsinks.data(), 0, bp.dsinks.size_bytes(), stream), "cudaMemsetAsync(dsinks)");
      }
    }
    p.sequences = w.sequences.data();
    cuda::detail::with_hook(p, hook, [&](const auto& h) {
      if (lp.head_dim == 64) {
        cuda::detail::launch_backward<S, 64>(p, lp, h, stream);
      } else {
        cuda::detail::launch_backward<S, 128>(p, lp, h, stream);
      }
    });
    if (host_dsinks) {
      cuda::check(
          cudaMemcpyAsync(bp.dsinks.data(), w.dsinks.data(), bp.dsinks.size_bytes(), cudaMemcpyDeviceToHost, stream),
          "cudaMemcpyAsync(dsinks)");
    }
    record_call(d, stream);
    return host_dsinks;
  }

  // Stream-ordered upload of a call's small host array into a plan buffer,
  // skipped when the buffer already holds these bytes.
  template <class E>
  static void upload_if_changed(E* device, std::span<const E> host, std::vector<E>& held, cudaStream_t stream,
                                const char* what) {
    static_assert(std::is_trivially_copyable_v<E>);
    if (held.size() == host.size() && std::memcmp(held.data(), host.data(), host.size_bytes()) == 0) return;
    cuda::check(cudaMemcpyAsync(device, host.data(), host.size_bytes(), cudaMemcpyHostToDevice, stream), what);
    held.assign(host.begin(), host.end());
  }

  // Hook: cuda::detail::BuiltinScores or a VariantScores (score_hooks.cuh).
  template <class Backend, class T, class Hook>
  static void run(const AttentionPlan<Backend>& plan, const detail::AttentionProblem<T>& pr,
                  const cuda::DeviceVariant& variant, const Hook& hook, cudaStream_t stream) {
    cuda::DevicePlan& d = *plan.work().device;
    const cuda::LaunchPlan& lp = d.launch;
    require_current_device(d, "attention_forward (Cuda)");
    // One call at a time touches the plan's host-side state and buffers.
    std::lock_guard lock(d.call_mutex);
    // cudaPointerGetAttributes costs about a microsecond each: decode steps
    // that reuse their buffers check them once.
    const std::array<const void*, 5> ptrs{pr.q, pr.k, pr.v, pr.out, pr.lse};
    if (ptrs != d.pointers_checked) {
      cuda::detail::require_device_pointer(pr.q, "q", d.device);
      cuda::detail::require_device_pointer(pr.k, "k", d.device);
      cuda::detail::require_device_pointer(pr.v, "v", d.device);
      cuda::detail::require_device_pointer(pr.out, "out", d.device);
      cuda::detail::require_device_pointer(pr.lse, "lse", d.device);
      d.pointers_checked = ptrs;
    }
    cuda::detail::require_row_layout(pr.q_strides, pr.q, "q");
    cuda::detail::require_row_layout(pr.k_strides, pr.k, "k");
    cuda::detail::require_row_layout(pr.v_strides, pr.v, "v");
    cuda::detail::require_pair_layout(pr.out_strides, pr.out, "out", "attention_forward (Cuda)");
    const bool paged = pr.paging.page_size > 0;
    if (paged) {
      detail::require(pr.paging.k_page_stride % 8 == 0 && pr.paging.v_page_stride % 8 == 0,
                      "attention_forward (Cuda, paged K/V): page strides must be multiples of 8 elements (16-byte "
                      "rows), got k_pages ",
                      pr.paging.k_page_stride, " and v_pages ", pr.paging.v_page_stride);
    }

    using S = cuda::detail::DeviceStorage<T>;
    cuda::detail::ForwardParams<S> p{};
    p.q = reinterpret_cast<const S*>(pr.q);
    p.k = reinterpret_cast<const S*>(pr.k);
    p.v = reinterpret_cast<const S*>(pr.v);
    p.out = reinterpret_cast<S*>(pr.out);
    p.lse = pr.lse;
    p.q_token_stride = pr.q_strides.token;
    p.q_head_stride = pr.q_strides.head;
    p.k_token_stride = pr.k_strides.token;
    p.k_head_stride = pr.k_strides.head;
    p.v_token_stride = pr.v_strides.token;
    p.v_head_stride = pr.v_strides.head;
    p.out_token_stride = pr.out_strides.token;
    p.out_head_stride = pr.out_strides.head;
    p.lse_token_stride = pr.lse_strides.token;
    p.lse_head_stride = pr.lse_strides.head;
    p.row_offsets = d.row_offsets.data();
    p.entries = reinterpret_cast<const int2*>(d.entries.data());
    p.tile_bits = reinterpret_cast<const unsigned long long*>(d.tile_bits.data());
    p.items = reinterpret_cast<const int2*>(d.items.data());
    p.heads = static_cast<int>(pr.heads);
    p.group = static_cast<int>(pr.group);
    p.heads_per_cta = static_cast<int>(lp.heads_per_cta);
    p.queries_per_cta = static_cast<int>(lp.queries_per_cta);
    p.mask_heads = static_cast<int>(d.layout.mask_heads);
    p.dk = static_cast<int>(pr.dk);
    p.dv = static_cast<int>(pr.dv);
    p.kv_splits = static_cast<int>(lp.kv_splits);
    if (variant.softcap > 0.0f) {
      p.softcap_log2 = variant.softcap * cuda::detail::kLog2e;
      p.softcap_inner = variant.scale / variant.softcap;
    } else {
      p.scale_log2 = variant.scale * cuda::detail::kLog2e;
    }
    p.part_out = d.part_out.data();
    p.part_lse = d.part_lse.data();
    p.q_tokens = lp.q_tokens;

    // Paged K/V: the pages each sequence reads, gathered from the (host,
    // already validated) block table into one list. Both lists live in the
    // plan, so a reused plan allocates nothing here after its first call.
    std::vector<std::int32_t>& pages = d.pages_staged;
    std::vector<cuda::detail::DeviceSequence>& seqs = d.sequences_staged;
    pages.clear();
    seqs.resize(pr.sequences.size());
    for (std::size_t b = 0; b < seqs.size(); ++b) {
      const detail::SequenceGeometry& g = pr.sequences[b];
      seqs[b] = {g.q_base,
                 g.k_base,
                 g.v_base,
                 g.out_base,
                 g.lse_base,
                 static_cast<int>(g.q_len),
                 static_cast<int>(g.kv_len),
                 d.layout.row_base[b],
                 lp.q_token_base[b],
                 static_cast<long long>(pages.size())};
      if (paged) {
        const index_t n = (g.kv_len + pr.paging.page_size - 1) / pr.paging.page_size;
        for (index_t i = 0; i < n; ++i) pages.push_back(g.pages[i * pr.paging.table_stride]);
      }
    }
    order_after_last_call(d, stream);
    upload_if_changed(d.sequences.data(), std::span<const cuda::detail::DeviceSequence>(seqs), d.sequences_held, stream,
                      "cudaMemcpyAsync(sequences)");
    if (!variant.sinks.empty()) {
      upload_if_changed(d.sinks.data(), variant.sinks, d.sinks_held, stream, "cudaMemcpyAsync(sinks)");
      p.sinks = d.sinks.data();
    }
    if (!variant.slopes.empty()) {
      upload_if_changed(d.slopes.data(), variant.slopes, d.slopes_held, stream, "cudaMemcpyAsync(ALiBi slopes)");
      p.alibi_slopes = d.slopes.data();
    }
    if (paged) {
      if (d.pages.size() < pages.size()) {  // grows once to the largest cache seen; steady state allocates nothing
        cuda::check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
        d.pages = cuda::DeviceBuffer<std::int32_t>(pages.size());
        d.pages_held.clear();
      }
      upload_if_changed(d.pages.data(), std::span<const std::int32_t>(pages), d.pages_held, stream,
                        "cudaMemcpyAsync(page list)");
      p.pages = d.pages.data();
      p.page_size = static_cast<int>(pr.paging.page_size);
      p.k_page_stride = pr.paging.k_page_stride;
      p.v_page_stride = pr.paging.v_page_stride;
    }
    p.sequences = d.sequences.data();
    if (!lp.items.empty()) {
      cuda::detail::with_hook(p, hook, [&](const auto& h) {
        switch (lp.head_dim) {
          case 64:
            cuda::detail::launch_forward<S, 64>(p, lp, h, stream);
            break;
          case 128:
            cuda::detail::launch_forward<S, 128>(p, lp, h, stream);
            break;
          default:
            cuda::detail::launch_forward<S, 256>(p, lp, h, stream);
            break;
        }
      });
    }
    record_call(d, stream);
  }
};

}  // namespace seqattn::backends
