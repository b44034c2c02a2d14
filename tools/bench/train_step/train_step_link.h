// The train-step workload's link probes: the raw H2D copy and the raw NVMe read, measured in
// the same run as the steps (the bound's link bandwidth).
#pragma once

#include <absl/status/statusor.h>

#include <cstdint>

#include "strata/device/device.h"
#include "strata/nvme/swap_space.h"
#include "strata/store/tier.h"

namespace strata::bench {

// The probes move this many layers per timing: a sustained rate, as a step's stream of layers
// sees, rather than one request's latency (which on the NVMe read understated the rate the steps
// themselves reached by up to 2x).
inline constexpr uint64_t kProbeLayers = 4;

// Bytes per second of kProbeLayers back-to-back copies of `bytes` from plain pinned memory to a
// plain device allocation, as the store's cpu -> gpu and staging -> gpu copies are.
absl::StatusOr<double> probe_h2d(Device& device, uint64_t bytes);
// Bytes per second of one extent of kProbeLayers layers in the runtime's own swap space, read in
// one request into the pinned CPU tier (registered with io_uring), checksums included.
absl::StatusOr<double> probe_nvme_read(MemoryTier& cpu, SwapSpace& swap, uint64_t layer_bytes);

}  // namespace strata::bench
