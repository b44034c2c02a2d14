// HostDevice: a Device whose "device memory" is ordinary host memory.
//
// Copies run on one worker thread per stream, so streams, events and completion order behave as
// on CUDA and code above the device layer is exercised the same way without a GPU. Each copy
// direction can be throttled to a bandwidth, so scheduler tests and simulations see realistic
// timing. It also checks what CUDA would reject: device pointers outside any device allocation,
// overlapping device-to-device copies, use of streams or events from another device.
#pragma once

#include <memory>

#include "strata/device.h"

namespace strata {

struct HostDeviceOptions {
  // Bytes per second per copy direction; 0 means as fast as memcpy. A direction is one shared
  // link: copies on different streams in the same direction queue behind each other.
  double h2d_bytes_per_second = 0;
  double d2h_bytes_per_second = 0;
  double d2d_bytes_per_second = 0;
  // Total "device memory"; allocate_device_memory beyond it fails as cudaMalloc would.
  uint64_t memory_bytes = uint64_t{64} << 30;
};

absl::StatusOr<std::unique_ptr<Device>> make_host_device(HostDeviceOptions options = {});

}  // namespace strata
