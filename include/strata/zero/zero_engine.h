// ZeroEngine: ZeRO-DP stages 1, 2 and 3 over strata's tiers. Each of N data-parallel ranks keeps
// the optimizer states (fp32 master, Adam moments) of 1/N of the parameters, in the tier its
// OffloadOptimizer options choose (pinned CPU tier with the CPU Adam step, or NVMe), and steps
// only that slice.
//
// Layout (zero_layout.h): parameters are packed, in the order given, into flat groups of at
// most `bucket_bytes` of gradients, each padded to a multiple of N × alignment elements; rank r
// owns slice r of every group.
//
// Gradients, per micro-step, as backward produces them:
//   void* g = acquire_grad(id, tier, stream);   // add (+=) this micro-step's gradient here
//   grad_ready(id, stream);                      // written; releases the buffer
// When every parameter of a group is ready the group's gradients are reduce-scattered at once,
// overlapping the rest of backward, and each rank keeps the sum of its own slice:
//   stage 1: the buffers are full-size flat gradient tensors (2 bytes/param with fp16 grads),
//            accumulated over the micro-steps of a step, reduce-scattered in the last one;
//   stage 2, 3: the buffers are `gradient_buckets` constant-size buckets reused across groups,
//            reduce-scattered every micro-step; the reduced slice lands in (is added to) the
//            optimizer's CPU-tier gradient shard. No full-size gradient exists.
//
// Parameters:
//   stages 1, 2: every rank holds the whole model (the groups' flat parameter tensors, homed in
//            param_home); step() all-gathers the updated slices in place.
//   stage 3:  every rank holds only its slice of each group (the shard, homed in param_home:
//            GPU, CPU or NVMe); acquire_param() gathers the group into a transient tensor in the
//            GPU arena and release_param() lets it go. Parameters below
//            persist_below_bytes stay whole on every rank, as in stage 2 (not worth a
//            collective each). See "Stage 3 fetching" below.
// step(): gradient-norm clipping and the overflow check on the shards, combined with one
// all-reduce so every rank decides the same; the Adam step on the own slice; stages 1–2 then
// all-gather every group. Model-state bytes per rank (Ψ parameters, K = 12, fp16):
//   stage 1: 4Ψ + KΨ/N     stage 2: 2Ψ + (2+K)Ψ/N     stage 3: (4+K)Ψ/N (+ persistent ones whole)
// Communication per step: stages 1–2, a reduce-scatter and an all-gather of every group (2Ψ);
// stage 3, a reduce-scatter and two all-gathers (forward and backward: 3Ψ), less the gathers
// that a kept group saves.
//
// Stage 3 fetching. The first step records the order in which groups are used (acquire_param of
// a group none of whose parameters is acquired); set_fetch_order() gives it up front instead.
// From then on each use gathers the groups that follow it in that order, up to prefetch_bytes of
// gathered parameters ahead, never letting the gathered bytes alive at once (in use, kept,
// prefetched) exceed max_live_bytes. When a group's last user releases it, it stays gathered if
// the order uses it again within reuse_window_bytes of gathers (the turn from forward to
// backward), and is dropped otherwise. When the order changes (a branch, another sequence
// length), the engine realigns to the recorded order where it can and otherwise fetches on
// demand for the rest of the step, recording the new order for the next. Every decision is a
// function of the sequence of calls, never of timing, so ranks that make the same calls issue
// the same collectives.
//
// Streams. Every collective is ordered on the engine's streams, never waited for by the
// trainer's thread: a reduce-scatter starts once the work that wrote its gradients on the
// trainer's stream is done, gathered parameters are ready for work issued on the stream given to
// acquire_param() (and, after step(), for any later acquire), and the host reads them after
// synchronizing that stream. NCCL runs on the streams; Gloo's worker waits for them, and its
// collectives' ends are host flags the streams wait for (Device::wait_host_flag); on a CUDA
// device Gloo's data crosses through pinned bounce buffers, copied on the streams. The calls that
// still wait on the host, and why, are listed in docs/zero.md. Create a Gloo communicator with
// the runtime's device (Communicator::from_environment(&runtime->device())); without it the host
// waits for each collective's inputs (warned once).
//
// Every rank must create the engine with the same parameters and options and make the same
// acquire_param/release_param/acquire_grad/grad_ready calls in the same order, from one thread
// (the same model, the same backward): collectives are matched by order. STRATA_COMM_DEBUG=on
// turns a disagreement into an error naming both calls; without it, a timeout naming the ranks.
//
// Checkpoints (save/load) hold each rank's slice plus the parameter map; load() accepts one
// written at any world size, stage, bucket size or alignment and reshards it, bitwise.
//
// Errors: a failed collective (a dead peer, a timeout) fails acquire_param()/grad_ready()/step()
// with the Communicator's message on every rank; the engine then refuses further work (recreate
// it and load the last checkpoint).
#pragma once

