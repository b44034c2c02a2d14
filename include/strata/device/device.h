// Device: the seam between strata and an accelerator.
//
// Everything above the device layer talks to memory, streams and events through this interface,
// so every test runs against HostDevice (ordinary memory, copies on worker threads) and the same
// code runs on CudaDevice. Semantics follow CUDA's: work on one stream runs in issue order, work
// on different streams may overlap, an event marks a point in a stream, and a stream can be made
// to wait for an event without blocking the host.
#pragma once

#include <absl/functional/any_invocable.h>
#include <absl/status/status.h>
#include <absl/status/statusor.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "strata/device/backend_kind.h"

namespace strata {

enum class CopyKind { kHostToDevice, kDeviceToHost, kDeviceToDevice };

std::string_view to_string(CopyKind kind);

// What an address is to a device (Device::memory_kind).
enum class MemoryKind {
  kHost,            // ordinary host memory (or memory the device does not know)
  kRegisteredHost,  // host memory registered with the device (pinned)
  kDevice,          // the device's own memory (or memory the device can address directly)
};

std::string_view to_string(MemoryKind kind);

// An ordered queue of device work. Created by a Device; must not outlive it.
class Stream {
 public:
  virtual ~Stream() = default;
};

// A point in a stream's work. Created by a Device; must not outlive it.
class Event {
 public:
  virtual ~Event() = default;
};

// A flag the host raises once; streams can wait for it without blocking the host. What an event
// is for device work, this is for work done on the host (a Gloo collective finishing): later
// device work is ordered after it. Created by a Device; must not outlive it. Destroying a flag
// raises it: a stream that waits for a flag nobody raises would never run again.
class HostFlag {
 public:
  virtual ~HostFlag() = default;
};

// One device allocation, freed on destruction.
class DeviceMemory {
 public:
  virtual ~DeviceMemory() = default;
  void* data() const { return data_; }
  uint64_t size() const { return size_; }

 protected:
  DeviceMemory(void* data, uint64_t size) : data_(data), size_(size) {}

 private:
  void* data_;
  uint64_t size_;
};

// A host range made visible to the device's DMA engines (cudaHostRegister on CUDA); the range is
// unregistered on destruction. The memory itself belongs to the caller.
class HostRegistration {
 public:
  virtual ~HostRegistration() = default;
};

// Page-aligned host memory, registered with the device for as long as it lives.
// aligned_alloc rather than cudaHostAlloc: O_DIRECT and io_uring buffer registration need
// block-aligned anonymous memory, and cudaHostAlloc only promises 256-byte alignment.
class PinnedHostMemory {
 public:
  static constexpr uint64_t kAlignment = 4096;

  PinnedHostMemory(const PinnedHostMemory&) = delete;
  PinnedHostMemory& operator=(const PinnedHostMemory&) = delete;
  ~PinnedHostMemory();

  void* data() const { return data_.get(); }
  uint64_t size() const { return size_; }

  struct FreeDeleter {
    void operator()(void* p) const;
  };
  // Only Device can make one (passkey).
  class Key {
    friend class Device;
    Key() = default;
  };
  PinnedHostMemory(Key, std::unique_ptr<void, FreeDeleter> data, uint64_t size,
                   std::unique_ptr<HostRegistration> registration)
      : data_(std::move(data)), size_(size), registration_(std::move(registration)) {}

 private:
  std::unique_ptr<void, FreeDeleter> data_;
  uint64_t size_;
  // Declared after data_ so it is destroyed (unregistered) before the memory is freed.
  std::unique_ptr<HostRegistration> registration_;
};

class Device {
 public:
  virtual ~Device() = default;

