// offload-bench's GPU link baseline: the raw copy the cpu-gpu and gpu-cpu paths (and the GPU
// half of gpu-nvme and nvme-gpu) are compared with, measured in the same run with the same byte
// count: copy_async between a plain pinned buffer and a plain device allocation on a stream of
// the device (cudaMemcpyAsync on CUDA; on the host backend a memcpy on the device's worker
// thread, the same copy the runtime's host-simulated moves make).
#pragma once

#include <absl/status/statusor.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "bench/common.h"
#include "strata/device/device.h"

namespace strata::bench {

// The GPU arena `bytes` of tensors need (the arena keeps 1/64, at most 64 MiB, as its
// compaction bounce buffer).
uint64_t gpu_tier_bytes(uint64_t bytes);

class GpuBaseline {
 public:
  // `piece_bytes` (on the host backend only): the size of each copy. A host memcpy's speed
  // depends on its size (glibc streams large ones past the cache with non-temporal stores), so
  // the host-simulated link is measured in the pieces the path moves: its tensors. CUDA's link
  // is one copy of `bytes`.
  static absl::StatusOr<std::unique_ptr<GpuBaseline>> create(Device& device, uint64_t bytes,
                                                             uint64_t piece_bytes);
  ~GpuBaseline();
  GpuBaseline(const GpuBaseline&) = delete;
  GpuBaseline& operator=(const GpuBaseline&) = delete;

  // One copy of `bytes` in each direction, waited for.
  absl::Status host_to_device();
  absl::Status device_to_host();
  uint64_t bytes() const { return bytes_; }

  struct Buffers;
  GpuBaseline(Device& device, uint64_t bytes, uint64_t piece_bytes,
              std::unique_ptr<Buffers> buffers);

 private:
  absl::Status copy(bool to_device);

  Device& device_;
  uint64_t bytes_;
  uint64_t piece_bytes_;
  std::unique_ptr<Buffers> buffers_;
};

// "memcpy between ..." or "cudaMemcpyAsync ...": what the GPU baseline is.
const char* gpu_baseline_description(const Device& device);

}  // namespace strata::bench
