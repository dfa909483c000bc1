// Catch2 v2/v3 shim: tests include this instead of a Catch2 header and use
// only the subset common to both versions.
#pragma once

#if __has_include(<catch2/catch_test_macros.hpp>)
#include <catch2/catch_approx.hpp>
#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <catch2/generators/catch_generators_range.hpp>
#include <catch2/matchers/catch_matchers_floating_point.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#define SEQATTN_CATCH3 1
#else
#include <catch2/catch.hpp>
#define SEQATTN_CATCH3 0
#endif

// The substring matcher under one name: Catch2 v3 calls it ContainsSubstring,
// v2 Contains.
#if SEQATTN_CATCH3
using Catch::Matchers::ContainsSubstring;
#else
#define ContainsSubstring Catch::Matchers::Contains
#endif
