# The CUDA backend (include/seqattn/backends/cuda.cuh): option
# SEQATTN_BUILD_CUDA, the CUDA language, and seqattn_cuda_options, the compile
# options of seqattn's own .cu targets (the GPU test, benchmark and example).
# Included from the top-level CMakeLists.txt after SeqattnProjectFlags.
#
# The library itself needs none of this: it stays header-only, and consumers
# compile cuda.cuh with their own nvcc settings. The host-only planning
# headers (backends/device_mask.hpp, backends/cuda/*.hpp) and their test
# (tests/cuda/*.cpp) build with the C++ compiler whatever this option says.

# On by default when seqattn is the top-level project, builds tests, examples,
# benchmarks or the Python package's CUDA module (SEQATTN_BUILD_PYTHON, unless
# SEQATTN_PYTHON_CUDA is OFF), is not sanitized (the asan/tsan/fuzz presets
# turn it off too) and an nvcc is found: on PATH, in CUDACXX, or in
# /usr/local/cuda/bin, which non-login shells (CI) often lack on PATH.
set(_seqattn_cuda_default OFF)
set(_seqattn_cuda_wanted OFF)
set(_seqattn_python_cuda_wanted OFF)
if(SEQATTN_BUILD_PYTHON AND (NOT DEFINED SEQATTN_PYTHON_CUDA OR SEQATTN_PYTHON_CUDA))
  set(_seqattn_python_cuda_wanted ON)
endif()
if(DEFINED SEQATTN_BUILD_CUDA)
  set(_seqattn_cuda_wanted ${SEQATTN_BUILD_CUDA})
elseif(PROJECT_IS_TOP_LEVEL
       AND SEQATTN_SANITIZE STREQUAL ""
       AND (SEQATTN_BUILD_TESTS
            OR SEQATTN_BUILD_EXAMPLES
            OR SEQATTN_BUILD_BENCHMARKS
            OR _seqattn_python_cuda_wanted))
  set(_seqattn_cuda_wanted ON)
endif()
if(_seqattn_cuda_wanted
   AND NOT DEFINED CMAKE_CUDA_COMPILER
   AND "$ENV{CUDACXX}" STREQUAL "")
  find_program(
    _seqattn_nvcc nvcc
    PATHS /usr/local/cuda/bin
    NO_CACHE)
  if(_seqattn_nvcc)
    # Read by check_language (a child CMake) and enable_language below.
    set(ENV{CUDACXX} "${_seqattn_nvcc}")
  endif()
endif()
if(_seqattn_cuda_wanted AND NOT DEFINED SEQATTN_BUILD_CUDA)
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    set(_seqattn_cuda_default ON)
  endif()
endif()
option(SEQATTN_BUILD_CUDA "Build the CUDA backend's GPU test, benchmark and example (needs nvcc)"
       ${_seqattn_cuda_default})
if(NOT SEQATTN_BUILD_CUDA)
  return()
endif()

# Compute capability 8.0 (A100) and 9.0a (H100/H200, with the Hopper-only
# instructions of the wgmma prefill kernel): SASS for both plus their PTX.
# Each architecture costs a full device compilation, so keep the list short;
# override with -DCMAKE_CUDA_ARCHITECTURES=... or CUDAARCHS.
# The "a" suffix was checked with CMake 3.25; older versions get 80;90 (no
# wgmma kernel).
if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES AND "$ENV{CUDAARCHS}" STREQUAL "")
  set(_seqattn_hopper_arch 90a)
  if(CMAKE_VERSION VERSION_LESS 3.25)
    set(_seqattn_hopper_arch 90)
  endif()
  set(CMAKE_CUDA_ARCHITECTURES
      "80;${_seqattn_hopper_arch}"
      CACHE STRING "CUDA architectures for seqattn's CUDA targets")
endif()
# nvcc compiles host code with the project's C++ compiler, not whatever g++ is
# first on PATH.
if(NOT CMAKE_CUDA_HOST_COMPILER AND "$ENV{CUDAHOSTCXX}" STREQUAL "")
  # check_language leaves an empty normal variable, which would hide the cache entry.
  unset(CMAKE_CUDA_HOST_COMPILER)
  set(CMAKE_CUDA_HOST_COMPILER
      "${CMAKE_CXX_COMPILER}"
      CACHE FILEPATH "Host compiler for nvcc (default: CMAKE_CXX_COMPILER)")
