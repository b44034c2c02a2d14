#include "strata/base/format_bytes.h"

#include <absl/strings/str_format.h>

#include <array>
#include <string_view>

namespace strata {

std::string format_bytes(uint64_t bytes) {
  static constexpr std::array<std::string_view, 6> kNames = {"KiB", "MiB", "GiB",
                                                             "TiB", "PiB", "EiB"};
  if (bytes < 1024) return absl::StrFormat("%d B", bytes);
  long double value = static_cast<long double>(bytes) / 1024;
  size_t unit = 0;
  while (value >= 1024 && unit + 1 < kNames.size()) {
    value /= 1024;
    ++unit;
  }
  return absl::StrFormat("%.2f %s", static_cast<double>(value), std::string(kNames[unit]));
}

}  // namespace strata
