// Timed regions over a Runtime and the work its pinned CPU tier does as it fills (docs/bench.md,
// "Timed regions and the CPU tier's pinning"). The tier is pinned with the device piece by piece,
// on the thread whose allocation first reaches a piece, and each new piece is then registered
// with io_uring on a background thread (docs/nvme.md). A workload therefore
//   - calls Runtime::wait_for_registration(), untimed, before each timed region, so that no
//     registration runs beside the timed work;
//   - counts the pieces a timed region pinned itself (its allocations reached pieces that no
//     earlier, untimed pass had used), whose pinning is inside the region's time and whose
//     registration ran beside it, and says so in its report (FreshPieces::note).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "strata/runtime/runtime.h"

namespace strata::bench {

// The CPU tier's pieces in use so far and the device pinning they cost.
struct PinCounters {
  uint64_t pieces = 0;  // pinned, or left unpinned after a failure: first used either way
  uint64_t pin_ns = 0;
};
PinCounters pin_counters(Runtime& runtime);

// Pieces first used inside timed regions, over a workload's regions.
class FreshPieces {
 public:
  // One timed region: the counters read just before and just after it.
  void add(const PinCounters& before, const PinCounters& after);
  uint64_t pieces() const { return pieces_; }
  uint64_t regions() const { return regions_; }  // those that pinned a piece

  // "" when no timed region pinned a piece; else one line for the report, naming `what` (the
  // row or run) and `region` (e.g. "timed pass").
  std::string note(std::string_view what, std::string_view region) const;

 private:
  uint64_t pieces_ = 0;
  uint64_t regions_ = 0;
  uint64_t pin_ns_ = 0;
};

}  // namespace strata::bench
