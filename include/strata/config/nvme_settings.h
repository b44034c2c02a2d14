// How configuration names the NVMe floor's settings: the STRATA_* variables behind them (nvme/
// names none itself; its messages use these where the caller passes them).
#pragma once

#include "strata/nvme/io_engine.h"

namespace strata {

// The STRATA_* variables behind the NVMe floor's settings, for its errors and hints
// ("lower STRATA_IO_DEPTH").
IoSettingNames io_setting_names();

}  // namespace strata
