// The host device: memory, host registrations, copies (cut at the edges of registrations, as
// CudaDevice cuts them, and throttled per link), events and host flags, all issued on the
// streams of host_streams.h; and the test hooks that reach into it.
#include "strata/device/host_device.h"

#include <absl/container/btree_set.h>
#include <absl/strings/str_format.h>
#include <absl/time/clock.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "host_ranges.h"
#include "host_streams.h"
#include "strata/base/mutex.h"
#include "strata/base/size.h"

namespace strata {
namespace {

using detail::DeviceGate;
using detail::HostDeviceState;
using detail::HostStream;
using detail::Link;
using detail::RangeSet;
using detail::StreamQueue;

struct EventState {
  absl::Mutex mu;
  absl::CondVar done;
  uint64_t latest ABSL_GUARDED_BY(mu) = 0;                // sequence of the latest record
  absl::btree_set<uint64_t> pending ABSL_GUARDED_BY(mu);  // records not yet reached
};

// A host flag's state, shared by the flag and the stream work that waits for it.
struct FlagState {
  absl::Mutex mu;
  absl::CondVar changed;
  bool raised ABSL_GUARDED_BY(mu) = false;

  void raise() {
    MutexLock lock(&mu);
    raised = true;
    changed.SignalAll();
  }
  void wait_raised() {
    MutexLock lock(&mu);
    while (!raised) strata::wait(&changed, &mu);
  }
};

class HostFlagImpl final : public HostFlag {
 public:
  explicit HostFlagImpl(std::shared_ptr<const HostDeviceState> shared) : owner(std::move(shared)) {}
  ~HostFlagImpl() override { state->raise(); }
  const std::shared_ptr<const HostDeviceState> owner;
  const std::shared_ptr<FlagState> state = std::make_shared<FlagState>();
};

class HostEvent final : public Event {
 public:
  explicit HostEvent(std::shared_ptr<const HostDeviceState> shared) : owner(std::move(shared)) {}
  const std::shared_ptr<const HostDeviceState> owner;
  const std::shared_ptr<EventState> state = std::make_shared<EventState>();
};

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};

class HostDeviceMemory final : public DeviceMemory {
 public:
  HostDeviceMemory(std::shared_ptr<HostDeviceState> shared,
                   std::unique_ptr<void, FreeDeleter> memory, uint64_t bytes)
      : DeviceMemory(memory.get(), bytes), shared_(std::move(shared)), memory_(std::move(memory)) {}
  ~HostDeviceMemory() override { shared_->device_memory.remove(data()); }

 private:
  std::shared_ptr<HostDeviceState> shared_;
  std::unique_ptr<void, FreeDeleter> memory_;
};

class HostRangeRegistration final : public HostRegistration {
 public:
  HostRangeRegistration(std::shared_ptr<HostDeviceState> shared, const void* data)
      : shared_(std::move(shared)), data_(data) {}
  ~HostRangeRegistration() override { shared_->registered_host.remove(data_); }

 private:
  std::shared_ptr<HostDeviceState> shared_;
  const void* data_;
};

class HostDevice final : public Device {
 public:
  explicit HostDevice(const HostDeviceOptions& options)
      : shared_(std::make_shared<HostDeviceState>(options)) {}

  Backend backend() const override { return Backend::kHost; }

  std::string description() const override {
    const auto& o = shared_->options;
    if (o.h2d_bytes_per_second > 0 || o.d2h_bytes_per_second > 0 || o.d2d_bytes_per_second > 0) {
      return absl::StrFormat(
          "host (simulated device, throttled: H2D %.2f GB/s, D2H %.2f GB/s, "
          "D2D %.2f GB/s; 0 = unthrottled)",
          o.h2d_bytes_per_second / 1e9, o.d2h_bytes_per_second / 1e9, o.d2d_bytes_per_second / 1e9);
    }
    return "host (simulated device in host memory)";
  }

