#include "strata/config/nvme_settings.h"

namespace strata {

IoSettingNames io_setting_names() {
  IoSettingNames names;
  names.engine = "STRATA_IO_ENGINE";
  names.depth = "STRATA_IO_DEPTH";
  names.stripe = "STRATA_IO_BLOCK";
  names.bytes_per_path = "STRATA_NVME_BYTES";
  names.paths = "STRATA_NVME_PATHS";
  return names;
}

IoEngineDecision io_engine_decision(const ResolvedConfig& config) {
  IoEngineDecision decision;
  decision.requested = config.io_engine_requested;
  decision.kind = config.io_engine;
  decision.reason = config.io_engine_reason;
  decision.warning = config.io_engine_warning;
  return decision;
}

}  // namespace strata
