// ZeroEngine's collectives are ordered on streams: the trainer's calls return while the device
// work they depend on has not run, and the data is right once it has. Every stream of the host
// device is held by a gate (HostDevice's test hook) while a whole forward and backward is issued;
// a call that waited on the host for a stream, a collective or a copy would still be waiting
// when the gate opens (a watchdog opens it, so that such a call ends the test with a failure
// rather than a hang). No timing is asserted.
#include <absl/synchronization/notification.h>
#include <absl/time/time.h>

#include <catch2/catch.hpp>
#include <thread>

#include "strata/device/host_device.h"
#include "strata/testing/zero_testing.h"
#include "strata/zero/zero_engine.h"
#include "zero/zero_rig.h"

namespace strata {
namespace {

// A job of one rank whose Gloo communicator waits on this runtime's streams.
std::unique_ptr<Communicator> lone_with(Device& device) {
  CommOptions o;
  o.launch.master_port = 0;  // a free port: a job of one
  o.device = &device;
  auto comm = Communicator::create(o);
  REQUIRE(comm.ok());
  return *std::move(comm);
}

// Opens the gate after a minute unless the test got there first: a call that blocked on the
// held streams then returns, and the test fails instead of hanging.
class Watchdog {
 public:
  explicit Watchdog(StreamGate& gate)
      : thread_([this, &gate] {
          if (!done_.WaitForNotificationWithTimeout(absl::Seconds(60))) gate.open();
        }) {}
  ~Watchdog() {
    done_.Notify();
    thread_.join();
  }

 private:
  absl::Notification done_;
  std::thread thread_;
};

struct Variant {
  uint32_t stage;
  bool bounce;  // Gloo's data through pinned bounce buffers, as on a CUDA device
};

TEST_CASE("The trainer's thread does not wait for ZeroEngine's collectives", "[zero]") {
  const Variant v = GENERATE(Variant{1, false}, Variant{2, false}, Variant{3, false},
                             Variant{1, true}, Variant{2, true}, Variant{3, true});
  INFO("stage " << v.stage << (v.bounce ? ", through bounce buffers" : ""));
  const auto model = testing::zero_model();
  ZeroOptions o;
  o.stage = v.stage;
  o.param_type = ParamType::kF32;
  o.grad_type = GradType::kF32;
  o.bucket_bytes = 8 << 10;
  o.alignment = 8;
  o.groups = {AdamGroup{.lr = 1e-2F}, AdamGroup{.lr = 3e-3F}};
  // Nothing in the held forward and backward may need the host: every tensor stays in the GPU
  // tier, each group has a bucket of its own, and stage 3 keeps every gathered group (a group
  // dropped at release_param() is destroyed, which waits for the work that used it).
  o.param_home = TierKind::kGpu;
  o.gradient_buckets = static_cast<uint32_t>(model.params.size());
  o.persist_below_bytes = 128;
  o.reuse_window_bytes = 64 << 20;
  testing::set_zero_bounce_for_testing(v.bounce);
  auto runtime = testing::zero_runtime("", "64MiB");
  REQUIRE(runtime.ok());
  Device& device = (*runtime)->device();
  auto comm = lone_with(device);
  auto engine = ZeroEngine::create(**runtime, *comm, model.params, o);
  testing::set_zero_bounce_for_testing(false);
  INFO(engine.status().ToString());
  REQUIRE(engine.ok());
  ZeroEngine& e = **engine;
  auto reference = testing::ZeroReference::create(model, o, "");
  REQUIRE(reference.ok());
  auto stream = device.create_stream();
  REQUIRE(stream.ok());
  const auto n = static_cast<uint32_t>(model.params.size());

  // One step as a trainer issues it, every use of the data a host callback on its stream (the
  // stand-in for a kernel): forward reads each parameter, backward adds each gradient.
  std::vector<std::vector<float>> seen(n);
  auto issue_step = [&](uint64_t step) {
    for (uint32_t p = 0; p < n; ++p) {
      auto data = e.acquire_param(ZeroParamId{p}, TierKind::kGpu, **stream);
      REQUIRE(data.ok());
      const auto* values = static_cast<const float*>(*data);
      REQUIRE(device
                  .launch_host_callback(**stream,
                                        [&seen, p, values, count = model.initial[p].size()] {
                                          seen[p].assign(values, values + count);
                                        })
                  .ok());
      REQUIRE(e.release_param(ZeroParamId{p}, **stream).ok());
    }
    for (int p = static_cast<int>(n) - 1; p >= 0; --p) {
      const auto id = ZeroParamId{static_cast<uint32_t>(p)};
      auto acquired = e.acquire_param(id, TierKind::kGpu, **stream);
      INFO(acquired.status().ToString());
      REQUIRE(acquired.ok());
      auto grad = e.acquire_grad(id, TierKind::kGpu, **stream);
      REQUIRE(grad.ok());
      REQUIRE(device
                  .launch_host_callback(**stream,
                                        [buffer = static_cast<float*>(*grad), step, p,
                                         count = model.initial[static_cast<size_t>(p)].size()] {
                                          for (uint64_t i = 0; i < count; ++i) {
                                            buffer[i] += testing::synthetic_grad(
                                                step, 0, 0, static_cast<uint32_t>(p), i);
                                          }
                                        })
                  .ok());
      REQUIRE(e.grad_ready(id, **stream).ok());
      REQUIRE(e.release_param(id, **stream).ok());
    }
  };
  // `got`: the engine's step() of this step.
  auto check_step = [&](uint64_t step, const absl::StatusOr<StepResult>& got) {
    REQUIRE(device.synchronize(**stream).ok());
    for (uint32_t p = 0; p < n; ++p) {
      auto want = (*reference)->param(p);
      REQUIRE(want.ok());
      CHECK(seen[p] == *want);  // forward read the parameters of the step before, bit for bit
    }
    REQUIRE((*reference)->micro_step(step, 0, 1, false).ok());
    auto want = (*reference)->step();
    REQUIRE(got.ok());
    REQUIRE(want.ok());
    CHECK(got->grad_norm == want->grad_norm);
  };

  // The first step records stage 3's order (and gathers on demand); the second is held.
  issue_step(0);
  check_step(0, e.step());
  auto gate = hold_device(testing::shared_host_device());  // the runtime's device forwards to it
  REQUIRE(gate.ok());
  bool held_throughout = false;
  absl::StatusOr<StepResult> stepped;
  {
    Watchdog watchdog(**gate);
    issue_step(1);
    held_throughout = !(*gate)->is_open();
    // step() does wait (docs/zero.md): the CPU step needs every reduced gradient on the host.
    // Called with the gate closed, it can only be right if it waited for the gradients that
    // the held callbacks write once the gate opens.
    std::thread stepper([&] { stepped = e.step(); });
    (*gate)->open();
    stepper.join();
  }
  CHECK(held_throughout);
  check_step(1, stepped);
  // The updated parameters, read after step() as a trainer would, are the reference's.
  for (uint32_t p = 0; p < n; ++p) {
    auto got = testing::zero_param(e, **stream, p);
    auto want = (*reference)->param(p);
    REQUIRE(got.ok());
    REQUIRE(want.ok());
    CHECK(*got == *want);
  }
}

}  // namespace
}  // namespace strata
