// SwapSpaceOptions from the resolved STRATA_* configuration (the runtime's view of nvme/): the
// place where the runtime hands the NVMe floor its values and the names of their variables.
#pragma once

#include "strata/config.h"
#include "strata/io_engine.h"
#include "strata/swap_space.h"
#include "strata/tier.h"

namespace strata {

// The STRATA_* variables behind the NVMe floor's settings, for its errors and hints
// ("lower STRATA_IO_DEPTH").
IoSettingNames io_setting_names();

// The engine decision resolve() made (requested, chosen, reason, warning).
IoEngineDecision io_engine_decision(const ResolvedConfig& config);

// Paths, size, stripe unit, depth, engine decision and verification from `config`, with the
// variables' names for errors; when `cpu_tier` is given its whole slab is registered with
// io_uring (it holds the staging buffers).
SwapSpaceOptions swap_space_options(const ResolvedConfig& config, const MemoryTier* cpu_tier);

}  // namespace strata
