// What the MPI tests share: this process's rank and the number of ranks in
// MPI_COMM_WORLD, and the attention tests' helpers (random_tensor).
#pragma once

#include <mpi.h>

#include "attention/attention_test_support.hpp"

namespace seqattn::testing {

inline int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

inline int world_size() {
  int s = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  return s;
}

}  // namespace seqattn::testing
