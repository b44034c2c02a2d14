#include "nccl_communicator.h"

#include <absl/time/time.h>

#include <cstring>
#include <deque>
#include <functional>
#include <vector>

#include "collective_call.h"
#include "communicator_base.h"
#include "gpu_assignment.h"
#include "job_monitor.h"
#include "nccl_api.h"
#include "nccl_support.h"
#include "strata/base/log.h"
#include "strata/base/mutex.h"
#include "strata/base/text.h"
#include "strata/device/device.h"

namespace strata::comm_internal {
namespace {

using text::cat;
using text::to_absl;

// Device scratch: the barrier's int at 0, this rank's signature at kSignatureOffset, every rank's
// from kGatherOffset (STRATA_COMM_DEBUG).
constexpr uint64_t kSignatureBytes = sizeof(CollectiveCall::Signature);
constexpr uint64_t kSignatureOffset = 64;
constexpr uint64_t kGatherOffset = 128;

const char* at(const void* base, uint64_t elements, DataType type) {
  return static_cast<const char*>(base) + elements * element_size(type);
}
char* at(void* base, uint64_t elements, DataType type) {
  return static_cast<char*>(base) + elements * element_size(type);
}

struct NcclParts {
  ncclComm_t comm = nullptr;
  int ordinal = 0;
  int version = 0;
  std::unique_ptr<Stream> stream;
  cudaStream_t stream_handle = nullptr;  // the stream's native handle, for NCCL
  std::unique_ptr<DeviceMemory> scratch;
  std::unique_ptr<PinnedHostMemory> signatures;  // STRATA_COMM_DEBUG only
  std::unique_ptr<JobMonitor> monitor;
};

class NcclCommunicator final : public CommunicatorBase {
 public:
  NcclCommunicator(const CommOptions& options, NcclParts parts)
      : CommunicatorBase(options, std::move(parts.monitor)),
        ordinal_(parts.ordinal),
        version_(parts.version),
        stream_(std::move(parts.stream)),
        stream_handle_(parts.stream_handle),
        scratch_(std::move(parts.scratch)),
        signatures_(std::move(parts.signatures)),
        comm_(parts.comm) {
    watchdog_ = std::thread([this] { watch(); });
  }

  ~NcclCommunicator() override;

  CommBackendKind backend() const override { return CommBackendKind::kNccl; }

 protected:
  std::string engine() const override {
    return cat("nccl ", version_ / 10000, ".", version_ / 100 % 100, ".", version_ % 100,
               " on cuda:", ordinal_);
  }
  absl::Status check_options(const CollectiveOptions& options) override {
    return stream_for(options).status();
  }
  absl::StatusOr<std::unique_ptr<CollectiveWork>> start(const Operation& op,
                                                        const CollectiveOptions& options) override;
  absl::StatusOr<std::vector<CollectiveCall::Signature>> exchange_signatures(
      const CollectiveCall& call, const CollectiveOptions& options) override;
  void abort_transport() override;
  void on_broken(const absl::Status& error) override;
  // A group's own NCCL communicator: split off this one by ncclCommSplit where the library has
  // it (NCCL 2.18+; under mutex_, so no other call on comm_ runs meanwhile), else from a unique
  // id exchanged through the group's rendezvous.
  absl::StatusOr<std::unique_ptr<Communicator>> create_split(const CommOptions& options,
                                                             std::unique_ptr<JobMonitor> monitor,
                                                             int color, int key) override;

 private:
  struct Pending {
    CollectiveCall call;
    EventPtr start;  // the operation's turn on its stream: the timeout counts from here
    EventPtr end;
    std::optional<Clock::time_point> started;
    std::shared_ptr<OpState> state;
  };
  struct Failure {
    CollectiveCall call;
    std::string local;  // in the engine's words
  };
  // A call's stream: the Device's, for events and copies, and its handle, for NCCL.
  struct CallStream {
    Stream* stream;
    cudaStream_t handle;
  };

  ncclResult_t enqueue(const Operation& op, cudaStream_t s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // ncclGroupStart, one call per rank with elements (every rank skips the same empty ones),
  // ncclGroupEnd.
  ncclResult_t group(const CollectiveCall& c,
                     const std::function<ncclResult_t(int peer, uint64_t offset)>& each) const;

  Device& device() const { return *options().device; }

  absl::StatusOr<CallStream> stream_for(const CollectiveOptions& options) const {
    if (options.stream == nullptr) return CallStream{stream_.get(), stream_handle_};
    absl::StatusOr<uintptr_t> native = device().native_handle(*options.stream);
    if (!native.ok()) return native.status();
    return CallStream{options.stream, reinterpret_cast<cudaStream_t>(*native)};
  }
  // "" or the error's words (the device's, which name the CUDA call).
  static std::string words(const absl::Status& status) {
    return status.ok() ? std::string() : std::string(text::to_std(status.message()));
  }

  std::string settle_locked(ncclResult_t result, std::string_view what)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  std::string wait_event_locked(Event& event, std::string_view what)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);

