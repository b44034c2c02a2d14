// The host device's streams: a FIFO of work per stream, run in issue order by one worker thread,
// as a CUDA stream runs it; the gates that hold that work (test hooks, see host_device.h); and
// the state a host device shares with every stream it made. Private to device/: host_device.cc
// issues work on these queues, host_streams.cc runs them.
#pragma once

#include <absl/container/btree_map.h>
#include <absl/functional/any_invocable.h>
#include <absl/synchronization/mutex.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <thread>
#include <vector>

#include "host_ranges.h"
#include "strata/device/host_device.h"

namespace strata {

// A gate's state, shared by the gate and the work it holds.
struct StreamGate::State {
  mutable absl::Mutex mu;
  mutable absl::CondVar changed;
  bool open ABSL_GUARDED_BY(mu) = false;
  uint64_t held ABSL_GUARDED_BY(mu) = 0;

  bool is_open() const;
  // Runs on a stream's worker: waits until the gate opens.
  void pass();
};

namespace detail {

using StreamWork = absl::AnyInvocable<void() &&>;

class StreamQueue;

// A device-wide gate and the queues it does not hold.
struct DeviceGate {
  std::shared_ptr<StreamGate::State> state;
  std::vector<const StreamQueue*> exempt;
};

// State shared by a host device and everything it made, so late work never touches a dead
// device: its memory and registrations, its links, its gates and its streams' handles.
struct HostDeviceState {
  explicit HostDeviceState(const HostDeviceOptions& o)
      : options(o),
        h2d(o.h2d_bytes_per_second),
        d2h(o.d2h_bytes_per_second),
        d2d(o.d2d_bytes_per_second) {}
  const HostDeviceOptions options;
  RangeSet device_memory;
  RangeSet registered_host;
  Link h2d, d2h, d2d;

  // The closed device-wide gates that hold work issued on `queue` now.
  std::vector<std::shared_ptr<StreamGate::State>> device_gates_for(const StreamQueue* queue);
  void add_gate(DeviceGate gate);

  // Host streams' native handles: ids from 16 up, so they never read as DLPack's special stream
  // values (-1, 0, 1, 2) or as null.
  uint64_t add_queue(const std::shared_ptr<StreamQueue>& queue);
  void remove_queue(uint64_t id);
  std::shared_ptr<StreamQueue> find_queue(uint64_t id);

 private:
  absl::Mutex mu;
  std::vector<DeviceGate> gates ABSL_GUARDED_BY(mu);
  uint64_t next_stream_id ABSL_GUARDED_BY(mu) = 16;
  absl::btree_map<uint64_t, std::weak_ptr<StreamQueue>> queues ABSL_GUARDED_BY(mu);
};

// A FIFO of work executed by one worker thread, like a CUDA stream.
class StreamQueue {
 public:
  explicit StreamQueue(std::shared_ptr<HostDeviceState> shared);
  ~StreamQueue();  // lets queued work finish first, as cudaStreamDestroy does

  // Closed gates hold this work: it passes each of them before it runs.
  void enqueue(StreamWork op);
  void add_gate(std::shared_ptr<StreamGate::State> gate);
  // Returns once all work enqueued before the call has run.
  void drain();
  // True when all work enqueued so far has run and no closed gate would hold new work: a marker
  // issued now (an event's record) is complete at once, with no trip through the worker.
  bool idle();

  const std::shared_ptr<HostDeviceState> owner;  // keeps the links alive for queued copies
  uint64_t id = 0;                               // the native handle; set once, by create_stream

 private:
  void run();

  absl::Mutex mu_;
  absl::CondVar work_;
  absl::CondVar idle_;
  std::deque<StreamWork> queue_ ABSL_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<StreamGate::State>> gates_ ABSL_GUARDED_BY(mu_);
  uint64_t submitted_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t completed_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread worker_;  // last: starts after every member it uses exists
};

// A Stream of the host device: a handle on a queue. The stream create_stream returns and every
// wrapper wrap_external_stream makes for it share the queue; the queue lives while any does.
class HostStream final : public Stream {
 public:
  explicit HostStream(std::shared_ptr<StreamQueue> q) : owner(q->owner), queue(std::move(q)) {}
  void enqueue(StreamWork op) { queue->enqueue(std::move(op)); }
  void drain() { queue->drain(); }
  const std::shared_ptr<HostDeviceState> owner;
  const std::shared_ptr<StreamQueue> queue;
};

}  // namespace detail
}  // namespace strata