endif()
enable_language(CUDA)
find_package(CUDAToolkit REQUIRED)
# C++20 for .cu sources. CMake before 3.26 has no CUDA20 dialect for nvcc
# (Debian 12 ships 3.25): the flag is then passed by seqattn_cuda_options.
if(DEFINED CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
  set(CMAKE_CUDA_STANDARD 20)
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  set(CMAKE_CUDA_EXTENSIONS OFF)
  set(_seqattn_cuda_std_flag "")
else()
  set(_seqattn_cuda_std_flag -std=c++20)
endif()

# The Hopper prefill kernel (backends/cuda/wgmma_forward_kernel.cuh) exists
# only in sm_90a code: with 90a among the architectures, the CUDA targets
# define SEQATTN_CUDA_WGMMA (backends/cuda.cuh) and prefill on a compute
# capability 9.x device takes it.
set(_seqattn_cuda_wgmma OFF)
foreach(_arch IN LISTS CMAKE_CUDA_ARCHITECTURES)
  if(_arch MATCHES "^90a")
    set(_seqattn_cuda_wgmma ON)
  endif()
endforeach()

if(PROJECT_IS_TOP_LEVEL)
  message(
    STATUS
      "seqattn: CUDA ${CMAKE_CUDA_COMPILER_VERSION} (${CMAKE_CUDA_COMPILER}), architectures ${CMAKE_CUDA_ARCHITECTURES}, host compiler ${CMAKE_CUDA_HOST_COMPILER}, wgmma kernel ${_seqattn_cuda_wgmma}"
  )
endif()

# Options for seqattn's own .cu sources, the CUDA counterpart of
# seqattn_project_options (whose bare GCC flags nvcc would reject).
#   - host warnings through -Xcompiler; not -Wpedantic: g++ would flag every
#     line marker in nvcc's generated host code ("style of line directive is
#     a GCC extension");
#   - --Werror=all-warnings makes nvcc's own (EDG front end, ptxas)
#     diagnostics errors;
#   - the SIMD flags reach the host compiler (-march) and both passes (-D), so
#     that headers pulling Highway (seqattn/attention.hpp) see the same static
#     target as the C++ tests;
#   - diagnostic 1675 ("unrecognized GCC pragma"): the EDG front end does not
#     know `#pragma GCC unroll` (backends/highway-inl.h); g++ still does.
#   - the CUDA runtime: shared for the tests, benchmarks and examples; static
#     in a Python build, so that seqattn._cuda needs no libcudart at run time.
add_library(seqattn_cuda_options INTERFACE)
if(SEQATTN_BUILD_PYTHON)
  target_link_libraries(seqattn_cuda_options INTERFACE seqattn::seqattn CUDA::cudart_static)
else()
  target_link_libraries(seqattn_cuda_options INTERFACE seqattn::seqattn CUDA::cudart)
endif()
set(_seqattn_cuda_flags ${_seqattn_cuda_std_flag} -Xcompiler=-Wall -Xcompiler=-Wextra --diag-suppress=1675)
if(SEQATTN_WARNINGS_AS_ERRORS)
  list(APPEND _seqattn_cuda_flags -Xcompiler=-Werror --Werror=all-warnings)
endif()
foreach(_flag IN LISTS _seqattn_simd_flags)
  if(_flag MATCHES "^-[DU]")
    list(APPEND _seqattn_cuda_flags ${_flag})
  else()
    list(APPEND _seqattn_cuda_flags -Xcompiler=${_flag})
  endif()
endforeach()
target_compile_options(seqattn_cuda_options INTERFACE "$<$<COMPILE_LANGUAGE:CUDA>:${_seqattn_cuda_flags}>")
if(_seqattn_cuda_wgmma)
  target_compile_definitions(seqattn_cuda_options INTERFACE "$<$<COMPILE_LANGUAGE:CUDA>:SEQATTN_CUDA_WGMMA>")
endif()

# The CUDA kernels compiled once per configuration (storage type x head dim x
# built-in score hook) for this repository's tests, benchmarks and examples, instead
# of in each of them: each .cu that links seqattn_cuda_instances declares
# them extern (SEQATTN_CUDA_SEPARATE_INSTANCES, backends/cuda.cuh). The
# instance files are generated here, one small TU each, so that the device
# compilations run in parallel.

# Rewritten only when the text changes, so that a reconfigure does not recompile.
function(_seqattn_write_if_changed file text)
  set(old "")
  if(EXISTS "${file}")
    file(READ "${file}" old)
  endif()
  if(NOT old STREQUAL text)
    file(WRITE "${file}" "${text}")
  endif()
endfunction()

# SEQATTN_CUDA_INSTANCE_FILES: "configuration" (the default) writes one file
# per configuration, which many cores compile in parallel; "type" one file per
# storage type holding all of its configurations. Every file costs nvcc about
# 8 s of front-end work (cudafe++, cicc and g++ parsing the headers) before
# any kernel code, so on two cores a compile-only build (90a-virtual,
# -Xcicc -O0: little kernel code generation) is about twice as fast with
# "type"; scripts/test.sh (release) and scripts/test-python.sh use it where
# there is no GPU.
set(SEQATTN_CUDA_INSTANCE_FILES
    "configuration"
    CACHE STRING "How the CUDA kernel instances are split into files: configuration or type")
set_property(CACHE SEQATTN_CUDA_INSTANCE_FILES PROPERTY STRINGS configuration type)
if(NOT SEQATTN_CUDA_INSTANCE_FILES MATCHES "^(configuration|type)$")
  message(FATAL_ERROR "SEQATTN_CUDA_INSTANCE_FILES must be configuration or type, got '${SEQATTN_CUDA_INSTANCE_FILES}'")
endif()
set(_seqattn_cuda_instance_header
    "#define SEQATTN_CUDA_INSTANCE_TU\n#include \"seqattn/backends/cuda.cuh\"\n")
set(_seqattn_cuda_instance_sources "")
foreach(_type bfloat16 float16)
  set(_type_text "")
  foreach(_dim 64 128 256)
    # The built-in score hooks (backends/cuda/score_hooks.cuh): plain scores
    # and softcap-then-ALiBi.
    foreach(_hook plain softcap_alibi)
      if(_hook STREQUAL "plain")
        set(_hook_type seqattn::cuda::detail::PlainScores)
      else()
        set(_hook_type seqattn::cuda::detail::SoftcapAlibiScores)
      endif()
      set(_instance
          "\ntemplate void seqattn::cuda::detail::launch_forward<seqattn::${_type}, ${_dim}, ${_hook_type}>(\n    const seqattn::cuda::detail::ForwardParams<seqattn::${_type}>&, const seqattn::cuda::LaunchPlan&, const ${_hook_type}&, cudaStream_t);\n"
      )
      string(APPEND _type_text "${_instance}")
      if(SEQATTN_CUDA_INSTANCE_FILES STREQUAL "configuration")
        set(_file "${PROJECT_BINARY_DIR}/cuda_instances/launch_${_type}_d${_dim}_${_hook}.cu")
        _seqattn_write_if_changed(
          "${_file}"
          "// Generated by cmake/SeqattnCuda.cmake: one CUDA kernel configuration.\n${_seqattn_cuda_instance_header}${_instance}"
        )
        list(APPEND _seqattn_cuda_instance_sources "${_file}")
      endif()
      # The backward pass: head dims up to 128.
      if(_dim LESS_EQUAL 128)
        set(_instance
            "\ntemplate void seqattn::cuda::detail::launch_backward<seqattn::${_type}, ${_dim}, ${_hook_type}>(\n    const seqattn::cuda::detail::BackwardParams<seqattn::${_type}>&, const seqattn::cuda::BackwardLaunchPlan&, const ${_hook_type}&, cudaStream_t);\n"
        )
        string(APPEND _type_text "${_instance}")
        if(SEQATTN_CUDA_INSTANCE_FILES STREQUAL "configuration")
          set(_file "${PROJECT_BINARY_DIR}/cuda_instances/backward_${_type}_d${_dim}_${_hook}.cu")
          _seqattn_write_if_changed(
            "${_file}"
            "// Generated by cmake/SeqattnCuda.cmake: one CUDA kernel configuration.\n${_seqattn_cuda_instance_header}${_instance}"
          )
          list(APPEND _seqattn_cuda_instance_sources "${_file}")
        endif()
      endif()
    endforeach()
  endforeach()
  if(SEQATTN_CUDA_INSTANCE_FILES STREQUAL "type")
    set(_file "${PROJECT_BINARY_DIR}/cuda_instances/instances_${_type}.cu")
    _seqattn_write_if_changed(
      "${_file}"
      "// Generated by cmake/SeqattnCuda.cmake: every CUDA kernel configuration of one storage type.\n${_seqattn_cuda_instance_header}${_type_text}"
    )
    list(APPEND _seqattn_cuda_instance_sources "${_file}")
  endif()
endforeach()
add_library(seqattn_cuda_instances OBJECT ${_seqattn_cuda_instance_sources})
if(SEQATTN_BUILD_PYTHON)
  # Linked into seqattn._cuda, a shared module.
  set_target_properties(seqattn_cuda_instances PROPERTIES POSITION_INDEPENDENT_CODE ON)
endif()
target_link_libraries(seqattn_cuda_instances PUBLIC seqattn_cuda_options)
target_compile_definitions(seqattn_cuda_instances PUBLIC SEQATTN_CUDA_SEPARATE_INSTANCES)
