#include "bench/link_check.h"

#include <absl/strings/str_format.h>

#include <algorithm>

#include "strata/base/format_bytes.h"

namespace strata::bench {

double link_limit_gbps(const Row& row) {
  if (!row.baseline.has_value()) return 0;
  const Summary& b = *row.baseline;
  // Relative to the median: one pass slowed by another tenant widens the allowance by at most
  // max / median, not without bound.
  const double spread = b.median > 0 ? (b.max - b.min) / b.median : 0;
  const double floor = row.nvme_link ? kMinNvmeLinkNoise : kMinLinkNoise;
  return std::max(row.link_gbps, b.max) * (1 + std::max(floor, spread));
}

absl::Status check_link(const Row& row) {
  if (!row.baseline.has_value()) return absl::OkStatus();
  const double limit = link_limit_gbps(row);
  if (row.runtime.median <= limit) return absl::OkStatus();
  const double fastest = std::max(row.link_gbps, row.baseline->max);
  return absl::FailedPreconditionError(absl::StrFormat(
      "%s with %s tensors: %.2f GB/s is above what its link can carry, %.2f GB/s (the %s "
      "baseline's fastest of %d passes, %.2f GB/s, plus %.0f%% for noise), so it is not "
      "reported: the timed pass ended before its bytes had moved (a bench bug: please report "
      "this line), or the machine was too busy to measure its link (rerun when it is quieter)",
      row.path, format_bytes(row.tensor_bytes), row.runtime.median, limit,
      row.nvme_link ? "nvme" : "gpu", row.repeats + row.link_rechecks, fastest,
      (limit / fastest - 1) * 100));
}

}  // namespace strata::bench