#include <absl/status/statusor.h>

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "strata/comm/communicator.h"
#include "strata/optimizer/offload_optimizer.h"
#include "strata/runtime/runtime.h"
#include "strata/zero/zero_layout.h"

namespace strata {

struct ZeroParam {
  std::string name;            // unique
  std::vector<int64_t> shape;  // elements = product (a scalar: {} or {1})
  uint32_t group = 0;          // Adam hyper-parameter group (ZeroOptions::groups)
  // fp32 initial values, shape's element count; empty: zeros (or `fill`). Every rank must pass
  // the same.
  std::span<const float> initial;
  // Instead of `initial`: writes the parameter's initial values into `values` (its element
  // count), called once during create(), while its flat group is being set up, so that a model's
  // fp32 values never exist whole on the host (only one group's at a time). An error fails
  // create() with the parameter's name.
  std::function<absl::Status(std::span<float> values)> fill;
};

// Stage 3's gathered-bytes limit when ZeroOptions::max_live_bytes is unset.
inline constexpr uint64_t kAutoMaxLiveBytes = 1ULL << 30;

struct ZeroOptions {
  uint32_t stage = 2;  // 1: optimizer states partitioned; 2: gradients too; 3: parameters too
  ParamType param_type = ParamType::kF16;
  GradType grad_type = GradType::kF16;
  // The most gradient bytes of one flat group (one reduce-scatter). A parameter is never split:
  // one larger than this gets a group of its own. Small: more, smaller collectives; large: less
  // overlap and (stage 2) more bucket memory. Default as DeepSpeed's reduce_bucket_size in bytes of
  // fp16.
  uint64_t bucket_bytes = 32ULL << 20;
  // Stage 2: buckets in use at once (one filling while another is reduced). >= 1.
  uint32_t gradient_buckets = 2;
  // Every group is padded to a multiple of ranks × alignment elements.
  uint32_t alignment = 64;
  // Where the flat parameter tensors (and stage 1's gradients, stage 2–3's buckets) are homed.
  // Stage 3: where each rank's parameter shards are homed, any tier (NVMe: each rank reads only
  // its own shard from its own drives); the persistent parameters are then homed in the CPU tier
  // (with an NVMe home) or here, the buckets in the GPU tier.
  TierKind param_home = TierKind::kGpu;
  // Stage 3: parameters of fewer bytes than this stay whole on every rank (DeepSpeed's
  // stage3_param_persistence_threshold, in bytes of param_type).
  uint64_t persist_below_bytes = 128ULL << 10;
  // Stage 3: gathered bytes fetched ahead of the group in use, along the recorded order.
  uint64_t prefetch_bytes = 64ULL << 20;
  // Stage 3: the most gathered bytes alive at once (in use, kept for reuse, prefetched). A use
  // that cannot fit even after dropping every group not in use is ResourceExhausted. Bounded
  // at creation by 3/4 of what the GPU tier holds beside the engine's own tensors homed there,
  // so that a gather never finds the arena full on one rank only; the trainer's own tensors
  // in the GPU tier must fit in the rest. Unset (the default): automatic, silently:
  // kAutoMaxLiveBytes (or the largest gathered group, when larger), bounded as above. A value
  // set above that bound is lowered to it with a warning (once).
  std::optional<uint64_t> max_live_bytes;
  // Stage 3: a released group stays gathered when the order uses it again within this many
  // gathered bytes (0: always dropped, every use gathers).
  uint64_t reuse_window_bytes = 64ULL << 20;
  // Stage 3: ZeRO++'s hierarchical partitioning (hpZ). 0: off. L > 0: the job's ranks are
  // nodes of L consecutive ranks (rank / L: torchrun's and strata-run's numbering); a group's
  // first gather after the parameters changed (forward's) is global and each rank keeps its
  // node's slice of it (padded / L elements, a secondary shard homed with the shards); the
  // group's later gathers until the next step() (backward's, the next micro-step's) run over
  // a communicator of the node's ranks (Communicator::split). Costs Ψ/L parameters per rank;
  // halves the gathers' cross-node bytes; the gathered values are the same, bitwise. L must
  // divide the ranks; L >= ranks (one node) leaves it off, as do stages 1-2 (a warning says
  // so). Every rank must pass the same. hpz_node_ranks_from_environment() reads
  // STRATA_ZERO_HPZ and LOCAL_WORLD_SIZE.
  uint32_t hpz_node_ranks = 0;
  // Micro-steps per step (gradient accumulation): step() expects every parameter's gradient
  // this many times.
  uint32_t accumulation_steps = 1;
  // Hyper-parameter groups; empty: one, optimizer.defaults.
  std::vector<AdamGroup> groups;
  // The optimizer of each rank's slice: state home, clipping, loss scaling, chunking.
  OffloadOptimizerOptions optimizer;
};

struct ZeroParamId {
  uint32_t index = UINT32_MAX;
  friend bool operator==(const ZeroParamId&, const ZeroParamId&) = default;
};

// Where a parameter lives: `count` elements of param_type at byte `offset` in `tensor`.
struct ZeroTensorView {
  TensorHandle tensor;
  uint64_t offset = 0;
  uint64_t count = 0;
};

// Bytes of this rank's model states by tier, from the store's record of the engine's tensors
// (TensorStore::info), indexed by TierKind: parameters, gradients (stage 1's full gradients or
// the reduced shard), optimizer states (master and moments) and stage 2's buckets.
struct ZeroMemory {
  // Stage 3: the shards and the persistent parameters (and hpZ's secondary slices).
  std::array<uint64_t, 3> params{};
  std::array<uint64_t, 3> grads{};
  std::array<uint64_t, 3> optimizer_states{};
  std::array<uint64_t, 3> buckets{};
  uint64_t gathered = 0;  // stage 3: gathered parameters held for use now (GPU arena)
  // Stage 3: dropped gathered groups whose memory returns to the arena once the work that used
  // them has ended (seen at the engine's next call). Neither is a model state.
  uint64_t retiring = 0;
  uint64_t model_states() const;  // params + grads + optimizer states, all tiers
};

struct ZeroStats {
  uint64_t steps = 0;            // step() calls that completed (skipped ones included)
  uint64_t micro_steps = 0;      // of the current step, completed by every group
  uint64_t reduce_scatters = 0;  // issued since create()
  uint64_t all_gathers = 0;
  // Communicator bytes (nccl-tests' sizes) from the end of the step before to the end of the
  // last one: its backward's reduce-scatters, the statistics all-reduce, the all-gathers (hpZ:
  // the node communicator's too), and whatever else the trainer ran on the same Communicator
  // meanwhile.
  uint64_t last_step_comm_bytes = 0;
  uint64_t last_step_ns = 0;       // step() wall time
  uint64_t last_step_wait_ns = 0;  // of which waiting for reduce-scatters still running
  uint64_t last_optimizer_ns = 0;  // of which the optimizer (statistics all-reduce included)
  uint64_t last_gather_ns = 0;     // of which the parameter all-gathers
  // Stage 3 fetching, since create():
  uint64_t fetches = 0;            // uses of a group (its first parameter acquired)
  uint64_t gathers_on_demand = 0;  // gathered at its use: not prefetched, not kept
  uint64_t gathers_prefetched = 0;
  // Used while its prefetched gather was still running (Gloo; NCCL does not tell the host: 0).
  // A statistic of timing: the use then waits on its stream, not on the host.
  uint64_t prefetch_late = 0;
  uint64_t reuses = 0;                  // used while still gathered from an earlier use
  uint64_t gathers_dropped_unused = 0;  // prefetched, then dropped (order changed, room needed)
  uint64_t order_changes = 0;           // uses that departed from the recorded order
  uint64_t gathered_bytes = 0;          // gathered parameter bytes held for use now
  uint64_t retiring_bytes = 0;          // dropped, returned once the work that used them has ended
  uint64_t gathered_peak_bytes = 0;     // of the two together (what max_live_bytes bounds)
  // Host time acquire_param() spent fetching: issuing gathers and prefetches, making room, a
  // shard's NVMe read. The gathers themselves are waited for on the trainer's stream.
  uint64_t fetch_wait_ns = 0;
  // Stages 2-3, since create(): acquire_grad() waiting for a bucket to come back from its
  // reduce-scatter (exposed communication too).
  uint64_t bucket_wait_ns = 0;
  // Stage 3, since create(): gathered bytes (nccl-tests' all_gather size, padding included) of
  // the partitioned groups' gathers over the job's communicator, and (hpZ) over the node's.
  // Of a global gather, (N - L)/N of the bytes cross nodes (docs/zero.md); none of a node's.
  uint64_t global_gather_bytes = 0;
  uint64_t node_gather_bytes = 0;
};

// ZeroOptions::hpz_node_ranks from the environment: STRATA_ZERO_HPZ=1 (on, true) takes the
// node's rank count from LOCAL_WORLD_SIZE (as torchrun and strata-run set it); unset, 0, off or
// false: 0. InvalidArgument names a bad value.
absl::StatusOr<uint32_t> hpz_node_ranks_from_environment();

class ZeroEngine {
 public:
  // Lays out `params`, creates the flat tensors in the runtime's store and the optimizer of
  // this rank's slices (initialised from ZeroParam::initial). The runtime and the communicator
  // must outlive the engine. InvalidArgument names a bad option or parameter.
  static absl::StatusOr<std::unique_ptr<ZeroEngine>> create(Runtime& runtime, Communicator& comm,
                                                            std::span<const ZeroParam> params,
                                                            ZeroOptions options);
  ~ZeroEngine();
  ZeroEngine(const ZeroEngine&) = delete;
  ZeroEngine& operator=(const ZeroEngine&) = delete;

