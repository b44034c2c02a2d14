// AccessSchedule's eviction side: Belady and LRU victims, next_use, forget(), a moved schedule;
// next_use and choose_victim against a brute force over random traces.
#include <algorithm>
#include <catch2/catch.hpp>
#include <limits>
#include <optional>
#include <random>
#include <vector>

#include "access_schedule_fixture.h"
#include "strata/store/access_schedule.h"

namespace strata {
namespace {

using testing::acquire_all;
using testing::cpu;
using testing::due_tensors;
using testing::gpu;
using testing::gpu_order;
using testing::Tensors;

TEST_CASE("Belady: the victim is the candidate used furthest in the future", "[schedule]") {
  // A B C A D B
  AccessSchedule schedule;
  schedule.set_order(gpu_order({1, 2, 3, 1, 4, 2}));
  const std::vector<TensorId> all{1, 2, 3, 4};
  struct Expected {
    uint64_t a, b, c, d;
    TensorId victim;
  };
  // Before each acquire of the trace, then after the last (wrapping to the next step).
  const std::vector<Expected> expected{
      {1, 2, 3, 5, 4}, {3, 1, 2, 4, 4}, {2, 4, 1, 3, 2}, {1, 3, 6, 2, 3},
      {3, 2, 5, 1, 3}, {2, 1, 4, 6, 4}, {1, 2, 3, 5, 4},
  };
  const auto order = gpu_order({1, 2, 3, 1, 4, 2});
  for (size_t i = 0; i < expected.size(); ++i) {
    INFO("position " << i);
    const Expected& e = expected[i];
    CHECK(schedule.next_use(1) == e.a);
    CHECK(schedule.next_use(2) == e.b);
    CHECK(schedule.next_use(3) == e.c);
    CHECK(schedule.next_use(4) == e.d);
    CHECK(schedule.choose_victim(all) == e.victim);
    if (i < order.size()) schedule.on_acquire(order[i]);
  }

  // Never used again beats any use; among those, the lower id.
  const std::vector<TensorId> with_unused{1, 2, 50};
  CHECK(schedule.choose_victim(with_unused) == 50);
  const std::vector<TensorId> two_unused{51, 3, 50};
  CHECK(schedule.choose_victim(two_unused) == 50);
}

TEST_CASE("Without a trace the victim is the least recently acquired", "[schedule]") {
  AccessSchedule schedule;
  acquire_all(schedule, gpu_order({3, 1, 2}));
  const std::vector<TensorId> three{1, 2, 3};
  CHECK(schedule.choose_victim(three) == 3);
  schedule.on_acquire(cpu(3));  // any tier counts
  CHECK(schedule.choose_victim(three) == 1);
  const std::vector<TensorId> with_new{1, 2, 3, 7};
  CHECK(schedule.choose_victim(with_new) == 7);  // never acquired: the oldest
  const std::vector<TensorId> both_new{8, 7};
  CHECK(schedule.choose_victim(both_new) == 7);
}

TEST_CASE("forget() drops a tensor from the trace and the recency data", "[schedule]") {
  SECTION("trace entries") {
    AccessSchedule schedule;
    schedule.set_order(gpu_order({1, 2, 3, 1, 4, 2}));
    acquire_all(schedule, gpu_order({1, 2}));
    schedule.forget(3);
    CHECK(schedule.stats().trace_length == 5);
    CHECK_FALSE(schedule.next_use(3).has_value());
    CHECK(schedule.next_use(1) == 1);
    CHECK(schedule.next_use(4) == 2);
    CHECK(schedule.next_use(2) == 3);
    acquire_all(schedule, gpu_order({1, 4, 2, 1, 2}));
    CHECK(schedule.stats().matched == 7);
    CHECK(schedule.stats().realigned == 0);
  }
  SECTION("the entry at the cursor, last in the trace") {
    AccessSchedule schedule;
    schedule.set_order(gpu_order({1, 2, 3}));
    acquire_all(schedule, gpu_order({1, 2}));
    schedule.forget(3);
    CHECK(schedule.next_use(1) == 1);
    schedule.forget(1);
    schedule.forget(2);
    CHECK_FALSE(schedule.has_trace());
    CHECK(schedule.due(8).empty());
  }
  SECTION("recency") {
    AccessSchedule schedule;
    acquire_all(schedule, gpu_order({6, 5}));
    const std::vector<TensorId> both{5, 6};
    CHECK(schedule.choose_victim(both) == 6);
    schedule.forget(5);
    CHECK(schedule.choose_victim(both) == 5);
  }
  SECTION("learned leads, since the store reuses ids") {
    AccessSchedule schedule;
    schedule.set_order(gpu_order({1, 2, 3, 4, 5}));
    acquire_all(schedule, gpu_order({1, 2, 3, 4}));
    schedule.on_late(gpu(4));
    schedule.set_order(gpu_order({1, 2, 3, 4, 5}));
    CHECK(due_tensors(schedule) == Tensors{1, 2, 4});
    schedule.forget(4);
    schedule.set_order(gpu_order({1, 2, 3, 4, 5}));
    CHECK(due_tensors(schedule) == Tensors{1, 2});
  }
}

TEST_CASE("next_use counts positions from now, any tier, wrapping", "[schedule]") {
  AccessSchedule schedule;
  schedule.set_order({gpu(1), cpu(2), gpu(3), gpu(4)});
  CHECK(schedule.next_use(2) == 2);
  acquire_all(schedule, {gpu(1), cpu(2), gpu(3)});
  CHECK(schedule.next_use(4) == 1);
  CHECK(schedule.next_use(1) == 2);  // in the next step
  CHECK(schedule.next_use(3) == 4);  // just used: next step's
  CHECK_FALSE(schedule.next_use(5).has_value());
}

TEST_CASE("A moved schedule keeps its trace", "[schedule]") {
  AccessSchedule first;
  first.set_order(gpu_order({1, 2}));
  AccessSchedule second(std::move(first));
  CHECK(second.has_trace());
  AccessSchedule third;
  third = std::move(second);
  CHECK(third.next_use(2) == 2);
}

// Brute force over the trace: the model the schedule must agree with.
struct Model {
  std::vector<Access> trace;
  uint32_t window = 0;
  size_t cursor = 0;
  uint64_t position = 0;

