// offload-bench's GPU paths: pinned CPU tier → GPU arena (cpu-gpu) and back (gpu-cpu) through
// MemoryTier blocks, in tensor-sized copies on one stream. The baseline, measured in the same run
// with the same byte count, is the raw copy: cudaMemcpyAsync between a plain pinned buffer and a
// plain device allocation on CUDA, memcpy between two page-aligned host buffers on the host
// backend.
#pragma once

#include <absl/status/statusor.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "bench/common.h"
#include "strata/device.h"

namespace strata::bench {

// The GPU arena the GPU paths need for `bytes` (the arena keeps 1/64, at most 64 MiB, as its
// compaction bounce buffer).
uint64_t gpu_tier_bytes(uint64_t bytes);

// Runs the GPU paths `options` asks for, copying between `source` and `landing` (pinned, at
// least options.bytes each; `source` holds the data) and a GPU arena block. DataLoss when a byte
// did not round-trip.
absl::StatusOr<std::vector<Row>> run_gpu_paths(const Options& options, Device& device,
                                               std::byte* source, std::byte* landing);

// "memcpy between ..." or "cudaMemcpyAsync ...": what the GPU paths' baseline is.
const char* gpu_baseline_description(const Device& device);

}  // namespace strata::bench
