// ZeroEngine's shared state, private to offload/: creation, parameters and step
// (zero_engine.cc), gradients and their reduce-scatters (zero_gradients.cc), stage 3's gathering
// of parameters by the recorded order (zero_fetch.cc), checkpoints and state gathering
// (zero_checkpoint.cc).
#pragma once

#include <absl/status/statusor.h>
#include <absl/synchronization/mutex.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "strata/offload/zero_engine.h"

namespace strata {

DataType comm_type(ParamType type);
DataType comm_type(GradType type);

struct ZeroEngine::Impl {
  struct Group {
    TensorHandle params;  // flat, padded, param_type: stages 1–2, stage 3's persistent groups
    TensorHandle grads;   // stage 1: flat, padded, grad_type
    TensorHandle shard_params;  // stage 3's partitioned groups: this rank's slice of params
    bool partitioned = false;   // stage 3, not persistent: gathered on use
    ParamId shard;              // the optimizer's parameter: this rank's slice
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

  // Stage 3: a partitioned group's gathered copy, while it exists (guarded by fetch_mu).
  struct Gathered {
    TensorHandle tensor;                   // padded × param_type in comm_tier; invalid: none
    std::unique_ptr<CollectiveWork> work;  // the all-gather, until waited for
    TensorHandle source;                   // the shard, acquired until the gather is waited for
    bool prefetched = false;               // gathered ahead and not used yet
    uint32_t users = 0;                    // acquire_param()s not yet released
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

  // Stage 3 fetching (zero_fetch.cc). Lock order: fetch_mu before mu.
  absl::Mutex fetch_mu;
  std::vector<Gathered> gathered ABSL_GUARDED_BY(fetch_mu);     // by group
  std::vector<uint32_t> param_users ABSL_GUARDED_BY(fetch_mu);  // by parameter
  std::vector<uint32_t> order ABSL_GUARDED_BY(fetch_mu);        // groups by use, the last step's
  size_t order_at ABSL_GUARDED_BY(fetch_mu) = 0;                // the next use expected
  bool order_valid ABSL_GUARDED_BY(fetch_mu) = false;           // this step follows `order`
  std::vector<uint32_t> recording ABSL_GUARDED_BY(fetch_mu);    // this step's uses
  uint64_t live_bytes ABSL_GUARDED_BY(fetch_mu) = 0;            // gathered tensors' bytes
  // max_live_bytes, bounded by what the comm tier can hold beside the engine's own tensors
  // homed there (set at creation; the same on every rank of a job configured alike).
  uint64_t live_limit = 0;

  absl::Status check_param(ZeroParamId id) const;
  absl::Status failure() const;  // the sticky failure, or OK
  // Records a failure (the first one stays) and wakes every waiter.
  absl::Status fail(absl::Status status);

  // zero_engine.cc
  absl::Status create_tensors(std::span<const ZeroParam> params);
  absl::Status gather_params();  // in-place all-gather of every group's parameters
  absl::Status zero_tensor(TensorHandle tensor, uint64_t bytes);
  absl::Status drop_host_copies();
  // Stage 3: bounds live_limit by what the comm tier can hold beside the engine's tensors.
  absl::Status bound_live_limit();
  absl::StatusOr<GradStatistics> combine(const GradStatistics& local);
  // How a collective on buffers acquired on `stream` is ordered after them.
  absl::StatusOr<CollectiveOptions> collective_options(Stream& stream);

  // Where stage 3's persistent groups and the buckets live when shards may be on NVMe.
  TierKind whole_home() const;
  uint64_t gathered_bytes(uint32_t group) const;

  // zero_fetch.cc
  absl::StatusOr<void*> acquire_gathered(uint32_t param, TierKind tier, Stream& stream)
      ABSL_LOCKS_EXCLUDED(fetch_mu);
  absl::Status release_gathered(uint32_t param, Stream& stream) ABSL_LOCKS_EXCLUDED(fetch_mu);
  absl::Status set_order(std::vector<uint32_t> groups) ABSL_LOCKS_EXCLUDED(fetch_mu);
  // Drops every gathered group (none may be in use): the parameters are about to change.
  absl::Status drop_all_gathered(std::string_view caller) ABSL_LOCKS_EXCLUDED(fetch_mu);
  // At the end of a step: the recorded order becomes the next step's, whose first groups are
  // prefetched.
  absl::Status next_step_order() ABSL_LOCKS_EXCLUDED(fetch_mu);
  void note_use(uint32_t group) ABSL_EXCLUSIVE_LOCKS_REQUIRED(fetch_mu);
  // Gathers the groups ahead in the order; `shard_hints`: also starts moving the shards of the
  // groups beyond (from NVMe, say) in the background.
  // `in_use`: the group being acquired (not yet counted as used), never dropped for room.
  absl::Status prefetch_ahead(bool shard_hints, int in_use) ABSL_EXCLUSIVE_LOCKS_REQUIRED(fetch_mu);
  absl::Status start_gather(uint32_t group, bool prefetch) ABSL_EXCLUSIVE_LOCKS_REQUIRED(fetch_mu);
  absl::Status finish_gather(uint32_t group) ABSL_EXCLUSIVE_LOCKS_REQUIRED(fetch_mu);
  absl::Status drop_gathered(uint32_t group) ABSL_EXCLUSIVE_LOCKS_REQUIRED(fetch_mu);
  absl::Status make_room(uint32_t group) ABSL_EXCLUSIVE_LOCKS_REQUIRED(fetch_mu);
  // Gathered bytes between now and the group's next use in the order (UINT64_MAX: none).
  uint64_t reuse_distance(uint32_t group) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(fetch_mu);

  // zero_gradients.cc
  void run_reducer();
  absl::Status land(Reduction& r);
  absl::Status issue_reduction(uint32_t group, int bucket);
  absl::StatusOr<int> take_bucket(uint32_t group) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  void wait_for_reductions() ABSL_LOCKS_EXCLUDED(mu);
  // Drops every gradient since the last step (no reduction may be in flight).
  absl::Status clear_gradients(std::string_view caller) ABSL_LOCKS_EXCLUDED(mu);
};

}  // namespace strata
