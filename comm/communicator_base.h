// CommunicatorBase: everything the backends' communicators share, written once so that a fix
// lands once. It owns the job (the JobMonitor: rendezvous, watcher, post-mortem), the issue lock
// that gives every collective its sequence number in issue order, the argument checks (a call
// they reject takes no number), the statistics, the comparison of signatures (STRATA_COMM_DEBUG)
// and the broken state: the first failure wins, every later call returns its verdict. The five
// collectives, stats() and description() are implemented here.
//
// A backend supplies only the transport, through these hooks (the way RMM's stream-ordered
// memory resource lists what a pool supplies):
//
//   backend()           which engine this is.
//   engine()            how description() starts: "gloo", "nccl 2.21.5 on cuda:0".
//   check_options(o)    a CollectiveOptions the engine cannot use (a stream it cannot wait on or
//                       order work on) is a bad argument: found before the call takes a number.
//   start(op, o)        the call is numbered, checked, counted and recorded with the monitor: run
//                       it or enqueue it, and return its work handle. Called under the issue
//                       lock, so the engine sees the calls in sequence order. A failure from here
//                       on has used a number that the other ranks use too: report it through
//                       fail(), which tells them.
//   exchange_signatures(call, o)
//                       STRATA_COMM_DEBUG: every rank's call.signature(), in rank order, moved by
//                       the engine; an error in the engine's words. The backend calls
//                       check_signatures() where its engine orders the exchange before the data
//                       (Gloo: on its worker thread; NCCL: on the stream, at issue).
//   abort_transport()   the first failure: end whatever waits on a peer (NCCL: ncclCommAbort).
//                       Called once, before the post-mortem, on whichever thread failed first
//                       (in start(), under the issue lock, or on one of the backend's threads).
//   on_broken(error)    the verdict is known: fail what is still pending with it.
//
// Lock order: the issue lock, then the backend's own locks, then Health's (a leaf). A backend
// calls fail() without holding its own locks: abort_transport() and on_broken() take them.
#pragma once

#include <absl/status/status.h>
#include <absl/status/statusor.h>
#include <absl/synchronization/mutex.h>
#include <absl/time/time.h>

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "collective_call.h"
#include "job_monitor.h"
#include "strata/base/mutex.h"
#include "strata/comm/communicator.h"

namespace strata::comm_internal {

// Whether the communicator has failed, shared with the work handles (which may outlive it). The
// first failure wins; its verdict, the job's error, follows once the post-mortem is done.
class Health {
 public:
  // True for the first caller only: that one reports the failure.
  bool begin_failure();
  bool failing() const;
  void set_verdict(absl::Status error);  // the first one stays
  absl::Status verdict() const;          // OK until set
  // The verdict, waiting up to `bound` for the failing thread to write it.
  absl::Status await_verdict(absl::Duration bound) const;

 private:
  mutable absl::Mutex mutex_;
  bool failing_ ABSL_GUARDED_BY(mutex_) = false;
  absl::Status verdict_ ABSL_GUARDED_BY(mutex_);
  mutable absl::CondVar written_;  // the verdict was set
};

// One collective as the caller issued it: the call and its buffers.
struct Operation {
  CollectiveCall call;
  const void* send = nullptr;  // broadcast: the data
  void* recv = nullptr;        // broadcast: the data
};

class CommunicatorBase : public Communicator {
 public:
  // `options.launch.master_port` is replaced by the port the monitor serves (a lone rank's 0).
  CommunicatorBase(const CommOptions& options, std::unique_ptr<JobMonitor> monitor);
  ~CommunicatorBase() override;

  int rank() const final { return options_.launch.rank; }
  int size() const final { return options_.launch.world_size; }
  CommStats stats() const final;
  std::string description() const final;

