// The overlapped step while the trainer runs ahead of its stream, as a trainer's backward hooks
// run ahead of a GPU: grad_ready() for later layers is issued before their compute is done, so
// the optimizer's D2H stream holds waits for that compute. A gradient that has landed must be
// stepped early all the same, not after the rest of backward.
#include <absl/synchronization/notification.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <future>
#include <limits>
#include <thread>

#include "optimizer/optimizer_rig.h"
#include "strata/optimizer/offload_optimizer.h"

namespace strata {
namespace {

using testing::Rig;
using testing::RigOptions;

TEST_CASE("Overlapped step: a landed gradient steps early while later landings wait for compute",
          "[optimizer][overlap]") {
  RigOptions o;
  o.overlap.enabled = true;
  o.shapes = {{"p0", 3000}, {"p1", 2000}};
  Rig rig(o, {std::vector<float>(3000, 0.5F), std::vector<float>(2000, -0.25F)});
  OffloadOptimizer& optimizer = rig.optimizer();
  Device& device = rig.runtime().device();
  Stream& stream = rig.stream();
  const std::vector<std::vector<float>> grads = {std::vector<float>(3000, 0.01F),
                                                 std::vector<float>(2000, -0.02F)};
  // One whole step writes the gradient tensors (they keep their contents).
  rig.backward(grads);
  REQUIRE(optimizer.step().ok());

  // Backward: layer 1's compute, its gradient ready; layer 0's compute, held until `done`, its
  // gradient ready. Layer 1's compute is held until both are issued, so that its landing
  // comes after layer 0's wait is queued on the optimizer's D2H stream.
  absl::Notification start, done;
  REQUIRE(device.launch_host_callback(stream, [&] { start.WaitForNotification(); }).ok());
  REQUIRE(optimizer.grad_ready(rig.ids()[1], stream).ok());
  REQUIRE(device.launch_host_callback(stream, [&] { done.WaitForNotification(); }).ok());
  REQUIRE(optimizer.grad_ready(rig.ids()[0], stream).ok());
  const uint64_t landed = optimizer.stats().grads_landed;
  start.Notify();
  while (optimizer.stats().grads_landed == landed) std::this_thread::yield();
  // The stepper has layer 1's unit now or shortly; give it the chance to pick it up (no
  // assertion rests on this pause: it only keeps the check below from passing vacuously).
  std::this_thread::sleep_for(std::chrono::milliseconds(100));

  // read_state() rolls early work back first, so it waits for the stepper's unit in progress.
  // That unit must not wait for layer 0's compute: a liveness check, with a generous bound so
  // that a regression fails instead of hanging (never a speed assertion).
  auto read = std::async(std::launch::async, [&] {
    std::vector<float> master(2000);
    return optimizer.read_state(rig.ids()[1], master, {}, {});
  });
  const bool finished = read.wait_for(std::chrono::seconds(20)) == std::future_status::ready;
  done.Notify();
  CHECK(read.get().ok());
  CHECK(finished);  // else the early step waited for the end of backward
  REQUIRE(device.synchronize(stream).ok());
  auto result = optimizer.step();
  REQUIRE(result.ok());
  CHECK_FALSE(result->skipped);
}

}  // namespace
}  // namespace strata

namespace strata {
namespace {

// A step skipped for an overflow reports its early work as any other step does: rolled_back
// and overlap_rollbacks when early work was undone, neither when there was none, and this
// step's figures in the last_* stats (not the previous step's).
TEST_CASE("Overlapped step: a skipped step reports the early work it rolled back",
          "[optimizer][overlap]") {
  RigOptions o;
  o.overlap.enabled = true;
  o.shapes = {{"p0", 3000}, {"p1", 2000}};
  Rig rig(o, {std::vector<float>(3000, 0.5F), std::vector<float>(2000, -0.25F)});
  OffloadOptimizer& optimizer = rig.optimizer();
  const std::vector<std::vector<float>> clean = {std::vector<float>(3000, 0.01F),
                                                 std::vector<float>(2000, -0.02F)};
  std::vector<std::vector<float>> overflow = clean;
  overflow[0][17] = std::numeric_limits<float>::infinity();
  rig.backward(clean);
  optimizer.wait_for_early_steps();
  REQUIRE(optimizer.step().ok());
  const OffloadOptimizerStats first = optimizer.stats();
  REQUIRE(first.last_early_elements == 5000);
  REQUIRE(first.last_adam_ns == 0);  // both stepped early

  SECTION("early work to undo") {
    rig.backward(overflow);
    optimizer.wait_for_early_steps();
    auto result = optimizer.step();
    REQUIRE(result.ok());
    CHECK(result->skipped);
    CHECK(result->rolled_back);
    CHECK(result->early_elements == 0);
    const OffloadOptimizerStats s = optimizer.stats();
    CHECK(s.overlap_rollbacks == first.overlap_rollbacks + 1);
    CHECK(s.last_early_elements == 0);
    CHECK(s.last_redone_elements == 0);  // undone, not stepped again: the step is skipped
    CHECK(s.last_adam_ns == 0);
  }
  SECTION("none: every landing announced as a micro-step that more will add to") {
    rig.backward(overflow, GradCompletion::kMore);
    auto result = optimizer.step();
    REQUIRE(result.ok());
    CHECK(result->skipped);
    CHECK_FALSE(result->rolled_back);
    const OffloadOptimizerStats s = optimizer.stats();
    CHECK(s.overlap_rollbacks == first.overlap_rollbacks);
    CHECK(s.last_early_elements == 0);
    CHECK(s.last_early_adam_ns == 0);
  }
}

}  // namespace
}  // namespace strata
