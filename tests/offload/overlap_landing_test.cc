// The overlapped step while the trainer runs ahead of its stream, as a trainer's backward hooks
// run ahead of a GPU: grad_ready() for later layers is issued before their compute is done, so
// the optimizer's D2H stream holds waits for that compute. A gradient that has landed must be
// stepped early all the same, not after the rest of backward.
#include <absl/synchronization/notification.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <future>
#include <thread>

#include "offload/optimizer_rig.h"
#include "strata/offload/offload_optimizer.h"

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
