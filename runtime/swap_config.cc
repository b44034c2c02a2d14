#include "strata/runtime/swap_config.h"

#include <algorithm>
#include <cstddef>

#include "strata/config/nvme_settings.h"

namespace strata {

SwapSpaceOptions swap_space_options(const ResolvedConfig& config, const MemoryTier* cpu_tier) {
  SwapSpaceOptions options;
  options.paths = config.nvme_paths;
  options.bytes_per_path = config.nvme_bytes;
  options.stripe_bytes = config.io_block;
  options.depth = config.io_depth;
  options.engine = config.io_engine.requested;
  options.decided = config.io_engine;  // started as resolve() decided it
  options.verify = config.verify;
  options.names = io_setting_names();
  if (cpu_tier != nullptr) {
    // One buffer per pinning piece, registered as the piece comes into use (the runtime sets
    // the tier's piece listener to SwapSpace::register_buffer), never all at start.
    auto* base = static_cast<std::byte*>(cpu_tier->base());
    const uint64_t capacity = cpu_tier->capacity();
    const uint64_t piece = cpu_tier->piece_bytes() != 0 ? cpu_tier->piece_bytes() : capacity;
    for (uint64_t at = 0; at < capacity; at += piece) {
      options.fixed_buffers.push_back(IoBuffer{base + at, std::min(piece, capacity - at)});
    }
    options.lazy_buffers = true;
  }
  return options;
}

}  // namespace strata
