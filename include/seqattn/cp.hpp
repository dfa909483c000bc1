// Context parallelism: ring attention over MPI (namespace seqattn::cp).
//
// Not part of seqattn.hpp, because it needs <mpi.h>: include this header and
// link MPI (CMake: find_package(MPI COMPONENTS CXX), MPI::MPI_CXX).
#pragma once

#include "seqattn/cp/layout.hpp"          // IWYU pragma: export
#include "seqattn/cp/ring_attention.hpp"  // IWYU pragma: export
