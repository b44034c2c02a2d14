// A test case that cannot run on this machine says so instead of passing: skip() prints
// "SKIPPED: <why>", which CTest's SKIP_REGULAR_EXPRESSION ("SKIPPED:") reports as skipped, and
// the case returns at once (Catch2 v2 has no SKIP). Every C++ skip goes through here.
//
// STRATA_TEST_NO_SKIP=1 turns every skip into a failure naming why the case could not run: for
// a run on a machine that must run everything (a GPU box with NCCL), where a skipped case means
// the machine or the build is not what it should be. tests/python/conftest.py reads the same
// variable for pytest's skips. CI does not set it (its machines have no GPU).
#pragma once

#include <catch2/catch.hpp>
#include <cstdlib>
#include <iostream>
#include <string_view>

namespace strata::testing {

// True under STRATA_TEST_NO_SKIP set to anything but "" or "0".
inline bool skips_fail() {
  const char* value = std::getenv("STRATA_TEST_NO_SKIP");
  return value != nullptr && *value != '\0' && std::string_view(value) != "0";
}

// Reports the case as skipped because of `why` (then return from it), or fails it under
// STRATA_TEST_NO_SKIP. The failure's words must not contain the skip marker: CTest would
// report the failed case as skipped.
inline void skip(std::string_view why) {
  if (skips_fail()) {
    FAIL("this case could not run, and STRATA_TEST_NO_SKIP makes that a failure: " << why);
  }
  std::cout << "SKIPPED: " << why << std::endl;
}

}  // namespace strata::testing
