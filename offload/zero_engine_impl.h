// ZeroEngine's shared state, private to offload/: creation, parameters and step
// (zero_engine.cc), gradients and their reduce-scatters (zero_gradients.cc), checkpoints and
// state gathering (zero_checkpoint.cc).
#pragma once

#include <absl/status/statusor.h>
#include <absl/synchronization/mutex.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "strata/offload/zero_engine.h"

namespace strata {

DataType comm_type(ParamType type);
DataType comm_type(GradType type);

struct ZeroEngine::Impl {
  struct Group {
    TensorHandle params;  // flat, padded, param_type, homed in options.param_home
    TensorHandle grads;   // stage 1: flat, padded, grad_type
    ParamId shard;        // the optimizer's parameter: this rank's slice
    uint32_t members = 0;
    // Guarded by mu:
    uint32_t ready = 0;      // parameters ready in the current micro-step
    uint32_t completed = 0;  // micro-steps completed since the last step
    int bucket = -1;         // stage 2: the bucket the group's gradients are written into
  };
  struct ParamState {       // guarded by mu
    bool acquired = false;  // acquire_grad() without grad_ready() yet
    TensorHandle acquired_tensor;
    bool ready = false;  // in the current micro-step of its group
  };
  // A reduce-scatter in flight, processed in issue order by the reducer thread.
  struct Reduction {
    uint32_t group = 0;
    TensorHandle tensor;  // acquired in comm_tier on comm_stream until the work is done
    int bucket = -1;
    std::unique_ptr<CollectiveWork> work;
  };

  Impl(Runtime& r, Communicator& c, ZeroOptions o) : runtime(r), comm(c), options(std::move(o)) {}

  Runtime& runtime;
  Communicator& comm;
  const ZeroOptions options;
  ZeroLayout layout;
  uint32_t rank = 0;
  uint32_t ranks = 1;
  // Collectives read and write tensors in comm_tier (NCCL: the GPU; Gloo: host memory, which is
  // the GPU tier of the host backend); the host reads reduced gradients in host_tier.
  TierKind comm_tier = TierKind::kGpu;
  TierKind host_tier = TierKind::kGpu;
  uint64_t param_bytes = 2;  // per element
  uint64_t grad_bytes = 2;
  uint64_t bucket_bytes = 0;  // stage 2: the largest group's gradients
  std::unique_ptr<OffloadOptimizer> optimizer;
  std::unique_ptr<Stream> comm_stream;    // reduce-scatters and their landing
  std::unique_ptr<Stream> gather_stream;  // all-gathers, initialisation, checkpoints
  std::vector<Group> groups;              // by flat group
  std::vector<TensorHandle> buckets;      // stage 2

  mutable absl::Mutex mu;
  absl::CondVar changed;
  std::vector<ParamState> param_states ABSL_GUARDED_BY(mu);
  std::vector<int> free_buckets ABSL_GUARDED_BY(mu);
  std::deque<Reduction> reductions ABSL_GUARDED_BY(mu);
  bool reducing ABSL_GUARDED_BY(mu) = false;  // the reducer holds one taken off the queue
  bool stopping ABSL_GUARDED_BY(mu) = false;
  absl::Status failed ABSL_GUARDED_BY(mu);  // sticky: a collective or a landing failed
  ZeroStats counters ABSL_GUARDED_BY(mu);
  // The Communicator's byte count when the last step ended: a step's bytes include the
  // reduce-scatters of its backward.
  uint64_t comm_mark ABSL_GUARDED_BY(mu) = 0;
  std::thread reducer;

  // Serialises step(), zero_grad(), save(), load(), read_state(): collectives every rank issues
  // in the same order.
  absl::Mutex step_mu;

  absl::Status check_param(ZeroParamId id) const;
  absl::Status failure() const;  // the sticky failure, or OK
  // Records a failure (the first one stays) and wakes every waiter.
  absl::Status fail(absl::Status status);

  // zero_engine.cc
  absl::Status create_tensors(std::span<const ZeroParam> params);
  absl::Status gather_params();  // in-place all-gather of every group's parameters
  absl::Status zero_tensor(TensorHandle tensor, uint64_t bytes);
  absl::Status drop_host_copies();
  absl::StatusOr<GradStatistics> combine(const GradStatistics& local);
  // How a collective on buffers acquired on `stream` is ordered after them.
  absl::StatusOr<CollectiveOptions> collective_options(Stream& stream);

  // zero_gradients.cc
  void run_reducer();
  absl::Status land(Reduction& r);
  absl::Status issue_reduction(uint32_t group, int bucket);
  absl::StatusOr<int> take_bucket(uint32_t group) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  void wait_for_reductions() ABSL_LOCKS_EXCLUDED(mu);
};

}  // namespace strata
