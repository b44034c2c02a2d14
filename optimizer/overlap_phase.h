// The overlapped step's phase (early_step.cc): when early steps may be queued, and the order
// step() keeps: the next step's loss scale and counts are final before anything arms. Arming
// while step() settles would snapshot a plan step() is about to change (issue 36's defect 1: the
// scale backed off after arm(), so every early step of the next step failed its loss-scale
// check and was rolled back); here that order is a refused transition.
//
//   phase       early work
//   kDisarmed   none queued; arm() may snapshot the plan
//   kArmed      final landings queue early steps on the plan arm() took
//   kSettling   step() decides what holds and sets the next step's scale: nothing arms
//
//   event           from                   to
//   arm             kDisarmed              kArmed
//   quiesce         kArmed                 kDisarmed   (kDisarmed, kSettling: unchanged)
//   begin_settling  any                    kSettling
//   settled         kSettling              kDisarmed
//
// A refused arm() aborts debug builds and is logged in release builds, which then run the step
// without early work (slower, never wrong).
#pragma once

#include <absl/status/status.h>

#include <cstdint>

namespace strata {

class OverlapPhase {
 public:
  enum class Phase : uint8_t { kDisarmed, kArmed, kSettling };

  Phase phase() const { return phase_; }
  bool armed() const { return phase_ == Phase::kArmed; }

  absl::Status try_arm();
  void quiesce() {
    if (phase_ == Phase::kArmed) phase_ = Phase::kDisarmed;
  }
  void begin_settling() { phase_ = Phase::kSettling; }
  absl::Status try_settled();

 private:
  Phase phase_ = Phase::kDisarmed;
};

const char* to_string(OverlapPhase::Phase phase);

}  // namespace strata