  absl::StatusOr<ZeroParamId> find(std::string_view name) const;
  uint32_t param_count() const;
  const ZeroLayout& layout() const;
  const ZeroOptions& options() const;

  // The model's copy of a parameter: stages 1–2 and stage 3's persistent parameters. Stage 3's
  // partitioned parameters have none (FailedPrecondition): acquire them.
  absl::StatusOr<ZeroTensorView> param_view(ZeroParamId id) const;
  // The parameter's elements in `tier`, for work on `stream`, until release_param(). Stages 1–2
  // wrap the store's acquire of its group tensor. Stage 3 gathers the group first (or finds it
  // gathered or prefetched) and returns without waiting for the gather: `stream` does (the host
  // reads after synchronizing it). Its partitioned parameters are read-only (kWrite, kOverwrite:
  // InvalidArgument), since the optimizer owns them. At stages 1–2 kOverwrite is kWrite: the
  // parameter shares its group's tensor with others, whose values a tensor-wide overwrite would
  // leave undefined. Acquire once, release once, per use.
  absl::StatusOr<void*> acquire_param(ZeroParamId id, TierKind tier, Stream& stream,
                                      AccessMode mode = AccessMode::kRead);
  absl::Status release_param(ZeroParamId id, Stream& stream);
  // Stage 3: the order in which the next steps use the parameters (repeats allowed: forward then
  // backward), replacing the recorded one. Every rank must give the same.
  absl::Status set_fetch_order(std::span<const ZeroParamId> order);

