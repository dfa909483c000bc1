// Test main for the MPI tests: every rank runs the same Catch2 session, in
// the same order, between MPI_Init and MPI_Finalize. The exit code is the
// worst over the ranks, so mpirun (and CTest) fail when any rank fails.
#include <cstdio>
#include <mpi.h>

#include "seqattn/core/simd.hpp"

#include "support/catch_session.hpp"

int main(int argc, char* argv[]) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (rank == 0) {
    std::fprintf(stderr, "seqattn mpi tests: %d ranks, Highway static target %s\n", size,
                 seqattn::static_simd_target());
  }
  int failed = seqattn::testing::run_catch_session(argc, argv);
  int worst = 0;
  MPI_Allreduce(&failed, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return worst != 0 ? 1 : 0;
}
