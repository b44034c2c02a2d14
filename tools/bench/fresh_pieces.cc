#include "bench/fresh_pieces.h"

#include <absl/strings/str_format.h>

namespace strata::bench {

PinCounters pin_counters(Runtime& runtime) {
  const PinningStats p = runtime.cpu().stats().pinning;
  return PinCounters{.pieces = p.pinned_pieces + p.unpinned_pieces, .pin_ns = p.pin_ns};
}

void FreshPieces::add(const PinCounters& before, const PinCounters& after) {
  if (after.pieces <= before.pieces) return;
  pieces_ += after.pieces - before.pieces;
  pin_ns_ += after.pin_ns - before.pin_ns;
  ++regions_;
}

std::string FreshPieces::note(std::string_view what, std::string_view region) const {
  if (pieces_ == 0) return "";
  return absl::StrFormat(
      "%s: %d %s%s first used %d piece%s of the pinned CPU tier, pinned inside the %s "
      "(%.3f ms of device pinning on the allocating thread; with io_uring, registered in the "
      "background beside it): those figures include that one-time start-up cost",
      what, regions_, region, regions_ == 1 ? "" : "s", pieces_, pieces_ == 1 ? "" : "s", region,
      static_cast<double>(pin_ns_) * 1e-6);
}

}  // namespace strata::bench