  absl::StatusOr<std::unique_ptr<DeviceMemory>> allocate_device_memory(uint64_t bytes) override {
    if (bytes == 0) return absl::InvalidArgumentError("device allocation of 0 bytes");
    const uint64_t in_use = shared_->device_memory.total();
    if (bytes > shared_->options.memory_bytes - std::min(in_use, shared_->options.memory_bytes)) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "host device: cannot allocate %s of device memory: %s of %s in use; lower "
          "STRATA_GPU_BYTES",
          format_bytes(bytes), format_bytes(in_use), format_bytes(shared_->options.memory_bytes)));
    }
    const uint64_t rounded = (bytes + 4095) / 4096 * 4096;
    std::unique_ptr<void, FreeDeleter> memory(std::aligned_alloc(4096, rounded));
    if (memory == nullptr) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "host device: cannot allocate %s of host memory for the simulated device; lower "
          "STRATA_GPU_BYTES",
          format_bytes(bytes)));
    }
    if (auto status = shared_->device_memory.add(memory.get(), bytes, "device allocation");
        !status.ok()) {
      return status;
    }
    return std::make_unique<HostDeviceMemory>(shared_, std::move(memory), bytes);
  }

  absl::StatusOr<MemoryKind> memory_kind(const void* p) override {
    if (shared_->device_memory.contains(p, 1)) return MemoryKind::kDevice;
    if (shared_->registered_host.contains(p, 1)) return MemoryKind::kRegisteredHost;
    return MemoryKind::kHost;
  }

  absl::StatusOr<std::unique_ptr<HostRegistration>> register_host(void* data,
                                                                  uint64_t bytes) override {
    if (data == nullptr || bytes == 0) {
      return absl::InvalidArgumentError("register_host needs a non-null, non-empty range");
    }
    if (shared_->device_memory.touches(data, bytes)) {
      return absl::InvalidArgumentError("register_host: the range is device memory");
    }
    if (auto status = shared_->registered_host.add(data, bytes, "host registration");
        !status.ok()) {
      return status;
    }
    return std::make_unique<HostRangeRegistration>(shared_, data);
  }

  absl::StatusOr<std::unique_ptr<Stream>> create_stream() override {
    auto queue = std::make_shared<StreamQueue>(shared_);
    queue->id = shared_->add_queue(queue);
    return std::make_unique<HostStream>(std::move(queue));
  }

  absl::StatusOr<std::unique_ptr<Stream>> wrap_external_stream(uintptr_t native) override {
    std::shared_ptr<StreamQueue> queue = shared_->find_queue(native);
    if (queue == nullptr) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "host device: no live stream has the handle %d; the host backend's streams are named "
          "only by the native_handle() of a stream this device created (Python: Stream.handle)",
          native));
    }
    return std::make_unique<HostStream>(std::move(queue));
  }

  absl::StatusOr<uintptr_t> native_handle(Stream& stream) override {
    auto* host_stream = own(stream);
    if (host_stream == nullptr) return foreign("stream");
    return host_stream->queue->id;
  }

  absl::StatusOr<std::unique_ptr<Event>> create_event() override {
    return std::make_unique<HostEvent>(shared_);
  }

  absl::Status copy_async(void* dst, const void* src, uint64_t bytes, CopyKind kind,
                          Stream& stream) override {
    auto* host_stream = own(stream);
    if (host_stream == nullptr) return foreign("stream");
    if (bytes == 0) return absl::OkStatus();
    if (dst == nullptr || src == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s copy of %d bytes with a null pointer", to_string(kind), bytes));
    }
    const bool dst_device = kind != CopyKind::kDeviceToHost;
    const bool src_device = kind != CopyKind::kHostToDevice;
    if (auto status = check_side(dst, bytes, dst_device, "destination", kind); !status.ok()) {
      return status;
    }
    if (auto status = check_side(src, bytes, src_device, "source", kind); !status.ok()) {
      return status;
    }
    const auto d = reinterpret_cast<uintptr_t>(dst);
    const auto s = reinterpret_cast<uintptr_t>(src);
    if (d < s + bytes && s < d + bytes) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s copy of %d bytes between overlapping ranges; cudaMemcpyAsync does not support "
          "overlap: copy in steps no larger than the distance between them",
          to_string(kind), bytes));
    }
    Link* link = kind == CopyKind::kHostToDevice   ? &shared_->h2d
                 : kind == CopyKind::kDeviceToHost ? &shared_->d2h
                                                   : &shared_->d2d;
    // One copy per registration the host side spans, back to back, as CudaDevice issues them
    // (device memory is never registered: a device-to-device copy stays one piece).
    const void* host = kind == CopyKind::kDeviceToHost ? dst : src;
    for (const RangeSet::Segment& piece : shared_->registered_host.segments(host, bytes)) {
      const auto at = static_cast<uint64_t>(piece.data - static_cast<const std::byte*>(host));
      host_stream->enqueue([dst = static_cast<std::byte*>(dst) + at,
                            src = static_cast<const std::byte*>(src) + at, n = piece.bytes, link,
                            kind, gate = shared_->options.gate] {
        if (gate != nullptr) gate->pass(kind);
        const absl::Time finish = link->reserve(n);
        std::memcpy(dst, src, n);
        const absl::Duration left = finish - absl::Now();
        if (left > absl::ZeroDuration()) absl::SleepFor(left);
      });
    }
    return absl::OkStatus();
  }

  absl::Status launch_host_callback(Stream& stream,
                                    absl::AnyInvocable<void() &&> callback) override {
    auto* host_stream = own(stream);
    if (host_stream == nullptr) return foreign("stream");
    if (!callback) return absl::InvalidArgumentError("launch_host_callback: empty callback");
    host_stream->enqueue(std::move(callback));
    return absl::OkStatus();
  }

  absl::StatusOr<std::unique_ptr<HostFlag>> create_host_flag() override {
    return std::make_unique<HostFlagImpl>(shared_);
  }

  absl::Status raise_host_flag(HostFlag& flag) override {
    auto* f = own(flag);
    if (f == nullptr) return foreign("host flag");
    f->state->raise();
    return absl::OkStatus();
  }

  absl::Status wait_host_flag(Stream& stream, HostFlag& flag) override {
    auto* f = own(flag);
    if (f == nullptr) return foreign("host flag");
    auto* host_stream = own(stream);
    if (host_stream == nullptr) return foreign("stream");
    // The stream's worker waits, as a CUDA stream waits on the flag's word: its later work
    // stays queued behind the wait, other streams run on.
    host_stream->enqueue([state = f->state] { state->wait_raised(); });
    return absl::OkStatus();
  }

  absl::Status record(Event& event, Stream& stream) override {
    auto owned = own(event, stream);
    if (!owned.ok()) return owned.status();
    auto [host_event, host_stream] = *owned;
    std::shared_ptr<EventState> state = host_event->state;
    // On an idle stream the event is complete when recorded (nothing is before it; CUDA may
    // report it a moment later, which no caller may rely on): a host consumer's synchronize (an
    // acquisition read through DLPack at once) does not wait for the worker's turn. The
    // stream's lock in idle() orders the work that ran before it.
    if (host_stream->queue->idle()) {
      MutexLock lock(&state->mu);
      ++state->latest;
      state->done.SignalAll();
      return absl::OkStatus();
    }
    uint64_t sequence;
    {
      MutexLock lock(&state->mu);
      sequence = ++state->latest;
      state->pending.insert(sequence);
    }
    host_stream->enqueue([state, sequence] {
      MutexLock lock(&state->mu);
      state->pending.erase(sequence);
      state->done.SignalAll();
    });
    return absl::OkStatus();
  }

  absl::Status wait(Stream& stream, Event& event) override {
    auto owned = own(event, stream);
    if (!owned.ok()) return owned.status();
    auto [host_event, host_stream] = *owned;
    std::shared_ptr<EventState> state = host_event->state;
    uint64_t sequence;
    {
      MutexLock lock(&state->mu);
      sequence = state->latest;
      if (!state->pending.contains(sequence)) return absl::OkStatus();  // already complete
    }
    host_stream->enqueue([state, sequence] {
      MutexLock lock(&state->mu);
      while (state->pending.contains(sequence)) strata::wait(&state->done, &state->mu);
    });
    return absl::OkStatus();
  }

  absl::StatusOr<bool> query(Event& event) override {
    auto* host_event = own(event);
    if (host_event == nullptr) return foreign("event");
    EventState& state = *host_event->state;
    MutexLock lock(&state.mu);
    return !state.pending.contains(state.latest);
  }

  absl::Status synchronize(Event& event) override {
    auto* host_event = own(event);
    if (host_event == nullptr) return foreign("event");
    EventState& state = *host_event->state;
    MutexLock lock(&state.mu);
    const uint64_t sequence = state.latest;
    while (state.pending.contains(sequence)) strata::wait(&state.done, &state.mu);
    return absl::OkStatus();
  }

  absl::Status synchronize(Stream& stream) override {
    auto* host_stream = own(stream);
    if (host_stream == nullptr) return foreign("stream");
    host_stream->drain();
    return absl::OkStatus();
  }

 public:
  HostStream* own(Stream& stream) const {
    auto* s = dynamic_cast<HostStream*>(&stream);
    return s != nullptr && s->owner == shared_ ? s : nullptr;
  }
  HostEvent* own(Event& event) const {
    auto* e = dynamic_cast<HostEvent*>(&event);
    return e != nullptr && e->owner == shared_ ? e : nullptr;
  }
  HostFlagImpl* own(HostFlag& flag) const {
    auto* f = dynamic_cast<HostFlagImpl*>(&flag);
    return f != nullptr && f->owner == shared_ ? f : nullptr;
  }
  absl::StatusOr<std::pair<HostEvent*, HostStream*>> own(Event& event, Stream& stream) const {
    auto* host_event = own(event);
    auto* host_stream = own(stream);
    if (host_event == nullptr) return foreign("event");
    if (host_stream == nullptr) return foreign("stream");
    return std::pair{host_event, host_stream};
  }
  const std::shared_ptr<HostDeviceState>& shared() const { return shared_; }

 private:
  static absl::Status foreign(std::string_view what) {
    return absl::InvalidArgumentError(
        absl::StrFormat("the %s was not created by this host device", what));
  }

  // Device-side pointers must lie inside one device allocation; host-side ones outside all.
  absl::Status check_side(const void* p, uint64_t bytes, bool device_side, std::string_view side,
                          CopyKind kind) const {
    if (device_side && !shared_->device_memory.contains(p, bytes)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s copy: %s [%p, +%d) is not inside one device allocation",
                          to_string(kind), side, p, bytes));
    }
    if (!device_side && shared_->device_memory.touches(p, bytes)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s copy: %s [%p, +%d) is device memory, not host memory",
                          to_string(kind), side, p, bytes));
    }
    return absl::OkStatus();
  }

  std::shared_ptr<HostDeviceState> shared_;
};