  void watch();
  std::optional<Failure> poll(bool& exit);

  const int ordinal_;
  const int version_;
  std::unique_ptr<Stream> stream_;
  const cudaStream_t stream_handle_;
  std::unique_ptr<DeviceMemory> scratch_;
  std::unique_ptr<PinnedHostMemory> signatures_;

  mutable absl::Mutex mutex_;  // after the base's issue lock
  absl::CondVar cv_;           // pending_ changed, or stopping_
  // Null once aborted or destroyed. NCCL calls on it are made under mutex_, so an abort never
  // frees it under another call.
  ncclComm_t comm_ ABSL_GUARDED_BY(mutex_);
  bool stopping_ ABSL_GUARDED_BY(mutex_) = false;
  std::deque<Pending> pending_ ABSL_GUARDED_BY(mutex_);
  std::thread watchdog_;
};

ncclResult_t NcclCommunicator::enqueue(const Operation& op, cudaStream_t s) {
  const CollectiveCall& c = op.call;
  const bool equal =
      std::all_of(c.counts.begin(), c.counts.end(), [&](uint64_t n) { return n == c.counts[0]; });
  const void* send = op.send;
  void* recv = op.recv;
  switch (c.kind) {
    case CollectiveKind::kAllGather:
      if (equal) return nccl().AllGather(send, recv, c.counts[0], nccl_type(c.type), comm_, s);
      // Uneven shards: one broadcast per rank into its slice (PyTorch's all_gather_v), fused
      // into one group.
      return group(c, [&](int peer, uint64_t offset) {
        char* slice = at(recv, offset, c.type);
        return nccl().Broadcast(peer == rank() ? send : slice, slice, c.counts[peer],
                                nccl_type(c.type), peer, comm_, s);
      });
    case CollectiveKind::kReduceScatter:
      if (equal) {
        return nccl().ReduceScatter(send, recv, c.counts[0], nccl_type(c.type), nccl_op(c.op),
                                    comm_, s);
      }
      // Uneven shards: one reduce per rank, rooted there (NCCL reads recvbuff on the root only,
      // so the other ranks need no scratch).
      return group(c, [&](int peer, uint64_t offset) {
        return nccl().Reduce(at(send, offset, c.type), peer == rank() ? recv : nullptr,
                             c.counts[peer], nccl_type(c.type), nccl_op(c.op), peer, comm_, s);
      });
    case CollectiveKind::kAllReduce:
      return nccl().AllReduce(send, recv, c.counts[0], nccl_type(c.type), nccl_op(c.op), comm_, s);
    case CollectiveKind::kBroadcast:
      return nccl().Broadcast(send, recv, c.counts[0], nccl_type(c.type), c.root, comm_, s);
    case CollectiveKind::kBarrier:
      // An all-reduce of one int on the scratch: later work on the stream waits for every rank.
      return nccl().AllReduce(scratch_->data(), scratch_->data(), 1, ncclInt32, ncclSum, comm_, s);
  }
  return ncclInvalidArgument;
}

ncclResult_t NcclCommunicator::group(
    const CollectiveCall& c,
    const std::function<ncclResult_t(int peer, uint64_t offset)>& each) const {
  ncclResult_t result = nccl().GroupStart();
  if (result != ncclSuccess) return result;
  uint64_t offset = 0;
  for (int peer = 0; peer < size(); ++peer) {
    if (c.counts[peer] > 0) {
      result = each(peer, offset);
      if (result != ncclSuccess && result != ncclInProgress) {
        (void)nccl().GroupEnd();
        return result;
      }
    }
    offset += c.counts[peer];
  }
  return nccl().GroupEnd();
}

absl::StatusOr<std::unique_ptr<CollectiveWork>> NcclCommunicator::start(
    const Operation& op, const CollectiveOptions& options) {
  const CollectiveCall& call = op.call;
  absl::StatusOr<CallStream> stream = stream_for(options);
  if (!stream.ok()) return fail(call, text::to_std(stream.status().message()));
  if (settings().debug) {
    if (absl::Status s = check_signatures(call, options); !s.ok()) return s;
  }
  auto state = std::make_shared<OpState>();
  // Every rank knows every count, so all skip the same empty operations.
  const bool run = call.kind == CollectiveKind::kBarrier || call.total_count() > 0;
  EventPtr start, end;
  std::string local;
  if (run) {
    absl::StatusOr<std::unique_ptr<Event>> s = device().create_event();
    absl::StatusOr<std::unique_ptr<Event>> e = s.ok() ? device().create_event() : s.status();
    if (e.ok()) {
      start = EventPtr(*std::move(s));
      end = EventPtr(*std::move(e));
    } else {
      local = std::string(e.status().message());
    }
  }
  {
    MutexLock lock(&mutex_);
    if (comm_ == nullptr) {
      local = "the NCCL communicator was aborted";
    } else if (local.empty()) {
      local = words(device().make_current());
    }
    if (local.empty() && run) {
      local = words(device().record(*start, *stream->stream));
      if (local.empty()) local = settle_locked(enqueue(op, stream->handle), call.describe());
      if (local.empty()) local = words(device().record(*end, *stream->stream));
      if (local.empty()) {
        pending_.push_back(Pending{call, start, end, std::nullopt, state});
        cv_.SignalAll();
      }
    } else if (local.empty()) {
      state->finish(absl::OkStatus());  // nothing to move
    }
  }
  if (!local.empty()) return fail(call, local);
  return std::make_unique<NcclWork>(device(), call.sequence, call.describe(), settings().timeout,
                                    health(), std::move(state), std::move(end));
}

// Every rank all-gathers every rank's signature of this call through NCCL, on the call's stream.
// The host waits (bounded): debug mode only.
absl::StatusOr<std::vector<CollectiveCall::Signature>> NcclCommunicator::exchange_signatures(
    const CollectiveCall& call, const CollectiveOptions& options) {
  absl::StatusOr<CallStream> stream = stream_for(options);
  if (!stream.ok()) return stream.status();
  absl::StatusOr<std::unique_ptr<Event>> done = device().create_event();
  if (!done.ok()) return done.status();
  const CollectiveCall::Signature mine = call.signature();
  auto* host = static_cast<uint8_t*>(signatures_->data());
  std::memcpy(host, mine.data(), kSignatureBytes);
  auto* scratch = static_cast<uint8_t*>(scratch_->data());
  const uint64_t table_bytes = kSignatureBytes * static_cast<uint64_t>(size());
  std::string local;
  {
    MutexLock lock(&mutex_);
    if (comm_ == nullptr) return absl::AbortedError("the NCCL communicator was aborted");
    local = words(device().make_current());
    if (local.empty()) {
      local = words(device().copy_async(scratch + kSignatureOffset, host, kSignatureBytes,
                                        CopyKind::kHostToDevice, *stream->stream));
    }
    if (local.empty()) {
      local = settle_locked(nccl().AllGather(scratch + kSignatureOffset, scratch + kGatherOffset,
                                             kSignatureBytes, ncclUint8, comm_, stream->handle),
                            "ncclAllGather");
    }
    if (local.empty()) {
      local = words(device().copy_async(host + kSignatureBytes, scratch + kGatherOffset,
                                        table_bytes, CopyKind::kDeviceToHost, *stream->stream));
    }
    if (local.empty()) local = words(device().record(**done, *stream->stream));
    if (local.empty()) local = wait_event_locked(**done, "the signature exchange");
  }
  if (!local.empty()) return absl::UnavailableError(to_absl(local));
  std::vector<CollectiveCall::Signature> all(size());
  std::memcpy(all.data(), host + kSignatureBytes, table_bytes);
  return all;
}

// A non-blocking communicator may still be enqueuing when a call returns (ncclInProgress): poll
// until it is done, bounded by the timeout. Returns the failure in words, or "".
std::string NcclCommunicator::settle_locked(ncclResult_t result, std::string_view what) {
  const auto deadline = Clock::now() + settings().timeout;
  Backoff backoff;
  while (result == ncclInProgress) {
    if (Clock::now() >= deadline) {
      return cat(what, " was still being enqueued by NCCL after STRATA_COMM_TIMEOUT (",
                 format_duration(settings().timeout), ")");
    }
    backoff.pause();
    ncclResult_t async = ncclSuccess;
    const ncclResult_t r = nccl().CommGetAsyncError(comm_, &async);
    result = r != ncclSuccess ? r : async;
  }
  return result == ncclSuccess ? std::string() : nccl_error(result, what);
}

// Waits on the host for `event`, bounded by the timeout and ended early by an NCCL error.
std::string NcclCommunicator::wait_event_locked(Event& event, std::string_view what) {
  const auto deadline = Clock::now() + settings().timeout;
  Backoff backoff;
  while (true) {
    absl::StatusOr<bool> done = device().query(event);
    if (!done.ok()) return cat(what, ": ", done.status().message());
    if (*done) return {};
    ncclResult_t async = ncclSuccess;
    if (ncclResult_t r = nccl().CommGetAsyncError(comm_, &async); r != ncclSuccess) async = r;
    if (async != ncclSuccess && async != ncclInProgress) return nccl_error(async, what);
    if (Clock::now() >= deadline) {
      return cat(what, " did not finish within STRATA_COMM_TIMEOUT (",
                 format_duration(settings().timeout), ")");
    }
    backoff.pause();
  }
}

// The watchdog: records each operation's completion, and turns an operation that runs past the
// timeout, or an asynchronous NCCL error, into an abort and the job's error.
void NcclCommunicator::watch() {
  (void)device().make_current();
  bool exit = false;
  while (!exit) {
    if (std::optional<Failure> failure = poll(exit)) (void)fail(failure->call, failure->local);
  }
}

std::optional<NcclCommunicator::Failure> NcclCommunicator::poll(bool& exit) {
  constexpr absl::Duration kPollPeriod = absl::Milliseconds(1);
  MutexLock lock(&mutex_);
  if (pending_.empty() || comm_ == nullptr) {
    if (stopping_) {
      exit = true;
      return std::nullopt;
    }
    (void)wait_with_timeout(&cv_, &mutex_, absl::Milliseconds(100));
    return std::nullopt;
  }
  ncclResult_t async = ncclSuccess;
  if (ncclResult_t r = nccl().CommGetAsyncError(comm_, &async); r != ncclSuccess) async = r;
  if (async != ncclSuccess && async != ncclInProgress) {
    return Failure{pending_.front().call, nccl_error(async, "NCCL (an asynchronous error)")};
  }
  const auto now = Clock::now();
  for (auto it = pending_.begin(); it != pending_.end();) {
    absl::StatusOr<bool> done = device().query(*it->end);
    if (done.ok() && *done) {
      it->state->finish(absl::OkStatus());
      it = pending_.erase(it);
      continue;
    }
    if (!done.ok()) return Failure{it->call, words(done.status())};
    if (!it->started) {
      absl::StatusOr<bool> started = device().query(*it->start);
      if (started.ok() && *started) it->started = now;
    }
    if (it->started && now - *it->started > settings().timeout) {
      return Failure{it->call, cat("the operation did not finish within STRATA_COMM_TIMEOUT (",
                                   format_duration(settings().timeout),
                                   ") after its turn on the stream came")};
    }
    ++it;
  }
  if (pending_.empty()) {
    cv_.SignalAll();  // the destructor waits for this
  } else {
    (void)wait_with_timeout(&cv_, &mutex_, kPollPeriod);
  }
  return std::nullopt;
}

// The first failure aborts the communicator, ending any NCCL kernel that waits on a peer.
void NcclCommunicator::abort_transport() {
  MutexLock lock(&mutex_);
  if (comm_ != nullptr) {
    (void)nccl().CommAbort(comm_);
    comm_ = nullptr;
  }
  cv_.SignalAll();
}

void NcclCommunicator::on_broken(const absl::Status& error) {
  STRATA_LOG(kError, "%s", error.message());
  std::deque<Pending> pending;
  {
    MutexLock lock(&mutex_);
    pending.swap(pending_);
    cv_.SignalAll();
  }
  for (Pending& p : pending) p.state->finish(error);
}

NcclCommunicator::~NcclCommunicator() {
  {
    // Enqueued work finishes, or the watchdog fails it, within the timeout.
    MutexLock lock(&mutex_);
    const absl::Time deadline =
        absl::Now() + absl::FromChrono(settings().timeout) + absl::Seconds(5);
    while (!pending_.empty() && comm_ != nullptr && absl::Now() < deadline) {
      (void)wait_with_timeout(&cv_, &mutex_, deadline - absl::Now());
    }
    stopping_ = true;
    cv_.SignalAll();
  }
  if (watchdog_.joinable()) watchdog_.join();
  {
    MutexLock lock(&mutex_);
    if (comm_ != nullptr) {
      // ncclCommFinalize flushes and is non-blocking here: polled, bounded, else aborted.
      (void)device().make_current();
      std::string local;
      if (pending_.empty()) local = settle_locked(nccl().CommFinalize(comm_), "ncclCommFinalize");
      if (pending_.empty() && local.empty()) {
        (void)nccl().CommDestroy(comm_);
      } else {
        if (!local.empty()) STRATA_LOG(kWarn, "%s: aborting the NCCL communicator", local);
        (void)nccl().CommAbort(comm_);
      }
      comm_ = nullptr;
    }
    const absl::Status gone =
        absl::CancelledError("the NCCL communicator was destroyed before this collective finished");
    for (Pending& p : pending_) p.state->finish(gone);
    pending_.clear();
  }
  stream_.reset();
  scratch_.reset();
  signatures_.reset();
}

// The communicator on `options.device`, its ncclComm_t from `make_comm` (null: a unique id
// through the rendezvous).
absl::StatusOr<std::unique_ptr<Communicator>> make_nccl_communicator(
    const CommOptions& options, std::unique_ptr<JobMonitor> monitor,
    const std::function<absl::StatusOr<ncclComm_t>()>& make_comm);

}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> create_nccl_communicator(
    const CommOptions& options, std::unique_ptr<JobMonitor> monitor) {
  return make_nccl_communicator(options, std::move(monitor), nullptr);
}

absl::StatusOr<std::unique_ptr<Communicator>> NcclCommunicator::create_split(
    const CommOptions& options, std::unique_ptr<JobMonitor> monitor, int color, int key) {
  if (nccl().CommSplit == nullptr) return create_nccl_communicator(options, std::move(monitor));
  return make_nccl_communicator(options, std::move(monitor), [&]() -> absl::StatusOr<ncclComm_t> {
    MutexLock lock(&mutex_);
    if (comm_ == nullptr) {
      return absl::FailedPreconditionError(
          "the communicator being split has failed or is closing: split a working one");
    }
    return nccl_split(comm_, color, key, settings(),
                      cat("rank ", options.launch.rank, " of ", options.launch.world_size,
                          " (rank ", rank(), " of ", size(), " before the split)"));
  });
}

namespace {

absl::StatusOr<std::unique_ptr<Communicator>> make_nccl_communicator(
    const CommOptions& options, std::unique_ptr<JobMonitor> monitor,
    const std::function<absl::StatusOr<ncclComm_t>()>& make_comm) {
  const LaunchInfo& launch = options.launch;
  Device* device = options.device;
  if (device == nullptr || device->backend() != Backend::kCuda) {
    return absl::FailedPreconditionError(
        "the NCCL communicator needs a CUDA device: pass the runtime's CUDA device in "
        "CommOptions::device, or use STRATA_COMM_BACKEND=gloo for host buffers");
  }
  // NCCL's functions, from the library found at run time (strata/comm/nccl_library.h).
  if (absl::StatusOr<const NcclApi*> api = load_nccl_api(); !api.ok()) return api.status();
  NcclParts parts;
  const uint64_t scratch_bytes =
      kGatherOffset + kSignatureBytes * static_cast<uint64_t>(launch.world_size);
  absl::StatusOr<std::unique_ptr<DeviceMemory>> scratch =
      device->allocate_device_memory(scratch_bytes);
  if (!scratch.ok()) return scratch.status();
  parts.scratch = *std::move(scratch);
  parts.ordinal = device->ordinal();
  // NCCL creates its communicator on the calling thread's current device.
  if (absl::Status s = device->make_current(); !s.ok()) return s;
  absl::StatusOr<std::unique_ptr<Stream>> stream = device->create_stream();
  if (!stream.ok()) return stream.status();
  absl::StatusOr<uintptr_t> handle = device->native_handle(**stream);
  if (!handle.ok()) return handle.status();
  parts.stream = *std::move(stream);
  parts.stream_handle = reinterpret_cast<cudaStream_t>(*handle);
  if (options.settings.debug) {
    absl::StatusOr<std::unique_ptr<PinnedHostMemory>> pinned =
        device->allocate_pinned(kSignatureBytes * (launch.world_size + 1u), "NCCL signatures");
    if (!pinned.ok()) return pinned.status();
    parts.signatures = *std::move(pinned);
  }

  parts.monitor = std::move(monitor);
  TcpStore& store = parts.monitor->store();

  const GpuIdentity gpu = GpuIdentity::on_this_machine(device->pci_bus_id(), parts.ordinal);
  absl::StatusOr<ncclComm_t> comm =
      make_comm ? make_comm() : nccl_rendezvous(launch, options.settings, store, gpu);
  if (!comm.ok()) return comm.status();
  parts.comm = *comm;
  (void)nccl().GetVersion(&parts.version);
  auto communicator = std::make_unique<NcclCommunicator>(options, std::move(parts));
  STRATA_LOG(kInfo, "%s", communicator->description());
  return communicator;
}

}  // namespace

}  // namespace strata::comm_internal
