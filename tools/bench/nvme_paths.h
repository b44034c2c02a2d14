// offload-bench's NVMe paths: cpu-nvme (pinned CPU tier → SwapSpace extents) and nvme-cpu (back),
// through the runtime, next to RawIo (the fio-equivalent baseline) on files in the same
// directories, alternated repetition by repetition.
#pragma once

#include <absl/status/statusor.h>

#include <cstddef>
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "bench/common.h"
#include "strata/config.h"
#include "strata/swap_space.h"
#include "strata/tier.h"

namespace strata::bench {

// Where tensor i lives in the CPU tier blocks: every tensor starts on a page so that it can be
// an O_DIRECT buffer by itself.
uint64_t tensor_stride(const Options& options);
uint64_t nvme_cpu_block_bytes(const Options& options);  // tensors() * tensor_stride()

// STRATA_NVME_BYTES for the bench: room for every tensor's extent striped over `paths` paths in
// `stripe` units, plus slack for the allocator.
uint64_t nvme_bytes_per_path(const Options& options, uint64_t stripe, uint64_t paths);

struct NvmeResult {
  std::vector<Row> rows;
  SwapStats stats;                 // the engine that ran and why, request counts
  std::vector<std::string> notes;  // how the baseline ran (or why it did not)
};

// Runs the NVMe paths `options` asks for. `source` and `landing` are pinned blocks of
// nvme_cpu_block_bytes() in `cpu_tier`; `source` holds the data. Writes "nvme: ..." lines
// (directories, engine) to `human` once the swap space exists. DataLoss when a byte did not
// round-trip.
absl::StatusOr<NvmeResult> run_nvme_paths(const Options& options, const ResolvedConfig& config,
                                          const std::string& dirs_description, MemoryTier& cpu_tier,
                                          std::byte* source, std::byte* landing,
                                          std::ostream& human);

}  // namespace strata::bench
