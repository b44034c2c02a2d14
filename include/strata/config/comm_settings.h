// The communication floor's settings (STRATA_COMM_*), parsed here with every other STRATA_*
// variable so that one place validates them all. A dependency-free header: comm/ and the
// configuration both name these types.
#pragma once

#include <absl/status/statusor.h>

#include <chrono>
#include <string>
#include <string_view>

namespace strata {

// auto: NCCL where this build has it and the buffers are on a CUDA device, else Gloo.
enum class CommBackendKind { kAuto, kNccl, kGloo };

// "auto", "nccl", "gloo".
std::string_view to_string(CommBackendKind kind);

struct CommSettings {
  CommBackendKind backend = CommBackendKind::kAuto;
  // How long any one collective, the rendezvous or a peer may take before every rank fails with
  // an error naming the operation and the rank(s) at fault.
  std::chrono::milliseconds timeout = std::chrono::minutes(5);
  // Checks every collective's signature (operation, type, sizes, root) across ranks before it
  // runs: a mismatch becomes an error naming the ranks, at the cost of one small exchange each.
  bool debug = false;
};

inline constexpr std::chrono::milliseconds kMinCommTimeout{100};
inline constexpr std::chrono::milliseconds kMaxCommTimeout = std::chrono::hours(24);

// "auto", "nccl" or "gloo", case-insensitive. Errors start with the quoted text.
absl::StatusOr<CommBackendKind> parse_comm_backend(std::string_view text);
// A duration: "30s", "500ms", "5min", "2h" or a bare number of seconds ("90", "2.5"), from
// kMinCommTimeout to kMaxCommTimeout.
absl::StatusOr<std::chrono::milliseconds> parse_comm_timeout(std::string_view text);
// Text for messages: "300 s", "1.5 s", "250 ms".
std::string format_duration(std::chrono::milliseconds duration);

}  // namespace strata
