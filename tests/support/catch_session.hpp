// Runs a Catch2 session. Catch2 v2 declares Catch::Session only where its
// implementation is compiled, which is one TU (catch_implementation.cpp)
// shared by every test binary: the mains call this instead.
#pragma once

namespace seqattn::testing {

int run_catch_session(int argc, char* argv[]);

}  // namespace seqattn::testing
