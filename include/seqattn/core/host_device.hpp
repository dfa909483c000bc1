// SEQATTN_HOST_DEVICE marks a function that both the host and CUDA device
// code may call: `__host__ __device__` when nvcc (or clang in CUDA mode)
// compiles the translation unit, nothing otherwise, so that the same header
// builds with any C++ compiler. seqattn uses it only on the few functions a
// device score hook calls (variants::BiasTensor's element read); a score
// variant of your own that backends::Cuda should run marks its `score` and
// `score_grad` with it (or with __host__ __device__ in a .cu file).
#pragma once

#if defined(__CUDACC__)
#define SEQATTN_HOST_DEVICE __host__ __device__
#else
#define SEQATTN_HOST_DEVICE
#endif
