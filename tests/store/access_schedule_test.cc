// AccessSchedule's prefetch side: recording and re-recording the trace, realignment, due
// prefetches and their leads, upcoming accesses. The eviction side is in
// access_schedule_eviction_test.cc.
#include "strata/store/access_schedule.h"

#include <catch2/catch.hpp>
#include <optional>
#include <vector>

#include "access_schedule_fixture.h"

namespace strata {
namespace {

using testing::acquire_all;
using testing::cpu;
using testing::due_tensors;
using testing::gpu;
using testing::gpu_order;
using testing::run_step;
using testing::Tensors;

TEST_CASE("The first step records the trace, matching steps keep it", "[schedule]") {
  AccessSchedule schedule;
  CHECK_FALSE(schedule.has_trace());
  CHECK(schedule.due(8).empty());
  CHECK_FALSE(schedule.next_use(1).has_value());

  const auto order = gpu_order({1, 2, 3, 4});
  schedule.step_begin();
  acquire_all(schedule, order);
  CHECK_FALSE(schedule.has_trace());  // recorded only at step_end
  CHECK(schedule.due(8).empty());
  schedule.step_end();

  REQUIRE(schedule.has_trace());
  AccessScheduleStats stats = schedule.stats();
  CHECK(stats.trace_length == 4);
  CHECK_FALSE(stats.given_order);
  CHECK(schedule.next_use(1) == 1);
  CHECK(schedule.next_use(4) == 4);
  CHECK(due_tensors(schedule) == Tensors{1, 2});

  run_step(schedule, order);
  run_step(schedule, order);
  stats = schedule.stats();
  CHECK(stats.steps == 3);
  CHECK(stats.acquires == 12);
  CHECK(stats.matched == 8);
  CHECK(stats.realigned == 0);
  CHECK(stats.unknown == 0);
  CHECK(stats.rerecords == 0);
  CHECK(stats.trace_length == 4);
  CHECK(schedule.position() == 12);
}

TEST_CASE("set_order prefetches from the first step, with no warm-up", "[schedule]") {
  AccessSchedule schedule;
  schedule.set_order(gpu_order({1, 2, 3, 4}));
  REQUIRE(schedule.has_trace());
  CHECK(schedule.stats().given_order);
  CHECK(schedule.position() == 0);

  const std::vector<DueAccess> first = schedule.due(8);
  REQUIRE(first.size() == 2);
  CHECK(first[0].access == gpu(1));
  CHECK(first[0].position == 0);
  CHECK(first[0].distance == 1);
  CHECK(first[1].access == gpu(2));
  CHECK(first[1].position == 1);
  CHECK(first[1].distance == 2);

  schedule.step_begin();
  schedule.on_acquire(gpu(1));
  CHECK(due_tensors(schedule) == Tensors{2, 3});
  acquire_all(schedule, gpu_order({2, 3, 4}));
  schedule.step_end();
  const AccessScheduleStats stats = schedule.stats();
  CHECK(stats.matched == 4);
  CHECK(stats.rerecords == 0);
  CHECK(stats.given_order);
}

TEST_CASE("due() follows the leads, stops at max and one step ahead, and wraps", "[schedule]") {
  SECTION("leads and max") {
    AccessSchedule schedule({.initial_lead = 3});
    schedule.set_order(gpu_order({1, 2, 3, 4, 5}));
    CHECK(due_tensors(schedule) == Tensors{1, 2, 3});
    CHECK(due_tensors(schedule, 2) == Tensors{1, 2});
    CHECK(schedule.due(0).empty());
    // An entry stays due until it is acquired.
    CHECK(due_tensors(schedule) == Tensors{1, 2, 3});

    // Near the end of the step, the next step's first entries are due.
    acquire_all(schedule, gpu_order({1, 2, 3, 4}));
    const std::vector<DueAccess> due = schedule.due(8);
    REQUIRE(due.size() == 3);
    CHECK(due[0].access == gpu(5));
    CHECK(due[1].access == gpu(1));
    CHECK(due[2].access == gpu(2));
    CHECK(due[0].position == 4);
    CHECK(due[1].position == 5);  // the next step's first entry
    CHECK(due[2].position == 6);
    CHECK(due[2].distance == 3);
  }
  SECTION("one step ahead at most") {
    AccessSchedule schedule({.initial_lead = 10, .max_lead = 10});
    schedule.set_order(gpu_order({1, 2, 3}));
    const std::vector<DueAccess> due = schedule.due(100);
    REQUIRE(due.size() == 3);
    for (uint64_t i = 0; i < 3; ++i) {
      CHECK(due[i].position == i);
      CHECK(due[i].distance == i + 1);
    }
  }
  SECTION("a lead of zero is never due") {
    AccessSchedule schedule({.initial_lead = 0});
    schedule.set_order(gpu_order({1, 2, 3}));
    CHECK(schedule.due(8).empty());
  }
}

TEST_CASE("A deviation realigns to the nearest match and keeps going", "[schedule]") {
  SECTION("a skipped layer jumps ahead") {
    AccessSchedule schedule;
    schedule.set_order(gpu_order({1, 2, 3, 4, 5, 6}));
    acquire_all(schedule, gpu_order({1, 2, 4}));  // 3 skipped
    CHECK(schedule.stats().realigned == 1);
    CHECK(schedule.position() == 4);  // 3 counts as passed
    CHECK(schedule.next_use(5) == 1);
    CHECK(due_tensors(schedule) == Tensors{5, 6});
    acquire_all(schedule, gpu_order({5, 6}));
    CHECK(schedule.stats().matched == 4);
    CHECK(due_tensors(schedule) == Tensors{1, 2});
  }
  SECTION("a repeated access jumps back") {
    AccessSchedule schedule;
    schedule.set_order(gpu_order({1, 2, 3, 4, 5, 6}));
    acquire_all(schedule, gpu_order({1, 2, 3, 4, 3}));  // 3 is two behind, four ahead
    CHECK(schedule.stats().realigned == 1);
    CHECK(schedule.next_use(4) == 1);
    CHECK(schedule.position() == 5);  // never goes back
    schedule.on_acquire(gpu(4));
    CHECK(schedule.stats().matched == 5);
  }
  SECTION("ahead wins a tie") {
    AccessSchedule schedule;
    schedule.set_order(gpu_order({9, 1, 9, 2}));
    schedule.on_acquire(gpu(9));
    schedule.on_acquire(gpu(9));  // index 0 is one behind, index 2 one ahead
    CHECK(schedule.next_use(2) == 1);
  }
  SECTION("beyond the window the access is unknown") {
    AccessSchedule schedule({.realign_window = 2});
    schedule.set_order(gpu_order({1, 2, 3, 4, 5, 6, 7, 8}));
    schedule.on_acquire(gpu(5));
    CHECK(schedule.stats().unknown == 1);
    CHECK(schedule.position() == 0);
    CHECK(schedule.next_use(1) == 1);
    schedule.on_acquire(gpu(3));  // two ahead: within the window
    CHECK(schedule.stats().realigned == 1);
    CHECK(schedule.next_use(4) == 1);
  }
  SECTION("the tier is part of the match") {
    AccessSchedule schedule;
    schedule.set_order({gpu(1), gpu(2), cpu(1), gpu(3), gpu(4), gpu(5)});
    schedule.on_acquire(cpu(1));  // not entry 0, which is in the GPU tier
    const AccessScheduleStats stats = schedule.stats();
    CHECK(stats.matched == 0);
    CHECK(stats.realigned == 1);
    CHECK(schedule.position() == 3);
    CHECK(schedule.next_use(3) == 1);
    CHECK(schedule.next_use(1) == 4);
  }
}

TEST_CASE("An inserted unknown access keeps the position", "[schedule]") {
  AccessSchedule schedule;
  run_step(schedule, gpu_order({1, 2, 3, 4}));
  schedule.step_begin();
  schedule.on_acquire(gpu(1));
  schedule.on_acquire(gpu(99));
  CHECK(schedule.stats().unknown == 1);
  CHECK(schedule.position() == 5);
  CHECK(schedule.next_use(2) == 1);
  CHECK(due_tensors(schedule) == Tensors{2, 3});
  acquire_all(schedule, gpu_order({2, 3, 4}));
  CHECK(schedule.stats().matched == 4);
  schedule.step_end();
  // The step differed, so it is the trace now.
  CHECK(schedule.stats().rerecords == 1);
  CHECK(schedule.stats().trace_length == 5);
  CHECK(schedule.next_use(99) == 2);
}

TEST_CASE("A step whose order changed replaces the trace", "[schedule]") {
  SECTION("reordered") {
    AccessSchedule schedule;
    run_step(schedule, gpu_order({1, 2, 3, 4}));
    run_step(schedule, gpu_order({1, 3, 2, 4}));
    CHECK(schedule.stats().rerecords == 1);
    CHECK(schedule.next_use(3) == 2);
    CHECK(schedule.next_use(2) == 3);
    run_step(schedule, gpu_order({1, 3, 2, 4}));  // matches the new trace
    const AccessScheduleStats stats = schedule.stats();
    CHECK(stats.rerecords == 1);
    CHECK(stats.matched == 1 + 4);  // the reordered step matched only its first access
  }
  SECTION("longer or shorter, every acquire matching") {
    AccessSchedule schedule;
    run_step(schedule, gpu_order({1, 2, 3, 4}));
    run_step(schedule, gpu_order({1, 2, 3, 4, 1, 2}));
    CHECK(schedule.stats().realigned == 0);
    CHECK(schedule.stats().rerecords == 1);
    CHECK(schedule.stats().trace_length == 6);
    run_step(schedule, gpu_order({1, 2}));
    CHECK(schedule.stats().rerecords == 2);
    CHECK(schedule.stats().trace_length == 2);
  }
  SECTION("a given order is re-recorded too") {
    AccessSchedule schedule;
    schedule.set_order(gpu_order({1, 2, 3}));
    run_step(schedule, gpu_order({1, 3, 2}));
    const AccessScheduleStats stats = schedule.stats();
    CHECK(stats.rerecords == 1);
    CHECK_FALSE(stats.given_order);
    CHECK(schedule.next_use(3) == 2);
  }
  SECTION("an empty step keeps the trace") {
    AccessSchedule schedule;
    run_step(schedule, gpu_order({1, 2, 3}));
    run_step(schedule, {});
    CHECK(schedule.stats().trace_length == 3);
    CHECK(schedule.stats().rerecords == 0);
  }
  SECTION("acquires outside a step realign but do not record") {
    AccessSchedule schedule;
    run_step(schedule, gpu_order({1, 2, 3}));
    acquire_all(schedule, gpu_order({7, 1}));
    CHECK(schedule.stats().unknown == 1);
    CHECK(schedule.stats().trace_length == 3);
    CHECK_FALSE(schedule.next_use(7).has_value());
    CHECK(schedule.position() == 4);
    // The next step starts at the trace's start, in the next cycle.
    schedule.step_begin();
    CHECK(schedule.position() == 6);
    CHECK(schedule.next_use(1) == 1);
    acquire_all(schedule, gpu_order({1, 2, 3}));
    schedule.step_end();
    CHECK(schedule.stats().realigned == 0);
    CHECK(schedule.stats().rerecords == 0);
  }
}

TEST_CASE("A late arrival makes that entry due earlier next step", "[schedule]") {
  SECTION("lead grows; it survives a re-record") {
    AccessSchedule schedule({.initial_lead = 2, .late_growth = 2});
    schedule.set_order(gpu_order({1, 2, 3, 4, 5, 6}));
    schedule.step_begin();
    schedule.on_acquire(gpu(1));
    CHECK(due_tensors(schedule) == Tensors{2, 3});  // 4 is three away: not yet
    acquire_all(schedule, gpu_order({2, 3, 4}));
    schedule.on_late(gpu(4));
    acquire_all(schedule, gpu_order({5, 6}));
    schedule.step_end();
    CHECK(schedule.stats().late == 1);
    // Lead 4: due already at the step's start, ahead of 3 (lead 2).
    CHECK(due_tensors(schedule) == Tensors{1, 2, 4});

    // A step with an extra layer re-records; 4 is still its first occurrence, so keeps lead 4.
    run_step(schedule, gpu_order({1, 2, 7, 3, 4, 5, 6}));
    REQUIRE(schedule.stats().rerecords == 1);
    CHECK(due_tensors(schedule) == Tensors{1, 2});  // 4 is five away
    schedule.on_acquire(gpu(1));
    CHECK(due_tensors(schedule) == Tensors{2, 7, 4});
  }
  SECTION("capped at max_lead") {
    AccessSchedule schedule({.initial_lead = 2, .late_growth = 2, .max_lead = 5});
    schedule.set_order(gpu_order({1, 2, 3, 4, 5, 6, 7, 8, 9, 10}));
    acquire_all(schedule, gpu_order({1, 2, 3, 4, 5, 6, 7, 8, 9, 10}));
    for (int i = 0; i < 5; ++i) schedule.on_late(gpu(10));
    acquire_all(schedule, gpu_order({1, 2, 3, 4}));
    CHECK(std::ranges::count(due_tensors(schedule), TensorId{10}) == 0);  // six away
    schedule.on_acquire(gpu(5));
    CHECK(std::ranges::count(due_tensors(schedule), TensorId{10}) == 1);  // five away
  }
  SECTION("reported before its acquire") {
    AccessSchedule schedule;
    schedule.set_order(gpu_order({1, 2, 3, 4, 5}));
    acquire_all(schedule, gpu_order({1, 2}));
    schedule.on_late(gpu(3));
    acquire_all(schedule, gpu_order({3, 4, 5}));
    CHECK(due_tensors(schedule) == Tensors{1, 2, 3});
  }
  SECTION("in the recording step") {
    AccessSchedule schedule;
    schedule.step_begin();
    acquire_all(schedule, gpu_order({1, 2, 3}));
    schedule.on_late(gpu(3));
    schedule.on_acquire(gpu(4));
    schedule.step_end();
    CHECK(due_tensors(schedule) == Tensors{1, 2, 3});
  }
}

TEST_CASE("due_in_order: every access before a due one is due too, in order", "[schedule]") {
  AccessSchedule schedule({.initial_lead = 2, .late_growth = 2});
  schedule.set_order(gpu_order({1, 2, 3, 4, 5, 6, 7, 8}));
  // Same as due() while the leads are equal.
  CHECK(schedule.due_in_order(100).size() == 2);
  acquire_all(schedule, gpu_order({1, 2, 3, 4, 5}));
  schedule.on_late(gpu(5));  // lead 2 -> 4
  schedule.on_late(gpu(5));  // 4 -> 8
  acquire_all(schedule, gpu_order({6, 7, 8}));
  // At the step's start 5 is five away: due() lists it out of order, after 1 and 2 only; a link
  // serving copies in issue order would then deliver 5 before 3 and 4, which are needed sooner.
  CHECK(due_tensors(schedule) == Tensors{1, 2, 5});
  std::vector<TensorId> in_order;
  for (const DueAccess& d : schedule.due_in_order(100)) in_order.push_back(d.access.tensor);
  CHECK(in_order == Tensors{1, 2, 3, 4, 5});
  const std::vector<DueAccess> due = schedule.due_in_order(100);
  for (size_t i = 0; i < due.size(); ++i) {
    CHECK(due[i].distance == i + 1);
    CHECK(due[i].position == schedule.position() + i);
  }
  // Capped at max, nearest first; empty without a trace or for max 0.
  CHECK(schedule.due_in_order(3).size() == 3);
  CHECK(schedule.due_in_order(0).empty());
  CHECK(AccessSchedule().due_in_order(8).empty());
  // After 5, the next step's 5 is eight away: due again, with the seven accesses before it.
  acquire_all(schedule, gpu_order({1, 2, 3, 4, 5}));
  CHECK(due_tensors(schedule) == Tensors{6, 7, 5});
  CHECK(schedule.due_in_order(100).size() == 8);
  acquire_all(schedule, gpu_order({6}));  // 5 is seven away: still due, in order
  CHECK(schedule.due_in_order(100).back().access == gpu(5));
}

TEST_CASE("upcoming: the next accesses in order, due or not, one step ahead at most",
          "[schedule]") {
  AccessSchedule schedule({.initial_lead = 1});
  CHECK(schedule.upcoming(8).empty());  // no trace
  schedule.set_order(gpu_order({1, 2, 3, 4}));
  acquire_all(schedule, gpu_order({1, 2}));
  CHECK(due_tensors(schedule) == Tensors{3});  // the lead: one
  std::vector<TensorId> next;
  for (const DueAccess& d : schedule.upcoming(100)) next.push_back(d.access.tensor);
  CHECK(next == Tensors{3, 4, 1, 2});  // wraps into the next step, never past it
  const std::vector<DueAccess> two = schedule.upcoming(2);
  REQUIRE(two.size() == 2);
  CHECK(two[1].access == gpu(4));
  CHECK(two[1].distance == 2);
  CHECK(two[1].position == schedule.position() + 1);
  CHECK(schedule.upcoming(0).empty());
}

TEST_CASE("Repeated late arrivals make an access due a whole step ahead, then stop growing",
          "[schedule]") {
  // The feedback loop as the store drives it: each step the same access is late until its lead
  // covers it; the lead doubles per late step and is capped by max_lead.
  AccessSchedule schedule({.initial_lead = 2, .late_growth = 2, .max_lead = 8});
  const std::vector<Access> order = gpu_order({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12});
  schedule.set_order(order);
  std::vector<size_t> first_due;  // at which position of the step 12 first became due
  for (int step = 0; step < 5; ++step) {
    schedule.step_begin();
    std::optional<size_t> when;
    for (size_t i = 0; i < order.size(); ++i) {
      for (const DueAccess& d : schedule.due_in_order(100)) {
        if (d.access == gpu(12) && !when) when = i;
      }
      schedule.on_acquire(order[i]);
      if (order[i] == gpu(12)) schedule.on_late(gpu(12));
    }
    schedule.step_end();
    first_due.push_back(when.value_or(99));
  }
  // Lead 2, 4, 8, then capped at 8: due 2, 4, 8, 8, 8 acquires before its own.
  CHECK(first_due == std::vector<size_t>{10, 8, 4, 4, 4});
  CHECK(schedule.stats().late == 5);
}

TEST_CASE("An entry carries the latest acquire's overwrite flag, matching ignores it",
          "[schedule][overwrite]") {
  AccessSchedule schedule;
  const Access weight{1, TierKind::kGpu};
  const Access grad{2, TierKind::kGpu, /*overwrite=*/true};
  schedule.step_begin();
  schedule.on_acquire(weight);
  schedule.on_acquire(grad);
  schedule.step_end();
  REQUIRE(schedule.has_trace());
  std::vector<DueAccess> due = schedule.due(8);
  REQUIRE(due.size() == 2);
  CHECK_FALSE(due[0].access.overwrite);
  CHECK(due[1].access.overwrite);
  // The same order with the grad now read: it still matches (no re-record), and the entry
  // takes the new mode.
  schedule.step_begin();
  schedule.on_acquire(weight);
  schedule.on_acquire(Access{2, TierKind::kGpu});
  schedule.step_end();
  CHECK(schedule.stats().rerecords == 0);
  CHECK(schedule.stats().matched == 2);
  due = schedule.due(8);
  REQUIRE(due.size() == 2);
  CHECK_FALSE(due[1].access.overwrite);
  // A given order keeps the flags it was given.
  schedule.set_order({weight, grad});
  due = schedule.upcoming(8);
  REQUIRE(due.size() == 2);
  CHECK(due[1].access.overwrite);
}

}  // namespace
}  // namespace strata
