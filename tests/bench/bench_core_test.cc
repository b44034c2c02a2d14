// offload-bench's shared pieces, unit-tested: the link check that fails a run whose figure no
// link could carry, the JSON figures every workload rounds, and the train-step plan's arena-aware
// lower bound.
#include <absl/strings/match.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <limits>
#include <numeric>
#include <random>

#include "bench/link_check.h"
#include "bench/train_step/train_step.h"
#include "bench/train_step/train_step_plan.h"
#include "json.h"

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

double plan_compute_seconds(const std::vector<PlannedLayer>& plan) {
  double ms = 0;
  for (const PlannedLayer& l : plan) ms += l.compute_ms;
  return ms * 1e-3;
}

std::vector<uint64_t> plan_footprint(const TrainStepOptions& o) {
  std::vector<uint64_t> footprint;
  for (uint64_t i = 0; i < o.layers; ++i) {
    for (LayerTensor kind : layer_tensors(o)) footprint.push_back(tensor_bytes(o, kind));
  }
  return footprint;
}

// arena_bound's definition, term by term: each cut, each tensor's first access after it found by
// scanning.
double brute_arena_bound(const std::vector<PlannedLayer>& plan,
                         const std::vector<uint64_t>& footprint, uint64_t capacity, double link) {
  double best = 0;
  for (size_t k = 0; k < plan.size(); ++k) {
    double before = 0, after = 0;
    for (size_t j = 0; j < plan.size(); ++j) (j < k ? before : after) += plan[j].compute_ms * 1e-3;
    uint64_t fetch = 0;
    for (size_t t = 0; t < footprint.size(); ++t) {
      bool found = false;
      for (size_t j = k; j < plan.size() && !found; ++j) {
        for (const PlannedAccess& a : plan[j].accesses) {
          if (a.tensor != t) continue;
          if (!a.overwrite) fetch += footprint[t];
          found = true;
          break;
        }
      }
    }
    const double cross = fetch > capacity ? static_cast<double>(fetch - capacity) / link : 0;
    best = std::max(best, before + std::max(after, cross));
  }
  return best;
}

// One schedule the bound must not exceed: every miss fetched when its layer comes, alone on the
// link, nothing overlapped, from an empty arena; room made by evicting any copy the layer does not
// use. Needs every layer's tensors to fit at once.
double serial_on_demand_seconds(const std::vector<PlannedLayer>& plan,
                                const std::vector<uint64_t>& footprint, uint64_t capacity,
                                double link) {
  std::vector<bool> resident(footprint.size(), false);
  uint64_t used = 0;
  double seconds = 0;
  for (const PlannedLayer& l : plan) {
    std::vector<bool> mine(footprint.size(), false);
    for (const PlannedAccess& a : l.accesses) mine[a.tensor] = true;
    for (const PlannedAccess& a : l.accesses) {
      if (resident[a.tensor]) continue;
      for (size_t t = 0; t < footprint.size() && used + footprint[a.tensor] > capacity; ++t) {
        if (resident[t] && !mine[t]) {
          resident[t] = false;
          used -= footprint[t];
        }
      }
      REQUIRE(used + footprint[a.tensor] <= capacity);
      if (!a.overwrite) seconds += static_cast<double>(footprint[a.tensor]) / link;
      resident[a.tensor] = true;
      used += footprint[a.tensor];
    }
    seconds += l.compute_ms * 1e-3;
  }
  return seconds;
}

}  // namespace