  // This micro-step's gradient buffer of the parameter (count elements of grad_type): add the
  // gradient into it, with work on `stream` (or, from the host, after synchronizing `stream`:
  // the buffer may still be read by the previous reduce-scatter's copies). Stage 2 may wait here
  // for a bucket to come back from its reduce-scatter.
  absl::StatusOr<void*> acquire_grad(ZeroParamId id, TierKind tier, Stream& stream);
  // The gradient is complete once the work issued on `stream` so far is done. Releases the
  // buffer; the parameter's group is reduce-scattered when it is complete.
  absl::Status grad_ready(ZeroParamId id, Stream& stream);

  // After `accumulation_steps` micro-steps: waits for the reduce-scatters, steps this rank's
  // slices (clipping and overflow decided over all ranks) and all-gathers the parameters (stage
  // 3: only the persistent ones; gathered groups are dropped, and the first groups of the order
  // prefetched for the next step). Returns with the all-gathers ordered on the engine's stream:
  // later acquires of the parameters wait for them on their streams. No parameter may be
  // acquired. On a skipped step (overflow) the parameters stay as they were.
  absl::StatusOr<StepResult> step();
  // Drops the gradients of the micro-steps since the last step (every rank must call it).
  absl::Status zero_grad();

  // Changes hyper-parameter group `group` (an index into ZeroOptions::groups) for the steps to
  // come: a learning-rate schedule. Every rank must call it with the same values (each steps
  // its own slice with them; nothing checks that they agree), between step() and the next
  // backward. With the overlapped step, a change made after early work has begun (during
  // backward) is still exact: step() redoes that work with the new values, losing the overlap
  // for that step. NotFound names a group the engine lacks; InvalidArgument a bad value.
  absl::Status set_group(uint32_t group, const AdamGroup& hyper);
  // The group's hyper-parameters now (set_group's, or ZeroOptions::groups').
  absl::StatusOr<AdamGroup> group(uint32_t group) const;

  // Collective. Writes this rank's slices and, from rank 0, the manifest with the layout;
  // `directory` is shared by the ranks (a local or network file system).
  absl::Status save(const std::string& directory);
  // Collective. Loads a checkpoint saved at any world size and layout for the same parameters
  // (names, shapes, groups) and sets every parameter to its master, rounded.
  absl::Status load(const std::string& directory);

  // Collective: the whole fp32 master and moments of a parameter, gathered from the ranks that
  // own its pieces (spans may be empty to skip). For checks and exports.
  absl::Status read_state(ZeroParamId id, std::span<float> master, std::span<float> exp_avg,
                          std::span<float> exp_avg_sq);

  ZeroMemory memory() const;
  ZeroStats stats() const;
  OffloadOptimizer& optimizer();
  // Blocks until every reduce-scatter issued so far has landed in the optimizer (tests and
  // benches that separate the overlapped step's early work from step(); training never needs
  // it).
  void wait_for_gradients();
  Communicator& communicator();
  // hpZ: the node's communicator (its ranks' gathers); null without hpZ.
  Communicator* node_communicator();
  Runtime& runtime();

  struct Impl;
  explicit ZeroEngine(std::unique_ptr<Impl> impl);  // use create()

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata
