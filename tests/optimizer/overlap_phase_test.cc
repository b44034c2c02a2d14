// The overlapped step's phase (optimizer/overlap_phase.h): every event from every phase, and
// issue 36's defect 1 (arming before step() set the next step's loss scale) refused.
#include "optimizer/overlap_phase.h"

#include <catch2/catch.hpp>

namespace strata {
namespace {

using Phase = OverlapPhase::Phase;

OverlapPhase in_phase(Phase phase) {
  OverlapPhase p;
  if (phase == Phase::kArmed) REQUIRE(p.try_arm().ok());
  if (phase == Phase::kSettling) p.begin_settling();
  REQUIRE(p.phase() == phase);
  return p;
}

TEST_CASE("Overlap phase: every event from every phase", "[optimizer][overlap_phase]") {
  for (Phase from : {Phase::kDisarmed, Phase::kArmed, Phase::kSettling}) {
    CAPTURE(to_string(from));
    {
      OverlapPhase p = in_phase(from);
      const absl::Status armed = p.try_arm();
      CHECK(armed.ok() == (from == Phase::kDisarmed));
      CHECK(p.phase() == (from == Phase::kDisarmed ? Phase::kArmed : from));
    }
    {
      OverlapPhase p = in_phase(from);
      p.quiesce();
      CHECK(p.phase() == (from == Phase::kArmed ? Phase::kDisarmed : from));
      CHECK_FALSE(p.armed());
    }
    {
      OverlapPhase p = in_phase(from);
      p.begin_settling();
      CHECK(p.phase() == Phase::kSettling);
    }
    {
      OverlapPhase p = in_phase(from);
      const absl::Status settled = p.try_settled();
      CHECK(settled.ok() == (from == Phase::kSettling));
      CHECK(p.phase() == (from == Phase::kSettling ? Phase::kDisarmed : from));
    }
  }
}

TEST_CASE("Overlap phase: a step arms only after it has settled the next step's scale",
          "[optimizer][overlap_phase]") {
  OverlapPhase p = in_phase(Phase::kArmed);
  p.begin_settling();  // step(): quiesce, validate, keep or roll back
  p.quiesce();         // settle_early() quiesces again: still settling
  // Defect 1's order: arm() before the overflow's loss-scale back-off.
  const absl::Status early = p.try_arm();
  CHECK(absl::IsFailedPrecondition(early));
  CHECK_THAT(std::string(early.message()), Catch::Matchers::Contains("loss scale"));
  CHECK(p.phase() == Phase::kSettling);
  // The order step() keeps: the scale set, settled, then armed for the next step.
  CHECK(p.try_settled().ok());
  CHECK(p.try_arm().ok());
  CHECK(p.armed());
  // Armed twice without settling would forget early work stepped on the first plan.
  CHECK(absl::IsFailedPrecondition(p.try_arm()));
}

}  // namespace
}  // namespace strata