absl::StatusOr<HostDevice*> host_device_of(Device& device, std::string_view what) {
  auto* host = dynamic_cast<HostDevice*>(&device);
  if (host == nullptr) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s is a test hook of the host backend; this device is %s", what, device.description()));
  }
  return host;
}

}  // namespace

absl::StatusOr<std::unique_ptr<StreamGate>> hold_stream(Device& device, Stream& stream) {
  auto host = host_device_of(device, "hold_stream");
  if (!host.ok()) return host.status();
  HostStream* host_stream = (*host)->own(stream);
  if (host_stream == nullptr) {
    return absl::InvalidArgumentError("hold_stream: the stream was not created by this device");
  }
  auto state = std::make_shared<StreamGate::State>();
  host_stream->queue->add_gate(state);
  return std::make_unique<StreamGate>(std::move(state));
}

absl::StatusOr<std::unique_ptr<StreamGate>> hold_device(Device& device,
                                                        const std::vector<Stream*>& exempt) {
  auto host = host_device_of(device, "hold_device");
  if (!host.ok()) return host.status();
  DeviceGate gate{std::make_shared<StreamGate::State>(), {}};
  for (Stream* stream : exempt) {
    HostStream* host_stream = stream == nullptr ? nullptr : (*host)->own(*stream);
    if (host_stream == nullptr) {
      return absl::InvalidArgumentError(
          "hold_device: an exempt stream was not created by this device");
    }
    gate.exempt.push_back(host_stream->queue.get());
  }
  auto state = gate.state;
  (*host)->shared()->add_gate(std::move(gate));
  return std::make_unique<StreamGate>(std::move(state));
}

