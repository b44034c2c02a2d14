// The pieces of the NCCL backend around the communicator: NCCL's words for types and errors,
// the work handle, and the set-up of the NCCL communicator through the rendezvous.
// Private to comm/ (with nccl_communicator.cc, the only files that include nccl.h).
#pragma once

#include <absl/status/status.h>
#include <absl/status/statusor.h>
#include <absl/synchronization/mutex.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>

#include "communicator_base.h"
#include "gpu_assignment.h"
#include "nccl_api.h"
#include "strata/base/mutex.h"
#include "strata/comm/communicator.h"
#include "strata/comm/tcp_store.h"
#include "strata/device/device.h"

namespace strata::comm_internal {

using Clock = std::chrono::steady_clock;

// "what failed: NCCL's words (its last error)".
std::string nccl_error(ncclResult_t result, std::string_view what);

ncclDataType_t nccl_type(DataType type);
ncclRedOp_t nccl_op(ReduceOp op);

// Sleeps between polls: short at first (operations often finish within microseconds), then 1 ms.
class Backoff {
 public:
  void pause() {
    std::this_thread::sleep_for(delay_);
    delay_ = std::min(delay_ * 2, std::chrono::microseconds(1000));
  }

 private:
  std::chrono::microseconds delay_{10};
};

// Events come from the Device (no CUDA runtime calls in comm/): shared by the communicator's
// watchdog and the work handle. The device outlives both.
using EventPtr = std::shared_ptr<Event>;

// One operation's outcome as the watchdog saw it (the first finish() wins).
struct OpState {
  absl::Mutex mutex;
  bool done ABSL_GUARDED_BY(mutex) = false;
  absl::Status status ABSL_GUARDED_BY(mutex);

  void finish(absl::Status s) {
    MutexLock lock(&mutex);
    if (done) return;
    done = true;
    status = std::move(s);
  }
  std::optional<absl::Status> result() {
    MutexLock lock(&mutex);
    if (!done) return std::nullopt;
    return status;
  }
};

class NcclWork final : public CollectiveWork {
 public:
  // `end`: recorded after the operation on its stream; null when it was skipped (no elements).
  NcclWork(Device& device, uint64_t sequence, std::string what, std::chrono::milliseconds timeout,
           std::shared_ptr<Health> health, std::shared_ptr<OpState> state, EventPtr end)
      : device_(device),
        sequence_(sequence),
        what_(std::move(what)),
        timeout_(timeout),
        health_(std::move(health)),
        state_(std::move(state)),
        end_(std::move(end)) {}

  // The operation is on its stream already: only an error known so far is reported.
  absl::Status wait() override;
  // Polls the end event; the watchdog ends the operation within the timeout, and the deadline
  // here (twice that) is a backstop only.
  absl::Status synchronize() override;
  uint64_t sequence() const override { return sequence_; }

 private:
  Device& device_;
  uint64_t sequence_;
  std::string what_;
  std::chrono::milliseconds timeout_;
  std::shared_ptr<Health> health_;
  std::shared_ptr<OpState> state_;
  EventPtr end_;
};

// First the ranks exchange their GPUs (`gpu`: this rank's) and every rank fails alike when
// two share one (check_one_gpu_per_rank: NCCL would fail them with a misleading message). Then
// rank 0 makes NCCL's unique id and sets it in the store, the others read it, and every rank
// creates its non-blocking communicator on the current CUDA device, polled until ready within
// the timeout (else aborted, with an error naming the ranks that never arrived or died).
absl::StatusOr<ncclComm_t> nccl_rendezvous(const LaunchInfo& launch, const CommSettings& settings,
                                           TcpStore& store, const GpuIdentity& gpu);

// Communicator::split where NCCL has ncclCommSplit: the group's communicator split off `parent`
// (every rank of the parent calls it, with its color and key), non-blocking and polled until
// ready within the timeout (else aborted). `who` names the rank in errors. The caller keeps
// other calls on `parent` out meanwhile.
absl::StatusOr<ncclComm_t> nccl_split(ncclComm_t parent, int color, int key,
                                      const CommSettings& settings, std::string_view who);

}  // namespace strata::comm_internal
