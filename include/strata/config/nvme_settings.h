// How configuration speaks to the NVMe floor: the STRATA_* variables behind its settings (nvme/
// names none itself) and the engine decision resolve() made.
#pragma once

#include "strata/config/config.h"
#include "strata/nvme/io_engine.h"

namespace strata {

// The STRATA_* variables behind the NVMe floor's settings, for its errors and hints
// ("lower STRATA_IO_DEPTH").
IoSettingNames io_setting_names();

// The engine decision resolve() made (requested, chosen, reason, warning).
IoEngineDecision io_engine_decision(const ResolvedConfig& config);

}  // namespace strata
