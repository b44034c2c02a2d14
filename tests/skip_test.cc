// tests/skip.h itself: a case that cannot run is reported as skipped ("SKIPPED: why" on stdout,
// exit 0, which CTest's SKIP_REGULAR_EXPRESSION turns into "skipped"), and fails under
// STRATA_TEST_NO_SKIP=1 without the skip marker in its output. Run by the CTests skip.reported
// and skip.fails_under_no_skip (through tests/config/expect_run.cmake), never on its own: its
// one case always skips.
#define CATCH_CONFIG_MAIN
#include "skip.h"

#include <catch2/catch.hpp>

namespace strata {
namespace {

TEST_CASE("A case that cannot run here says so", "[skip]") {
  testing::skip("this case always skips (tests/skip_test.cc)");
}

}  // namespace
}  // namespace strata
