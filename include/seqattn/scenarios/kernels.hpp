// The scenarios' SIMD kernels through Highway runtime dispatch (link
// seqattn::scenario_kernels, or seqattn::dispatch, which brings it).
//
// src/scenario_kernels.cc compiles scenarios/scenario_kernels-inl.h once per
// Highway target; scenario_kernels() hands out the kernels of the best target
// this CPU runs. dsa.hpp (the lightning indexer) and kascade.hpp (the anchor's
// pooled mass) call them, so a scenario runs the same SIMD code whatever flags
// the calling translation unit was compiled with. This header includes no
// Highway header.
#pragma once

#include <cstdint>

#include "seqattn/core/tensor.hpp"

namespace seqattn::dispatch {

// The kernels of one Highway target (contracts in scenario_kernels-inl.h).
// Keys are laid out in chunks of chunk_width keys, [n / W][d][W], zero-padded;
// n is a multiple of W. A caller fetches the table once and uses its
// chunk_width with its kernels, so one layout always meets the kernel built for it.
struct ScenarioKernels {
  const char* target = "";      // Highway target name, e.g. "AVX2"
  std::int64_t target_bit = 0;  // its Highway target bit (HWY_AVX2, ...)
  index_t chunk_width = 0;      // W: keys per chunk, two vectors
  // DSA indexer, two rows: out_r[j] = sum_h relu(q[r][h] . k_j) w[r][h], j < n;
  // q [2][h][d], w [2][h].
  void (*index_rows)(const float* q, const float* w, index_t h, index_t d, const float* kt, index_t n, float* out0,
                     float* out1) = nullptr;
  // Kascade: p[j] = q . k_j for j < n.
  void (*pool_scores)(const float* q, index_t d, const float* kt, index_t n, float* p) = nullptr;
  // Kascade: p <- exp(p - max p[0, n)) over [0, n), then dst[j] += p[j] / sum for j < before.
  void (*pool_softmax)(float* p, index_t n, index_t before, float* dst) = nullptr;
};

// The kernels of the best target compiled into the library that this CPU
// runs (Highway's chosen target: hwy::SetSupportedTargetsForTest changes it).
ScenarioKernels scenario_kernels();

// The Highway targets compiled into the library, as Highway target bits.
std::int64_t scenario_kernel_targets();

}  // namespace seqattn::dispatch
