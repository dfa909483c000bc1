// Catch2 v2's implementation, compiled once for every test binary (the test
// folders' main and the MPI tests' main link it). Catch2 v3 ships it as a
// library, so this TU is empty there.
#if !__has_include(<catch2/catch_session.hpp>)
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#endif