TEST_CASE("The default step's arena bound is the optimizer pass's reads beyond the arena",
          "[bench]") {
  const TrainStepOptions o;  // 16 layers of 8 MiB weights and gradients, 2 MiB activations
  const std::vector<PlannedLayer> plan = step_plan(o);
  const std::vector<uint64_t> footprint = plan_footprint(o);
  const uint64_t capacity = o.arena_layers * (2 * o.layer_bytes + o.activation_bytes);
  const double link = 1e9;  // a byte a nanosecond
  const ArenaBound a = arena_bound(plan, footprint, capacity, link);
  // Before the optimizer's first layer: forward and backward computed, and every gradient and
  // weight still to be read, of which the arena holds at most `capacity`.
  const uint64_t reads = o.layers * 2 * o.layer_bytes;
  const double before = 2.0 * static_cast<double>(o.layers) * o.compute_ms * 1e-3;
  const double after = static_cast<double>(o.layers) * o.optimizer_ms * 1e-3;
  CHECK(a.cut == 2 * o.layers);
  CHECK(a.where == "optimizer 0");
  CHECK(a.fetch_after_bytes == reads);
  CHECK(a.cross_after_bytes == reads - capacity);
  CHECK(a.compute_before_seconds == Approx(before).epsilon(1e-12));
  CHECK(a.compute_after_seconds == Approx(after).epsilon(1e-12));
  CHECK(a.seconds == Approx(before + std::max(after, static_cast<double>(reads - capacity) / link))
                         .epsilon(1e-12));
  CHECK(a.seconds == Approx(brute_arena_bound(plan, footprint, capacity, link)).epsilon(1e-12));
  // At this machine's 3 GB/s the old bound is the compute (Belady's 328 MiB fit behind it);
  // the arena bound is a third above it.
  const double fast = 3e9;
  const PagingModel belady = model_paging(plan, footprint, capacity, /*belady=*/true);
  const double old_bound =
      std::max(plan_compute_seconds(plan), static_cast<double>(belady.fetched_bytes) / fast);
  CHECK(old_bound == plan_compute_seconds(plan));
  CHECK(arena_bound(plan, footprint, capacity, fast).seconds > 1.3 * old_bound);
}

TEST_CASE("An arena that holds every tensor leaves the bound at the compute", "[bench]") {
  TrainStepOptions o;
  o.layers = 5;
  const std::vector<PlannedLayer> plan = step_plan(o);
  const std::vector<uint64_t> footprint = plan_footprint(o);
  const uint64_t all = std::accumulate(footprint.begin(), footprint.end(), uint64_t{0});
  for (uint64_t capacity : {all, all + 1, 2 * all}) {
    const ArenaBound a = arena_bound(plan, footprint, capacity, 1e6);
    CHECK(a.seconds == plan_compute_seconds(plan));  // exactly: the old max(compute, 0)
    CHECK(a.cross_after_bytes == 0);
    CHECK(model_paging(plan, footprint, capacity, /*belady=*/true).fetched_bytes == 0);
  }
  // One byte less than the most a cut reads (its activations and gradients are made by
  // overwrites, so that is less than all of them) and the slow link shows.
  const uint64_t most = arena_bound(plan, footprint, 0, 1e-3).fetch_after_bytes;
  CHECK(most < all);
  CHECK(arena_bound(plan, footprint, most, 1e-3).seconds == plan_compute_seconds(plan));
  CHECK(arena_bound(plan, footprint, most - 1, 1e-3).seconds > plan_compute_seconds(plan));
}

TEST_CASE("An overwrite needs no bytes, a write and a read do", "[bench]") {
  // Nothing but overwrites: no transfer even in an arena of nothing.
  std::vector<PlannedLayer> plan = {{"forward", {{0, true, true}, {1, true, true}}, 2, 0},
                                    {"backward", {{1, true, true}, {0, true, true}}, 3, 0}};
  const std::vector<uint64_t> footprint = {4096, 8192};
  ArenaBound a = arena_bound(plan, footprint, 0, 1);
  CHECK(a.seconds == plan_compute_seconds(plan));
  CHECK(a.fetch_after_bytes == 0);
  // Tensor 0 read in layer 0, overwritten in layer 1, read in layer 2: after cut 1 its first
  // access is the overwrite. No compute, so each cut's figure is its transfer alone, and the
  // earliest cut wins a tie.
  plan = {{"forward", {{0, false}}, 0, 0},
          {"backward", {{0, true, true}}, 0, 0},
          {"optimizer", {{0, false}, {1, true, true}}, 0, 0}};
  a = arena_bound(plan, footprint, 0, 1);
  CHECK(a.seconds == 4096);
  CHECK(a.cut == 0);
  plan[0].accesses.clear();  // now cut 0 and 1 see the overwrite first: only cut 2 reads it
  a = arena_bound(plan, footprint, 0, 1);
  CHECK(a.seconds == 4096);
  CHECK(a.cut == 2);
  CHECK(a.where == "optimizer 0");
  plan[1].accesses[0].overwrite = false;  // a kWrite is fetched first: cut 0 reads it again
  a = arena_bound(plan, footprint, 0, 1);
  CHECK(a.cut == 0);
  CHECK(a.fetch_after_bytes == 4096);
}

