// ZeroEngine's shared state, private to offload/: creation, parameters and step
// (zero_engine.cc), how its collectives are ordered on streams (zero_collectives.cc), gradients
// and their reduce-scatters (zero_gradients.cc), stage 3's gathering of parameters by the
// recorded order (zero_fetch.cc), checkpoints and state gathering (zero_checkpoint.cc).
#pragma once

#include <absl/status/statusor.h>
#include <absl/synchronization/mutex.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "strata/zero/zero_engine.h"

namespace strata {

DataType comm_type(ParamType type);
DataType comm_type(GradType type);

struct ZeroEngine::Impl {
  struct Group {
    TensorHandle params;  // flat, padded, param_type: stages 1–2, stage 3's persistent groups
    TensorHandle grads;   // stage 1: flat, padded, grad_type
    TensorHandle shard_params;  // stage 3's partitioned groups: this rank's slice of params
    TensorHandle secondary;     // hpZ: this rank's slice of params among its node's ranks
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
    // Acquired in comm_tier until the work is done; with a bounce buffer, released at issue
    // (its D2H copy into the bounce is queued) and acquired again to zero it (a bucket).
    TensorHandle tensor;
    int bucket = -1;
    // The group's last micro-step of the step: the optimizer may step its slice at once
    // (OffloadOptimizerOptions.overlap).
    bool final = true;
    std::unique_ptr<CollectiveWork> work;
    // Bounce: raised once the reducer has read the bounce buffer (the next reduce-scatter's
    // copy into it waits for this on comm_stream).
    std::shared_ptr<HostFlag> consumed;
  };

  // A Gloo collective whose completion later device work on `stream` waits for: the completer
  // thread waits for each in issue order and raises its flag (also when it failed).
  struct Completion {
    std::unique_ptr<CollectiveWork> work;
    std::shared_ptr<HostFlag> flag;
    std::shared_ptr<std::atomic<bool>> done;  // set with the flag (a statistic reads it)
  };

  // Stage 3: a partitioned group's gathered copy, while it exists (guarded by fetch_mu).
  struct Gathered {
    TensorHandle tensor;  // padded × param_type in comm_tier; invalid: none
    // Set once the all-gather has completed (Gloo; null with NCCL, which never tells the host):
    // the gather itself is ordered on gather_stream, which the tensor's users wait for.
    std::shared_ptr<std::atomic<bool>> done;
    bool prefetched = false;  // gathered ahead and not used yet
    uint32_t users = 0;       // acquire_param()s not yet released
    // One per release_param(): the end of the work that used it on the releasing stream.
    std::vector<std::unique_ptr<Event>> used;
  };
  // Stage 3: a dropped gathered tensor whose users' device work may still run. It is destroyed
  // once every event has completed, so that dropping never waits on the host for a layer's
  // kernels; its bytes count against the live limit until then (guarded by fetch_mu).
  struct Retiree {
    TensorHandle tensor;
    uint64_t bytes = 0;
    std::vector<std::unique_ptr<Event>> used;
  };

  Impl(Runtime& r, Communicator& c, ZeroOptions o) : runtime(r), comm(c), options(std::move(o)) {}

  Runtime& runtime;
  Communicator& comm;
  // hpZ (stage 3): the node's ranks, split from `comm` at creation; destroyed last, after the
  // collectives issued on it have ended (~ZeroEngine stops the completer first).
  std::unique_ptr<Communicator> node_comm;
  uint32_t node_rank = 0;
  uint32_t node_ranks = 1;
  const ZeroOptions options;
  ZeroLayout layout;
  uint32_t rank = 0;
  uint32_t ranks = 1;
  // Collectives read and write tensors in comm_tier, the GPU tier (on the host backend, host
  // memory); the host reads reduced gradients in host_tier (the CPU tier on a CUDA device).
  // Gloo moves host memory: on a CUDA device its data crosses through a pinned bounce buffer
  // per stream (`bounce`), copied on the stream before and after the collective.
  TierKind comm_tier = TierKind::kGpu;
  TierKind host_tier = TierKind::kGpu;
  bool gloo = true;
  bool bounce = false;
  uint64_t param_bytes = 2;  // per element
  uint64_t grad_bytes = 2;
  uint64_t bucket_bytes = 0;  // stage 2: the largest group's gradients
  std::unique_ptr<OffloadOptimizer> optimizer;
  // Stopped (every flag raised) by ~ZeroEngine before the streams go: a stream being destroyed
  // finishes its queued work, which may wait for a flag the completer raises.
  std::thread completer;
  absl::Mutex completion_mu;
  absl::CondVar completion_changed;
  std::deque<Completion> completions ABSL_GUARDED_BY(completion_mu);
  bool completer_stopping ABSL_GUARDED_BY(completion_mu) = false;

