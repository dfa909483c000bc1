// Settings seqattn gives Highway before any Highway header is read, so that
// the flags users actually pass just work. Every seqattn header that includes
// <hwy/highway.h> includes this first. A TU that includes Highway itself
// before seqattn has made Highway's choices already; define the macros below
// yourself there.
//
// -march=native (or -march=sapphirerapids, icelake-server, ...) on a CPU with
// AVX-512 VNNI/VBMI2 makes AVX3_DL the best baseline target, and Highway
// 1.0.3 then stops with `#error "Logic error: best baseline should be
// included in dynamic targets"` unless AVX3_DL is opted in: we opt in when
// the compiler targets AVX-512. It only widens the set of targets a
// foreach_target.h TU may build; the static target is the same.
#pragma once

#if defined(__AVX512F__) && !defined(HWY_WANT_AVX3_DL) && !defined(SEQATTN_NO_HWY_CONFIG)
#define HWY_WANT_AVX3_DL
#endif

// -march=x86-64-v3 (AVX2, FMA, BMI2 but no AES/PCLMUL) makes Highway 1.0.3
// fall back to SSSE3, because its AVX2 target also requires AES and CLMUL,
// which seqattn never uses: drop that requirement.
#if defined(__AVX2__) && defined(__FMA__) && defined(__BMI2__) && !(defined(__PCLMUL__) && defined(__AES__)) && \
    !defined(HWY_DISABLE_PCLMUL_AES) && !defined(SEQATTN_NO_HWY_CONFIG)
#define HWY_DISABLE_PCLMUL_AES
#endif
