#include "strata/config/comm_settings.h"

#include <absl/strings/numbers.h>

#include <cmath>

#include "config_internal.h"
#include "strata/base/text.h"

namespace strata {

using config_internal::invalid;
using namespace text;  // NOLINT(build/namespaces): string_view helpers

std::string_view to_string(CommBackendKind kind) {
  switch (kind) {
    case CommBackendKind::kAuto:
      return "auto";
    case CommBackendKind::kNccl:
      return "nccl";
    case CommBackendKind::kGloo:
      return "gloo";
  }
  return "invalid";
}

absl::StatusOr<CommBackendKind> parse_comm_backend(std::string_view text) {
  const std::string word = lower(trim(text));
  if (word == "auto") return CommBackendKind::kAuto;
  if (word == "nccl") return CommBackendKind::kNccl;
  if (word == "gloo") return CommBackendKind::kGloo;
  return invalid(cat("'", text, "' is not a communication backend: use auto, nccl or gloo"));
}

absl::StatusOr<std::chrono::milliseconds> parse_comm_timeout(std::string_view text) {
  const std::string form = cat("use a duration from ", format_duration(kMinCommTimeout), " to ",
                               format_duration(kMaxCommTimeout),
                               " such as 30s, 500ms, 5min or 2h (a bare number is seconds)");
  const std::string word = lower(trim(text));
  size_t unit_at = word.size();
  while (unit_at > 0 && std::isalpha(static_cast<unsigned char>(word[unit_at - 1]))) --unit_at;
  const std::string number = std::string(trim(std::string_view(word).substr(0, unit_at)));
  const std::string unit = word.substr(unit_at);
  double scale_ms = 0;
  if (unit.empty() || unit == "s" || unit == "sec") {
    scale_ms = 1e3;
  } else if (unit == "ms") {
    scale_ms = 1;
  } else if (unit == "min" || unit == "m") {
    scale_ms = 60e3;
  } else if (unit == "h") {
    scale_ms = 3600e3;
  } else {
    return invalid(cat("'", text, "' has an unknown unit '", unit, "': ", form));
  }
  double value = 0;
  if (number.empty() || !absl::SimpleAtod(to_absl(number), &value) || !std::isfinite(value)) {
    return invalid(cat("'", text, "' is not a duration: ", form));
  }
  const double ms = value * scale_ms;
  if (ms < static_cast<double>(kMinCommTimeout.count()) ||
      ms > static_cast<double>(kMaxCommTimeout.count())) {
    return invalid(cat("'", text, "' is out of range: ", form));
  }
  return std::chrono::milliseconds(static_cast<int64_t>(std::llround(ms)));
}

std::string format_duration(std::chrono::milliseconds duration) {
  const int64_t ms = duration.count();
  if (ms < 1000) return cat(ms, " ms");
  if (ms % 1000 == 0) return cat(ms / 1000, " s");
  return cat(static_cast<double>(ms) / 1e3, " s");
}

}  // namespace strata