  // The interface's defaults, repeated: calls through a backend's type see these.
  using Communicator::all_gather;
  using Communicator::reduce_scatter;
  absl::StatusOr<std::unique_ptr<CollectiveWork>> all_gather(
      const void* send, void* recv, std::span<const uint64_t> counts, DataType type,
      const CollectiveOptions& options = {}) final;
  absl::StatusOr<std::unique_ptr<CollectiveWork>> reduce_scatter(
      const void* send, void* recv, std::span<const uint64_t> counts, DataType type, ReduceOp op,
      const CollectiveOptions& options = {}) final;
  absl::StatusOr<std::unique_ptr<CollectiveWork>> all_reduce(
      const void* send, void* recv, uint64_t count, DataType type, ReduceOp op,
      const CollectiveOptions& options = {}) final;
  absl::StatusOr<std::unique_ptr<CollectiveWork>> broadcast(
      void* data, uint64_t count, DataType type, int root,
      const CollectiveOptions& options = {}) final;
  absl::StatusOr<std::unique_ptr<CollectiveWork>> barrier(
      const CollectiveOptions& options = {}) final;
  // communicator_split.cc: agrees on the groups through this communicator's rendezvous, starts
  // the group's own (served by its rank 0) and has the backend connect the group on it.
  absl::StatusOr<std::unique_ptr<Communicator>> split(int color, int key) final;

 protected:
  // The hooks (see the top of this file).
  virtual std::string engine() const = 0;
  virtual absl::Status check_options(const CollectiveOptions& options) = 0;
  virtual absl::StatusOr<std::unique_ptr<CollectiveWork>> start(
      const Operation& op, const CollectiveOptions& options) = 0;
  virtual absl::StatusOr<std::vector<CollectiveCall::Signature>> exchange_signatures(
      const CollectiveCall& call, const CollectiveOptions& options) = 0;
  virtual void abort_transport() = 0;
  virtual void on_broken(const absl::Status& error) = 0;
  // split(): the engine's communicator over the group that `monitor` (the group's rendezvous,
  // already joined) and `options.launch` (the group's rank and size) describe. The default: this
  // engine cannot split (Unimplemented).
  // `color` and `key` are the split's arguments (an engine that splits its own communicator, as
  // ncclCommSplit does, uses them).
  virtual absl::StatusOr<std::unique_ptr<Communicator>> create_split(
      const CommOptions& options, std::unique_ptr<JobMonitor> monitor, int color, int key);

  // For the backends.
  const CommOptions& options() const { return options_; }
  const CommSettings& settings() const { return options_.settings; }
  const std::shared_ptr<Health>& health() const { return health_; }

  // A collective failed on this rank with `local` (the engine's words): the first failure
  // aborts the transport, tells the other ranks and returns the job's error (the monitor's
  // post-mortem); a later one returns that same error.
  absl::Status fail(const CollectiveCall& call, std::string_view local);
  // The same with the job's error already known (every rank reached it: a signature mismatch).
  absl::Status fail_with(absl::Status verdict);
  // The error of a broken communicator, once the failing thread has written it (bounded).
  absl::Status broken_error() const;

  // STRATA_COMM_DEBUG: exchanges every rank's signature of `call` and compares them; all ranks
  // see the same table and reach the same verdict. A mismatch or an engine error breaks the
  // communicator (through fail_with / fail) and is returned.
  absl::Status check_signatures(const CollectiveCall& call, const CollectiveOptions& options);

 private:
  absl::StatusOr<std::unique_ptr<CollectiveWork>> issue(Operation op,
                                                        const CollectiveOptions& options);
  absl::Status finish_failure(absl::Status error);

  CommOptions options_;
  // A split's: which split of which communicator this is, and the parent's ranks of its own
  // ranks, appended to its errors (empty for a job's communicator).
  std::string split_note_;
  // Destroyed after the backend's members (base members go last): the engine's connections
  // close before the job's rendezvous does.
  std::unique_ptr<JobMonitor> monitor_;
  const std::shared_ptr<Health> health_ = std::make_shared<Health>();
  mutable absl::Mutex mutex_;  // the issue lock
  uint64_t sequence_ ABSL_GUARDED_BY(mutex_) = 0;
  uint64_t splits_ ABSL_GUARDED_BY(mutex_) = 0;  // split() calls so far
  CommStats stats_ ABSL_GUARDED_BY(mutex_);
};

}  // namespace strata::comm_internal
