// SwapSpaceOptions from the resolved STRATA_* configuration (the runtime's view of nvme/).
#pragma once

#include "strata/config.h"
#include "strata/swap_space.h"
#include "strata/tier.h"

namespace strata {

// Paths, size, stripe unit, depth, engine and verification from `config`; when `cpu_tier` is
// given its whole slab is registered with io_uring (it holds the staging buffers).
SwapSpaceOptions swap_space_options(const ResolvedConfig& config, const MemoryTier* cpu_tier);

}  // namespace strata
