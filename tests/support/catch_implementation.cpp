// Catch2's implementation (v2: the single header with CATCH_CONFIG_RUNNER;
// v3 ships it as a library) and the session entry point, compiled once for
// every test binary: the test folders' main, the MPI tests' main and the CUDA
// test's main call run_catch_session.
#if __has_include(<catch2/catch_session.hpp>)
#include <catch2/catch_session.hpp>
#else
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#endif

#include "support/catch_session.hpp"

int seqattn::testing::run_catch_session(int argc, char* argv[]) { return Catch::Session().run(argc, argv); }
