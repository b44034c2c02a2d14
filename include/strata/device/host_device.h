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
#include <vector>

#include "strata/device/device.h"

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
  // Copies of `kind` that reached the gate, open or closed. A copy whose host side spans
  // several registrations counts once per piece, as CudaDevice issues it.
  uint64_t passed(CopyKind kind) const;
  // The stream worker's side: returns once copies of `kind` may run.
  void pass(CopyKind kind);

 private:
  mutable absl::Mutex mu_;
  absl::CondVar changed_;
  std::array<bool, 3> closed_ ABSL_GUARDED_BY(mu_) = {};
  std::array<uint64_t, 3> held_ ABSL_GUARDED_BY(mu_) = {};
  std::array<uint64_t, 3> passed_ ABSL_GUARDED_BY(mu_) = {};
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

// ---- test hooks --------------------------------------------------------------------------
//
// A StreamGate holds device work until it opens: work issued on the streams it covers while it
// is closed (copies, host callbacks, event records and waits) starts only after open(), in issue
// order as always. Work issued before the gate closed is not held. Tests use it to show, without
// timing, what a call does not wait for: hold, call, check the call returned and the work has
// not run, open, check the work ran in order.
//
// Open the gate before destroying a stream it holds (destroying a stream lets its queued work
// finish, and held work finishes only after the gate opens). Destroying the gate opens it.
class StreamGate {
 public:
  struct State;
  explicit StreamGate(std::shared_ptr<State> state);
  StreamGate(const StreamGate&) = delete;
  StreamGate& operator=(const StreamGate&) = delete;
  ~StreamGate();

  void open();
  bool is_open() const;
  // Work that reached the closed gate and waits there now.
  uint64_t held() const;
  // Blocks until at least `count` pieces of work wait at the gate (they were issued and reached
  // it), or the gate is open. A count, not a time: a test can wait for "the copy is held".
  void wait_until_held(uint64_t count) const;

 private:
  std::shared_ptr<State> state_;
};

// Holds work issued on `stream` (and on any Stream wrapping the same queue). `device` must be a
// host device and `stream` one of its streams.
absl::StatusOr<std::unique_ptr<StreamGate>> hold_stream(Device& device, Stream& stream);
// Holds work issued on every stream of `device`, streams created later included, except the
// streams in `exempt` (e.g. a consumer's stream whose own waits a test wants to observe).
absl::StatusOr<std::unique_ptr<StreamGate>> hold_device(Device& device,
                                                        const std::vector<Stream*>& exempt = {});

}  // namespace strata
