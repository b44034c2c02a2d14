#include "strata/testing/swap_config.h"

namespace strata {

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
