// offload-bench --tune: sweeps STRATA_IO_BLOCK x STRATA_IO_DEPTH x STRATA_IO_ENGINE on cpu-nvme
// and nvme-cpu (through the store, no baseline) and recommends the setting with the least pinned
// staging memory (block x depth) among those within 3% of the best mean throughput.
#pragma once

#include <absl/status/status.h>

#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "bench/common.h"
#include "strata/config/config.h"

namespace strata::bench {

// `progress(done, total)` is called after each setting.
absl::Status run_tune(const Options& options, const Config& config,
                      const std::vector<std::string>& nvme_dirs, std::ostream& out,
                      const std::function<void(size_t, size_t)>& progress);

}  // namespace strata::bench
