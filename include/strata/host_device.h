// HostDevice: a Device whose "device memory" is ordinary host memory.
//
// Copies run on one worker thread per stream, so streams, events and completion order behave as
// on CUDA and code above the device layer is exercised the same way without a GPU. Each copy
// direction can be throttled to a bandwidth, so scheduler tests and simulations see realistic
// timing. It also checks what CUDA would reject: device pointers outside any device allocation,
// overlapping device-to-device copies, use of streams or events from another device.
#pragma once

#include <absl/synchronization/mutex.h>

#include <array>
#include <memory>

#include "strata/device.h"

namespace strata {

// Holds copies of chosen directions at the start of their run, until opened: tests show that a
// call returned while its copy was still held, and that the bytes are right once it runs, with no
// timing involved. Thread-safe.
class HostCopyGate {
 public:
  void close(CopyKind kind);
  void open(CopyKind kind);
  // Blocks until `count` copies of `kind` are being held at once.
  void wait_held(CopyKind kind, uint64_t count);
  // The stream worker's side: returns once copies of `kind` may run.
  void pass(CopyKind kind);

 private:
  mutable absl::Mutex mu_;
  absl::CondVar changed_;
  std::array<bool, 3> closed_ ABSL_GUARDED_BY(mu_) = {};
  std::array<uint64_t, 3> held_ ABSL_GUARDED_BY(mu_) = {};
};

struct HostDeviceOptions {
  // Bytes per second per copy direction; 0 means as fast as memcpy. A direction is one shared
  // link: copies on different streams in the same direction queue behind each other.
  double h2d_bytes_per_second = 0;
  double d2h_bytes_per_second = 0;
  double d2d_bytes_per_second = 0;
  // Total "device memory"; allocate_device_memory beyond it fails as cudaMalloc would.
  uint64_t memory_bytes = uint64_t{64} << 30;
  // Tests only: copies wait at this gate before they run.
  std::shared_ptr<HostCopyGate> gate;
};

absl::StatusOr<std::unique_ptr<Device>> make_host_device(HostDeviceOptions options = {});

}  // namespace strata
