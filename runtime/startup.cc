// Runtime::startup() and its text: what creating the runtime cost, and how the pinned CPU tier
// is pinned and registered piece by piece as it fills; wait_for_registration().
#include <absl/strings/str_format.h>

#include "strata/base/format_bytes.h"
#include "strata/runtime/runtime.h"

namespace strata {

StartupStats Runtime::startup() const {
  StartupStats stats;
  stats.create_seconds = create_seconds_;
  stats.pinning = cpu_->stats().pinning;
  if (nvme_ != nullptr) {
    const SwapStats swap = nvme_->stats();
    stats.registered_bytes = swap.io.registered_bytes;
    stats.registrations = swap.io.registrations;
    stats.registration_seconds = static_cast<double>(swap.io.registration_ns) / 1e9;
    stats.registration_failures = swap.io.registration_failures;
    if (swap.engine == "io_uring") stats.rings = static_cast<uint32_t>(swap.paths.size());
  }
  return stats;
}

void Runtime::wait_for_registration() const { cpu_->wait_piece_listener(); }

std::string to_string(const StartupStats& s) {
  const PinningStats& p = s.pinning;
  std::string text = absl::StrFormat("created in %.3f s\n", s.create_seconds);
  text += absl::StrFormat(
      "pinned CPU tier: %d pieces of %s, each pinned when the tier first uses it; %d pinned "
      "so far (%s) in %.3f s%s\n",
      p.pieces, format_bytes(p.piece_bytes), p.pinned_pieces, format_bytes(p.pinned_bytes),
      static_cast<double>(p.pin_ns) / 1e9,
      p.unpinned_pieces == 0 ? "" : absl::StrFormat(", %d left unpinned", p.unpinned_pieces));
  if (s.rings == 0) {
    text += "io_uring registration: none (no NVMe tier, or psync)\n";
  } else {
    text += absl::StrFormat(
        "io_uring registration: each pinned piece on each of %d ring%s, in the background; %s "
        "registered so far (%d registrations) in %.3f s%s\n",
        s.rings, s.rings == 1 ? "" : "s", format_bytes(s.registered_bytes), s.registrations,
        s.registration_seconds,
        s.registration_failures == 0 ? "" : "; stopped after a failure (see the warnings)");
  }
  return text;
}

}  // namespace strata
