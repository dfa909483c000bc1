# Compile options for seqattn's own targets (tests, examples, benchmarks and
# the dispatch library). None of this reaches consumers of seqattn::seqattn.

# Highway 1.0.3 picks its static target from the compile flags, with traps:
# no flags -> SCALAR/EMU128, -march=x86-64-v3 alone -> SSSE3 (AVX2 also wants
# AES+PCLMUL), -march=native on AVX-512 VNNI machines -> #error unless
# HWY_WANT_AVX3_DL. The default below gives AVX2 on any x86-64-v3 machine.
if(SEQATTN_SIMD_FLAGS STREQUAL "" AND CMAKE_SYSTEM_PROCESSOR MATCHES "^(x86_64|AMD64|amd64)$")
  set(SEQATTN_SIMD_FLAGS "-march=x86-64-v3 -DHWY_DISABLE_PCLMUL_AES")
endif()
separate_arguments(_seqattn_simd_flags UNIX_COMMAND "${SEQATTN_SIMD_FLAGS}")
# Only when seqattn is the top-level project: as a subproject it builds nothing
# of its own by default, and the message would read as if it set the parent's flags.
if(PROJECT_IS_TOP_LEVEL)
  message(STATUS "seqattn: SIMD flags for seqattn's own tests, examples and benchmarks: ${SEQATTN_SIMD_FLAGS}")
endif()

add_library(seqattn_project_options INTERFACE)
target_compile_options(seqattn_project_options INTERFACE -Wall -Wextra -Wpedantic ${_seqattn_simd_flags})
if(SEQATTN_WARNINGS_AS_ERRORS)
  target_compile_options(seqattn_project_options INTERFACE -Werror)
endif()
if(NOT SEQATTN_SANITIZE STREQUAL "")
  target_compile_options(seqattn_project_options INTERFACE -fsanitize=${SEQATTN_SANITIZE} -fno-sanitize-recover=all
                                                           -fno-omit-frame-pointer)
  target_link_options(seqattn_project_options INTERFACE -fsanitize=${SEQATTN_SANITIZE})
  # GCC 12 reports -Wmaybe-uninitialized falsely under sanitizer
  # instrumentation (GCC bug 105562 and relatives); the release build keeps it.
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    target_compile_options(seqattn_project_options INTERFACE -Wno-maybe-uninitialized)
  endif()
endif()
target_link_libraries(seqattn_project_options INTERFACE seqattn::seqattn)