  void acquire(Access a) {
    const size_t n = trace.size();
    const size_t reach = std::min<size_t>(window, n - 1);
    std::optional<size_t> ahead, behind;
    for (size_t k = 0; k <= reach && !ahead; ++k) {
      if (trace[(cursor + k) % n] == a) ahead = k;
    }
    for (size_t k = 1; k <= reach && !behind; ++k) {
      if (trace[(cursor + n - k) % n] == a) behind = k;
    }
    if (ahead && (!behind || *ahead <= *behind)) {
      cursor = (cursor + *ahead + 1) % n;
      position += *ahead + 1;
    } else if (behind) {
      cursor = (cursor + n - *behind + 1) % n;
      position += 1;
    }
  }
  std::optional<uint64_t> next_use(TensorId t) const {
    for (size_t d = 1; d <= trace.size(); ++d) {
      if (trace[(cursor + d - 1) % trace.size()].tensor == t) return d;
    }
    return std::nullopt;
  }
  TensorId victim(const std::vector<TensorId>& candidates) const {
    TensorId best = candidates[0];
    uint64_t best_distance = 0;
    bool first = true;
    for (const TensorId t : candidates) {
      const uint64_t d = next_use(t).value_or(std::numeric_limits<uint64_t>::max());
      if (first || d > best_distance || (d == best_distance && t < best)) {
        best = t;
        best_distance = d;
        first = false;
      }
    }
    return best;
  }
};

TEST_CASE("next_use and choose_victim agree with a brute force over random traces", "[schedule]") {
  std::mt19937 rng(20240611);
  const auto uniform = [&](size_t lo, size_t hi) {
    return std::uniform_int_distribution<size_t>(lo, hi)(rng);
  };
  const auto random_access = [&]() {
    return Access{static_cast<TensorId>(uniform(0, 11)),
                  uniform(0, 3) == 0 ? TierKind::kCpu : TierKind::kGpu};
  };
  for (int round = 0; round < 300; ++round) {
    Model model;
    model.window = static_cast<uint32_t>(uniform(0, 12));
    for (size_t i = uniform(1, 40); i > 0; --i) model.trace.push_back(random_access());
    AccessSchedule schedule({.initial_lead = 2, .realign_window = model.window});
    schedule.set_order(model.trace);

    for (int step = 0; step < 60; ++step) {
      INFO("round " << round << " step " << step);
      // Mostly the expected access, sometimes anything: exercises every realignment path.
      const Access a = uniform(0, 2) == 0 ? random_access() : model.trace[model.cursor];
      schedule.on_acquire(a);
      model.acquire(a);
      REQUIRE(schedule.position() == model.position);
      for (TensorId t = 0; t < 13; ++t) REQUIRE(schedule.next_use(t) == model.next_use(t));
      std::vector<TensorId> candidates;
      for (size_t i = uniform(1, 6); i > 0; --i) {
        candidates.push_back(static_cast<TensorId>(uniform(0, 13)));
      }
      REQUIRE(schedule.choose_victim(candidates) == model.victim(candidates));
      const std::vector<DueAccess> due = schedule.due(100);
      const size_t n = model.trace.size();
      REQUIRE(due.size() == std::min<size_t>(2, n));
      for (size_t d = 1; d <= due.size(); ++d) {
        REQUIRE(due[d - 1].access == model.trace[(model.cursor + d - 1) % n]);
        REQUIRE(due[d - 1].position == model.position + d - 1);
      }
    }
  }
}

}  // namespace
}  // namespace strata
