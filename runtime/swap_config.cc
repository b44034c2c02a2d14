#include "strata/swap_config.h"

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

SwapSpaceOptions swap_space_options(const ResolvedConfig& config, const MemoryTier* cpu_tier) {
  SwapSpaceOptions options;
  options.paths = config.nvme_paths;
  options.bytes_per_path = config.nvme_bytes;
  options.stripe_bytes = config.io_block;
  options.depth = config.io_depth;
  options.engine = config.io_engine_requested;
  options.decided = io_engine_decision(config);
  options.verify = config.verify;
  options.names = io_setting_names();
  if (cpu_tier != nullptr) {
    options.fixed_buffers.push_back(IoBuffer{cpu_tier->base(), cpu_tier->capacity()});
  }
  return options;
}

}  // namespace strata