  virtual Backend backend() const = 0;
  // A line for people: "cuda:0 NVIDIA H200 (139.8 GiB)" or "host (simulated device)".
  virtual std::string description() const = 0;
  // The GPU's PCI bus id ("0000:3b:00.0"), the same in every process on this machine that uses
  // it (NCCL needs one GPU per rank); "" where there is no GPU (the host backend) or no answer.
  virtual std::string pci_bus_id() const { return {}; }
  // The GPU's CUDA ordinal (cuda:N); -1 where there is no GPU (the host backend).
  virtual int ordinal() const { return -1; }
  // How many processes (ranks) this process's memory budget on the device assumed share it,
  // itself included: the runtime sizes a percentage GPU arena as a share of the GPU (the
  // configuration's DeviceChoice::sharing) and says so here; 0 when nothing was budgeted as a
  // share (an absolute size, the host backend, a device made outside a runtime). The
  // communicator compares it, across the ranks, with how many really share the GPU
  // (comm/gpu_assignment.h).
  void set_budget_sharing(int ranks) { budget_sharing_.store(ranks, std::memory_order_relaxed); }
  int budget_sharing() const { return budget_sharing_.load(std::memory_order_relaxed); }
  // Makes this device current on the calling thread (cudaSetDevice), for libraries that work on
  // the current device (NCCL); nothing to do on the host backend.
  virtual absl::Status make_current() { return absl::OkStatus(); }
  // What `p` points into (cudaPointerGetAttributes on CUDA; the host backend answers from its
  // own books: its device allocations and registered ranges).
  virtual absl::StatusOr<MemoryKind> memory_kind(const void* p) = 0;

  // One device allocation of `bytes` (the GPU arena is one such allocation, made at start).
  virtual absl::StatusOr<std::unique_ptr<DeviceMemory>> allocate_device_memory(uint64_t bytes) = 0;
  // Makes [data, data + bytes) usable for asynchronous copies.
  virtual absl::StatusOr<std::unique_ptr<HostRegistration>> register_host(void* data,
                                                                          uint64_t bytes) = 0;
  // aligned_alloc(4096) + register_host; `what` names the memory in error messages.
  absl::StatusOr<std::unique_ptr<PinnedHostMemory>> allocate_pinned(uint64_t bytes,
                                                                    std::string_view what);

  virtual absl::StatusOr<std::unique_ptr<Stream>> create_stream() = 0;
  virtual absl::StatusOr<std::unique_ptr<Event>> create_event() = 0;

  // Streams made outside strata (a framework's, a consumer's in the DLPack stream protocol).
  //
  // wrap_external_stream returns a Stream that refers to an existing queue without owning it:
  // destroying the wrapper leaves the queue alone, and the queue must outlive the wrapper.
  //   CudaDevice: `native` is a cudaStream_t of this device, including the special handles
  //               0 (default stream), cudaStreamLegacy (1) and cudaStreamPerThread (2).
  //   HostDevice: `native` is the native_handle() of a live stream this device created (host
  //               streams have no other name); anything else is InvalidArgument.
  // native_handle is the inverse: the cudaStream_t as an integer, or the host stream's id.
  virtual absl::StatusOr<std::unique_ptr<Stream>> wrap_external_stream(uintptr_t native) = 0;
  virtual absl::StatusOr<uintptr_t> native_handle(Stream& stream) = 0;

  // Enqueues a copy on `stream`. Device-to-device ranges must not overlap (as cudaMemcpyAsync).
  // Host memory must stay valid until the copy completes.
  virtual absl::Status copy_async(void* dst, const void* src, uint64_t bytes, CopyKind kind,
                                  Stream& stream) = 0;
  // Runs `callback` on a device-owned thread once all earlier work on `stream` is done; later
  // work on `stream` waits for it. The callback must not call into the device.
  virtual absl::Status launch_host_callback(Stream& stream,
                                            absl::AnyInvocable<void() &&> callback) = 0;

  // A new flag, not raised.
  virtual absl::StatusOr<std::unique_ptr<HostFlag>> create_host_flag() = 0;
  // Raises `flag` from any thread (raising it again does nothing): work waiting for it runs.
  virtual absl::Status raise_host_flag(HostFlag& flag) = 0;
  // Later work on `stream` waits until `flag` is raised; the host does not block. CudaDevice: a
  // stream wait on a word of mapped pinned memory (cuStreamWaitValue32); where the driver
  // cannot (no stream memory operations), the host waits here for the flag instead.
  virtual absl::Status wait_host_flag(Stream& stream, HostFlag& flag) = 0;

  // Marks the current end of `stream`'s work; re-recording moves the mark.
  virtual absl::Status record(Event& event, Stream& stream) = 0;
  // Later work on `stream` waits for the event's latest record; the host does not block.
  virtual absl::Status wait(Stream& stream, Event& event) = 0;
  // True when the event's latest record has completed (or it was never recorded).
  virtual absl::StatusOr<bool> query(Event& event) = 0;
  virtual absl::Status synchronize(Event& event) = 0;
  virtual absl::Status synchronize(Stream& stream) = 0;

 private:
  std::atomic<int> budget_sharing_{0};
};

}  // namespace strata
