// Communicator: the ranks of a data-parallel job and the collectives between them, run on an
// existing engine — NCCL for CUDA buffers, Gloo for host buffers (and every machine without a
// GPU). It knows ranks, buffers and streams; nothing of tensors, tiers or optimizers.
//
// Every rank must issue the same collectives, in the same order, with the same types and sizes.
// Each collective gets a sequence number (1, 2, ... in issue order, the same on every rank). A
// dead peer, a peer that never arrives, a timeout (STRATA_COMM_TIMEOUT) or a mismatch is an
// error on every rank naming the operation, its sequence number and the rank(s) at fault —
// never a hang. After a failure the communicator is broken: every later call returns the same
// error (a collective cannot be retried once the ranks have fallen out of step).
//
// Sizes are element counts. Shards need not be equal and may be empty.
#pragma once

#include <absl/status/status.h>
#include <absl/status/statusor.h>

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "strata/comm/comm_types.h"
#include "strata/comm/launch.h"
#include "strata/comm/launcher_store.h"
#include "strata/config/comm_settings.h"

namespace strata {

class Device;
class Stream;

// A collective in flight. Destroying it without wait() is allowed (the operation still completes
// in order; its error then surfaces on the next call).
class CollectiveWork {
 public:
  virtual ~CollectiveWork() = default;
  // Gloo: blocks until the output is written. NCCL: returns once the operation is ordered on its
  // stream, without a host wait (later work on that stream sees the output). Either way a
  // failure of this or an earlier operation is returned here, with the message described above.
  virtual absl::Status wait() = 0;
  // Blocks the host until the output is written, on every backend.
  virtual absl::Status synchronize() = 0;
  // Sequence number of this operation (1-based, the same on every rank).
  virtual uint64_t sequence() const = 0;
};

struct CollectiveOptions {
  // NCCL: the stream the operation is ordered on (nullptr: the communicator's own stream).
  // Gloo: the host thread first waits for the work queued on this stream so far (nullptr: none).
  Stream* stream = nullptr;
};

// Per operation kind, what this rank has issued. `bytes` is the operation's size in nccl-tests'
// terms: all_gather the gathered output, reduce_scatter the full input, all_reduce and
// broadcast the buffer. `wire_bytes` is what this rank sends under a bandwidth-optimal
// algorithm (bytes × bus factor): all_gather and reduce_scatter (n−1)/n, all_reduce 2(n−1)/n,
// broadcast 1 on the root.
struct CommStats {
  struct PerKind {
    uint64_t calls = 0;
    uint64_t bytes = 0;
    uint64_t wire_bytes = 0;
  };
  std::array<PerKind, 5> by_kind{};  // indexed by CollectiveKind
  const PerKind& operator[](CollectiveKind kind) const {
    return by_kind[static_cast<size_t>(kind)];
  }
  uint64_t total_bytes() const;
  uint64_t total_wire_bytes() const;
};

struct CommOptions {
  LaunchInfo launch;
  CommSettings settings;
  // Required for NCCL (the CUDA device whose buffers and streams the collectives use); with
  // Gloo, used only to wait on CollectiveOptions::stream.
  Device* device = nullptr;
  // The store of the launcher or framework that started this job (torchrun's agent store, an
  // initialised torch.distributed's), through which the ranks meet instead of rank 0 binding
  // MASTER_PORT (strata/comm/launcher_store.h). Used only during create(). Required when
  // launch.agent_store (TORCHELASTIC_USE_AGENT_STORE=True): the port is the agent's.
  LauncherStore* launcher_store = nullptr;
};

class Communicator {
 public:
  // Rendezvous at launch.master_addr:master_port (rank 0 serves it; through
  // options.launcher_store where given) and the engine's set-up. Backend kAuto: NCCL when this
  // build has it and `device` is a CUDA device, else Gloo.
  static absl::StatusOr<std::unique_ptr<Communicator>> create(const CommOptions& options);
  // Launch variables (RANK, WORLD_SIZE, ...) and STRATA_COMM_* from the environment.
  static absl::StatusOr<std::unique_ptr<Communicator>> from_environment(Device* device = nullptr);

  // Waits (bounded by the timeout) for issued operations, then leaves the job cleanly.
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual CommBackendKind backend() const = 0;
  // True where the collectives take the device's memory only (NCCL: CUDA buffers): host memory
  // must be staged through device memory by the caller (the Python collectives do).
  virtual bool needs_device_buffers() const { return backend() == CommBackendKind::kNccl; }
  virtual CommStats stats() const = 0;
  // One line: backend, rank/size, rendezvous address, timeout.
  virtual std::string description() const = 0;

  // Rank r contributes counts[r] elements (`send`, counts[rank()] of them); `recv` receives all
  // ranks' in rank order, sum(counts) elements. In place: send == recv + offset of this rank.
  virtual absl::StatusOr<std::unique_ptr<CollectiveWork>> all_gather(
      const void* send, void* recv, std::span<const uint64_t> counts, DataType type,
      const CollectiveOptions& options = {}) = 0;
  // Equal shards: `count` elements per rank, `recv` holds size() × count.
  absl::StatusOr<std::unique_ptr<CollectiveWork>> all_gather(const void* send, void* recv,
                                                             uint64_t count, DataType type,
                                                             const CollectiveOptions& options = {});

  // `send` holds sum(counts) elements, rank-major; this rank receives the reduction over all
  // ranks of its slice (counts[rank()] elements at offset sum(counts[0..rank()))) in `recv`.
  // In place: recv == send + that offset.
  virtual absl::StatusOr<std::unique_ptr<CollectiveWork>> reduce_scatter(
      const void* send, void* recv, std::span<const uint64_t> counts, DataType type, ReduceOp op,
      const CollectiveOptions& options = {}) = 0;
  absl::StatusOr<std::unique_ptr<CollectiveWork>> reduce_scatter(
      const void* send, void* recv, uint64_t count, DataType type, ReduceOp op,
      const CollectiveOptions& options = {});

  // In place when send == recv.
  virtual absl::StatusOr<std::unique_ptr<CollectiveWork>> all_reduce(
      const void* send, void* recv, uint64_t count, DataType type, ReduceOp op,
      const CollectiveOptions& options = {}) = 0;

  virtual absl::StatusOr<std::unique_ptr<CollectiveWork>> broadcast(
      void* data, uint64_t count, DataType type, int root,
      const CollectiveOptions& options = {}) = 0;

  virtual absl::StatusOr<std::unique_ptr<CollectiveWork>> barrier(
      const CollectiveOptions& options = {}) = 0;

  // A sub-communicator (MPI_Comm_split, ncclCommSplit, torch's new_group): the ranks that pass
  // the same `color` (>= 0) form one group, ranked by `key` (ties: by this communicator's rank).
  // Every rank of this communicator must call split, the same number of times and in the same
  // order (the n-th split of each rank is the same split); a rank that does not is named in a
  // DeadlineExceeded error within the timeout, on every rank that waited for it. Splitting takes
  // no sequence number here: the parent's collectives and the group's are independent (issue
  // them from one thread, in the same order on every rank of the group). The group has its own
  // rendezvous (served by its rank 0), watcher and post-mortem; its errors name its ranks and
  // the parent's ranks they are. Same backend, device and settings (timeout) as this one. It
  // must be destroyed before this communicator.
  virtual absl::StatusOr<std::unique_ptr<Communicator>> split(int color, int key) = 0;
};

}  // namespace strata
