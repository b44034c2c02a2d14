#include "overlap_phase.h"

#include <absl/strings/str_cat.h>

namespace strata {

const char* to_string(OverlapPhase::Phase phase) {
  switch (phase) {
    case OverlapPhase::Phase::kDisarmed:
      return "disarmed";
    case OverlapPhase::Phase::kArmed:
      return "armed";
    case OverlapPhase::Phase::kSettling:
      return "settling";
  }
  return "?";
}

absl::Status OverlapPhase::try_arm() {
  if (phase_ != Phase::kDisarmed) {
    return absl::FailedPreconditionError(absl::StrCat(
        "overlapped step: arm is illegal while ", to_string(phase_),
        phase_ == Phase::kSettling ? " (step() has not set the next step's loss scale yet)"
                                   : " (the early work armed before was not settled)"));
  }
  phase_ = Phase::kArmed;
  return absl::OkStatus();
}

absl::Status OverlapPhase::try_settled() {
  if (phase_ != Phase::kSettling) {
    return absl::FailedPreconditionError(
        absl::StrCat("overlapped step: settled is illegal while ", to_string(phase_)));
  }
  phase_ = Phase::kDisarmed;
  return absl::OkStatus();
}

}  // namespace strata