void HostCopyGate::close(CopyKind kind) {
  MutexLock lock(&mu_);
  closed_[static_cast<size_t>(kind)] = true;
}

void HostCopyGate::open(CopyKind kind) {
  MutexLock lock(&mu_);
  closed_[static_cast<size_t>(kind)] = false;
  changed_.SignalAll();
}

void HostCopyGate::wait_held(CopyKind kind, uint64_t count) {
  MutexLock lock(&mu_);
  while (held_[static_cast<size_t>(kind)] < count) wait(&changed_, &mu_);
}

uint64_t HostCopyGate::passed(CopyKind kind) const {
  MutexLock lock(&mu_);
  return passed_[static_cast<size_t>(kind)];
}

void HostCopyGate::pass(CopyKind kind) {
  const auto k = static_cast<size_t>(kind);
  MutexLock lock(&mu_);
  ++passed_[k];
  if (!closed_[k]) return;
  ++held_[k];
  changed_.SignalAll();
  while (closed_[k]) wait(&changed_, &mu_);
  --held_[k];
}

absl::StatusOr<std::unique_ptr<Device>> make_host_device(HostDeviceOptions options) {
  if (options.h2d_bytes_per_second < 0 || options.d2h_bytes_per_second < 0 ||
      options.d2d_bytes_per_second < 0) {
    return absl::InvalidArgumentError("host device bandwidths must be >= 0 (0 = unthrottled)");
  }
  if (options.memory_bytes == 0) {
    return absl::InvalidArgumentError("host device memory_bytes must be > 0");
  }
  return std::make_unique<HostDevice>(options);
}

}  // namespace strata