TEST_CASE("The arena bound matches its definition on random plans", "[bench]") {
  std::mt19937 rng(20261126);
  auto below = [&](uint64_t n) { return std::uniform_int_distribution<uint64_t>(0, n - 1)(rng); };
  constexpr double kLink = 1e6;  // a byte a microsecond
  for (int trial = 0; trial < 300; ++trial) {
    const uint64_t tensors = 1 + below(6);
    std::vector<uint64_t> footprint(tensors);
    for (uint64_t& f : footprint) f = 1 + below(2000);
    std::vector<PlannedLayer> plan(1 + below(8));
    for (size_t k = 0; k < plan.size(); ++k) {
      plan[k].pass = "forward";
      plan[k].layer = k;
      plan[k].compute_ms = static_cast<double>(below(4));
      // A tensor may come twice in a layer (the first access decides whether it is fetched).
      const uint64_t accesses = below(tensors + 2);
      for (uint64_t i = 0; i < accesses; ++i) {
        const uint64_t mode = below(3);  // read, write, overwrite
        plan[k].accesses.push_back({below(tensors), mode > 0, mode == 2});
      }
    }
    const uint64_t all = std::accumulate(footprint.begin(), footprint.end(), uint64_t{0});
    uint64_t largest_layer = 0;
    for (const PlannedLayer& l : plan) {
      uint64_t bytes = 0;
      std::vector<bool> counted(tensors, false);
      for (const PlannedAccess& a : l.accesses) {
        if (!counted[a.tensor]) bytes += footprint[a.tensor];
        counted[a.tensor] = true;
      }
      largest_layer = std::max(largest_layer, bytes);
    }
    std::vector<uint64_t> capacities = {0, all, all + 7};
    for (int i = 0; i < 6; ++i) capacities.push_back(below(all + 1));
    std::sort(capacities.begin(), capacities.end());
    double previous = 0;
    for (size_t i = 0; i < capacities.size(); ++i) {
      const uint64_t capacity = capacities[i];
      INFO("trial " << trial << ", capacity " << capacity);
      const ArenaBound a = arena_bound(plan, footprint, capacity, kLink);
      CHECK(a.seconds == Approx(brute_arena_bound(plan, footprint, capacity, kLink)).margin(1e-12));
      CHECK(a.seconds >= plan_compute_seconds(plan));
      // The binding cut's own figures give the bound.
      REQUIRE(a.cut < plan.size());
      CHECK(a.cross_after_bytes ==
            (a.fetch_after_bytes > capacity ? a.fetch_after_bytes - capacity : 0));
      CHECK(a.seconds == Approx(a.compute_before_seconds +
                                std::max(a.compute_after_seconds,
                                         static_cast<double>(a.cross_after_bytes) / kLink))
                             .margin(1e-12));
      if (i > 0) CHECK(a.seconds <= previous);  // more room, never a higher bound
      previous = a.seconds;
      // Sound: a schedule that exists takes no less.
      if (capacity >= largest_layer) {
        CHECK(a.seconds <= serial_on_demand_seconds(plan, footprint, capacity, kLink) + 1e-12);
      }
    }
  }
}

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

TEST_CASE("The JSON figures are rounded as the documents need, non-finite ones null", "[bench]") {
  CHECK(json_line(gbps_json(1.23456)) == "1.235");
  CHECK(json_line(seconds_json(0.5)) == "0.5");
  CHECK(json_line(ratio_json(1.0 / 3)) == "0.3333");
  CHECK(json_line(json_fixed(2.5, 0)) == "3");  // an integer, rounded half away from zero
  CHECK(json_line(json_general(123456789.0)) == "123457000.0");
  CHECK(json_line(json_general(1.234567e-7)) == "1.23457e-07");
  CHECK(json_line(seconds_list_json({0.25, 1.0000004})) == "[0.25,1.0]");
  CHECK(json_line(json_fixed_list({1.23456}, 4)) == "[1.2346]");
  CHECK(json_line(json_general_list({})) == "[]");
  CHECK(seconds_json(std::numeric_limits<double>::quiet_NaN()).is_null());
  CHECK(json_general(-std::numeric_limits<double>::infinity()).is_null());
  // Keys stay in the order written; strings are escaped; bytes that are not UTF-8 do not fail
  // the document.
  const Json doc{{"b", "a\"b\\c\nd"}, {"a", true}, {"path", "\xff"}};
  CHECK(json_line(doc) == R"({"b":"a\"b\\c\nd","a":true,"path":")"
                          "\xef\xbf\xbd\"}");
}

}  // namespace strata::bench
