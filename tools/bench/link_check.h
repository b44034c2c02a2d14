// The bench's own check that a path's figure is physically possible: no path moves bytes
// faster than the link its baseline measured in the same run, by more than that link's noise. A
// figure above that is a timing that ended before the bytes arrived (the first GPU run printed
// gpu-cpu at 16,539 GB/s against a 27.7 GB/s link), and fails the run instead of being reported.
#pragma once

#include <absl/status/status.h>

#include "bench/common.h"

namespace strata::bench {

// The least noise allowed above the link's fastest pass. A GPU link (a DMA copy; on the host
// backend a memcpy) does not beat itself by more than a quarter. A disk may: one that the host
// caches (a virtual disk) serves the runtime's reads of bytes it just wrote from memory, so its
// raw baseline is no ceiling (docs/bench.md); still no path is three times its drive.
inline constexpr double kMinLinkNoise = 0.25;
inline constexpr double kMinNvmeLinkNoise = 2.0;
// Extra baseline passes run before a figure above the link fails the run: on a busy machine a
// few passes may all miss the link's speed.
inline constexpr uint64_t kLinkRechecks = 8;

// The fastest a path can go: link_gbps (the baseline's fastest pass) x (1 + noise), where noise
// is the link's minimum (above) or the baseline's spread (max - min) / median, whichever is
// larger. Zero without a baseline.
double link_limit_gbps(const Row& row);

// OK when `row` has no baseline or its runtime median is within link_limit_gbps; else
// FailedPrecondition naming the path, the tensor size, the figure and the limit.
absl::Status check_link(const Row& row);

}  // namespace strata::bench
