// offload-bench's paths, all through the public TensorStore API (what a trainer gets): a Runtime
// with its tiers sized to the pass, so that every timed pass moves exactly --bytes without
// evicting. Each timed pass ends when its bytes are where they must be; the state it starts from
// is set up untimed before each repetition:
//   cpu-gpu   CPU-homed, no GPU copy          acquire(gpu, read) + release, then synchronize
//   gpu-cpu   CPU-homed, written on the GPU   evict(gpu) each, then wait_evicted: written home
//   cpu-nvme  NVMe-homed, written on the CPU  flush(): write-backs to the NVMe home
//   nvme-cpu  NVMe-homed, no CPU copy         set_access_order, acquire(cpu, read) + release
//   gpu-nvme  NVMe-homed, written on the GPU  flush() through staging, then evict(gpu) (clean)
//   nvme-gpu  NVMe-homed, no CPU or GPU copy  set_access_order, acquire(gpu, read) + release:
//                                             staged from NVMe, the next tensors read ahead
// After every pass the store must have nothing in flight (else the run fails: its time would
// leave work out); a figure above its link's limit fails the run (link_check.h).
// Every path's bytes are checked after its repetitions (a fresh pattern per repetition for the
// write paths, so a write-back that did nothing is caught); DataLoss on a mismatch.
// Baselines, measured in the same run with the same bytes and alternated with the runtime: the
// raw GPU copy (gpu_paths.h) for cpu-gpu/gpu-cpu, RawIo (raw_io.h) for cpu-nvme/nvme-cpu, and
// the lower of the two for gpu-nvme/nvme-gpu. The NVMe rows also report the staging pool's use
// and the reads in flight over their runtime passes (Row::nvme_use).
#pragma once

#include <absl/status/statusor.h>

#include <ostream>
#include <string>
#include <vector>

#include "bench/common.h"
#include "strata/config/config.h"

namespace strata::bench {

struct PathsResult {
  std::vector<Row> rows;
  std::string engine;  // the I/O engine that ran and why (empty: no NVMe path ran)
  std::string engine_reason;
  std::vector<std::string> notes;  // how the baselines ran (or why they did not)
};

// Runs the paths `options` asks for at options.tensor_bytes. `config` is the environment's;
// `nvme_dirs` the NVMe paths' directories. Writes "nvme: ..." lines to `human`.
absl::StatusOr<PathsResult> run_store_paths(const Options& options, const Config& config,
                                            const std::vector<std::string>& nvme_dirs,
                                            std::ostream& human);

}  // namespace strata::bench
