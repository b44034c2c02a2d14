// offload-bench's shared pieces, unit-tested: the link check that fails a run whose figure no
// link could carry, and the JSON writer every workload uses.
#include <absl/strings/match.h>

#include <catch2/catch.hpp>

#include "bench/json.h"
#include "bench/link_check.h"

namespace strata::bench {
namespace {

Row row_with(double runtime_median, Summary baseline, bool nvme = false) {
  Row row;
  row.path = nvme ? "nvme-cpu" : "gpu-cpu";
  row.tensor_bytes = uint64_t{1} << 20;
  row.total_bytes = uint64_t{256} << 20;
  row.repeats = 5;
  row.runtime.median = runtime_median;
  row.runtime.min = runtime_median;
  row.runtime.max = runtime_median;
  row.baseline = baseline;
  row.link_gbps = baseline.max;
  row.nvme_link = nvme;
  return row;
}

}  // namespace

TEST_CASE("The link check trips on a figure no link could carry", "[bench]") {
  // The first GPU run's gpu-cpu: 16,539 GB/s against a 27.7 GB/s copy.
  const Summary link{.median = 27.7, .min = 27.5, .max = 27.9};
  const absl::Status status = check_link(row_with(16539, link));
  REQUIRE(absl::IsFailedPrecondition(status));
  INFO(status.message());
  CHECK(absl::StrContains(status.message(), "gpu-cpu with 1.00 MiB tensors"));
  CHECK(absl::StrContains(status.message(), "16539.00 GB/s"));
  CHECK(absl::StrContains(status.message(), "34.88 GB/s"));  // 27.9 x 1.25: the limit
  CHECK(absl::StrContains(status.message(), "fastest of 5 passes, 27.90 GB/s"));
  // A drive's allowance is wider, and still trips.
  CHECK(absl::IsFailedPrecondition(check_link(row_with(100, {2.9, 2.8, 3.0}, /*nvme=*/true))));
}

TEST_CASE("The link check passes figures at and below the link, and rows without a baseline",
          "[bench]") {
  const Summary link{.median = 20, .min = 19, .max = 21};
  CHECK(check_link(row_with(20, link)).ok());
  CHECK(check_link(row_with(21 * 1.25, link)).ok());  // the noise allowance, exactly
  CHECK(!check_link(row_with(21 * 1.25 + 0.01, link)).ok());
  // A drive the host caches can beat its raw baseline: up to 3x is not proof of a bad timing.
  CHECK(check_link(row_with(60, link, /*nvme=*/true)).ok());
  CHECK(!check_link(row_with(64, link, /*nvme=*/true)).ok());
  Row alone = row_with(1e6, link);
  alone.baseline.reset();  // --no-baseline: nothing to compare with
  CHECK(check_link(alone).ok());
  CHECK(link_limit_gbps(alone) == 0);
}

TEST_CASE("A baseline that spread over its passes widens the allowance", "[bench]") {
  // Passes from 5 to 15 GB/s: a shared machine's memcpy. The link did at least 15; the runtime's
  // passes may have met quieter moments than the baseline's slowest ones.
  const Summary noisy{.median = 10, .min = 5, .max = 15};
  CHECK(link_limit_gbps(row_with(0, noisy)) == Approx(15 * (1 + 1.0)));
  CHECK(check_link(row_with(29, noisy)).ok());
  CHECK(!check_link(row_with(31, noisy)).ok());
  // One pass all but stopped (another tenant): the allowance stays bounded by max / median.
  const Summary stalled{.median = 20, .min = 0.01, .max = 21};
  CHECK(link_limit_gbps(row_with(0, stalled)) == Approx(21 * (1 + 20.99 / 20)));
  CHECK(!check_link(row_with(16539, stalled)).ok());
  const Summary steady{.median = 55, .min = 54.9, .max = 55.2};
  CHECK(link_limit_gbps(row_with(0, steady)) == Approx(55.2 * (1 + kMinLinkNoise)));
}

TEST_CASE("The link's extra passes raise its limit", "[bench]") {
  // Every ABBA pass of the baseline met a busy moment; a recheck found the link's speed.
  Row row = row_with(30, {.median = 10, .min = 9.5, .max = 10.5});
  CHECK(!check_link(row).ok());
  row.link_gbps = 25;  // the fastest of the extra passes
  row.link_rechecks = 3;
  CHECK(link_limit_gbps(row) == Approx(25 * 1.25));
  CHECK(check_link(row).ok());
}

TEST_CASE("The JSON writer escapes strings and formats numbers as the documents do", "[bench]") {
  CHECK(json_quote("a\"b\\c\nd") == "\"a\\\"b\\\\c\\nd\"");
  CHECK(json_strings({"x", "y\"z"}) == "[\"x\", \"y\\\"z\"]");
  CHECK(json_strings({}) == "[]");
  CHECK(gbps_json(1.23456) == "1.235");
  CHECK(seconds_json(0.5) == "0.500000");
  CHECK(ratio_json(1.0 / 3) == "0.3333");
  CHECK(json_general(123456789.0) == "1.23457e+08");
  CHECK(seconds_list_json({0.25, 1}) == "[0.250000, 1.000000]");
  CHECK(json_fixed_list({1.5}, 4) == "[1.5000]");
  CHECK(json_general_list({}) == "[]");
  CHECK(std::string(json_bool(true)) == "true");
}

}  // namespace strata::bench
