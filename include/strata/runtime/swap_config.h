// SwapSpaceOptions from the resolved STRATA_* configuration: the runtime's hand-off to nvme/,
// the one place that turns the configuration's values (and its decision of the I/O engine) into
// the NVMe floor's options, with the variables' names for its errors.
#pragma once

#include "strata/config/config.h"
#include "strata/nvme/swap_space.h"
#include "strata/store/tier.h"

namespace strata {

// Paths, size, stripe unit, depth, engine decision and verification from `config`, with the
// variables' names for errors. When `cpu_tier` is given (it holds the staging buffers), each of
// its pinning pieces is a fixed buffer registered lazily: the caller registers piece i with
// SwapSpace::register_buffer(i) from the tier's piece listener, as Runtime::create does.
SwapSpaceOptions swap_space_options(const ResolvedConfig& config, const MemoryTier* cpu_tier);

}  // namespace strata