  std::unique_ptr<Stream> comm_stream;    // reduce-scatters
  std::unique_ptr<Stream> gather_stream;  // all-gathers
  std::unique_ptr<Stream> land_stream;    // the reducer's own acquires (the landing)
  std::unique_ptr<Stream> host_stream;    // the host's writes: initialisation, zeroing
  std::vector<Group> groups;              // by flat group
  std::vector<TensorHandle> buckets;      // stage 2
  // Bounce buffers (Gloo on a CUDA device): the largest group's gathered parameters, and its
  // gradients. One each: every use of one is ordered on one stream (gather_stream, comm_stream).
  std::unique_ptr<PinnedHostMemory> gather_bounce;
  std::unique_ptr<PinnedHostMemory> reduce_bounce;
  // The last reduction's `consumed` flag (issue_reduction, the trainer's thread).
  std::shared_ptr<HostFlag> reduce_bounce_free;
  // Zeros a bucket is reset from on the device (stage 2 and 3 with bounce buffers; never
  // written after creation), and the reducer's copy of the reduced slice.
  std::unique_ptr<PinnedHostMemory> zeros;
  std::vector<std::byte> reduced;
  // A Gloo communicator made without this runtime's device cannot wait on its streams; the
  // host then waits before each collective (found at the first collective, warned once).
  std::atomic<bool> comm_waits_streams{true};

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
  // Bytes through the job's communicator and hpZ's node communicator so far.
  uint64_t comm_bytes() const {
    return comm.stats().total_bytes() +
           (node_comm != nullptr ? node_comm->stats().total_bytes() : 0);
  }
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
  // Gathered tensors' bytes: the ones alive as groups (every decision is made on these), and
  // the ones dropped but not yet destroyed (only the memory bound waits for these).
  uint64_t live_bytes ABSL_GUARDED_BY(fetch_mu) = 0;
  std::deque<Retiree> retiring ABSL_GUARDED_BY(fetch_mu);
  uint64_t gathers_started ABSL_GUARDED_BY(fetch_mu) = 0;
  // hpZ: by group, whether its secondary slice holds the current parameters (set by a global
  // gather, cleared when the parameters are about to change: drop_all_gathered).
  std::vector<bool> secondary_fresh ABSL_GUARDED_BY(fetch_mu);
  uint64_t retiring_bytes ABSL_GUARDED_BY(fetch_mu) = 0;
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

  // zero_collectives.cc
  absl::Status start_collectives();  // streams, bounce buffers, the completer thread
  void stop_collectives();           // waits for the collectives handed to the completer
  // Issues `call` on buffers acquired on `stream`, ordered after the work queued there: NCCL
  // runs on the stream; Gloo's worker waits for it (an event recorded at issue). The host does
  // not wait, unless the communicator cannot see this runtime's streams.
  using CollectiveCall =
      std::function<absl::StatusOr<std::unique_ptr<CollectiveWork>>(const CollectiveOptions&)>;
  absl::StatusOr<std::unique_ptr<CollectiveWork>> issue(Stream& stream, const CollectiveCall& call);
  // Later work on `stream` waits for `work` to complete; the host does not (NCCL: it ran on
  // `stream`; Gloo: a host flag the completer raises). `done`, if given, is set with it.
  absl::Status order_after(std::unique_ptr<CollectiveWork> work, Stream& stream,
                           std::shared_ptr<std::atomic<bool>> done = nullptr);
  // The all-gather of `count` elements per rank of the parameter type into `recv` (comm_tier,
  // ranks × count), from `send` (this rank's slice, comm_tier; `recv`'s own slice in place),
  // stream-ordered on gather_stream: its users wait on the stream, the host does not.
  absl::Status gather(const void* send, void* recv, uint64_t count,
                      std::shared_ptr<std::atomic<bool>> done);
  // The same over `c` (the job's or the node's communicator), this rank being `c_rank` there.
  absl::Status gather_on(Communicator& c, uint32_t c_rank, const void* send, void* recv,
                         uint64_t count, std::shared_ptr<std::atomic<bool>> done);
  // hpZ: splits the node's communicator off `comm` (create()).
  absl::Status start_hpz();
  void run_completer();

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
  // At a use of the group: counts a prefetched gather that had not ended yet as late.
  void note_ready(uint32_t group) ABSL_EXCLUSIVE_LOCKS_REQUIRED(fetch_mu);
  // Drops a gathered group: its tensor retires (destroyed once its users' work has ended), or,
  // `now`, is destroyed at once (the host waits for that work).
  absl::Status drop_gathered(uint32_t group, bool now = false)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(fetch_mu);
  // Destroys the retired tensors whose work has ended; `need`: until `need` more bytes fit in
  // the live limit, waiting on the host for the oldest where they do not yet (kAllRetired: every
  // one).
  static constexpr uint64_t kAllRetired = UINT64_MAX;
  absl::Status reap(uint64_t need = 0) ABSL_EXCLUSIVE_LOCKS_REQUIRED(fetch_mu);
  void count_gathered() ABSL_EXCLUSIVE_LOCKS_REQUIRED(fetch_mu);
  absl::Status make_room(uint32_t group) ABSL_EXCLUSIVE_LOCKS_REQUIRED(fetch_mu);
  // Gathered bytes between now and the group's next use in the order (UINT64_MAX: none).
  uint64_t reuse_distance(uint32_t group) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(fetch_mu);

  // zero_gradients.cc
  void run_reducer();
  absl::Status land(Reduction& r);
  absl::Status issue_reduction(uint32_t group, int bucket, bool final);
  absl::StatusOr<int> take_bucket(uint32_t group) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  void wait_for_reductions() ABSL_LOCKS_EXCLUDED(mu);
  // Drops every gradient since the last step (no reduction may be in flight).
  absl::Status clear_gradients(std::string_view caller) ABSL_LOCKS_EXCLUDED(mu);
};

}  // namespace strata
