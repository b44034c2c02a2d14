// ZeroEngine: ZeRO-DP stages 1 and 2 over strata's tiers. Each of N data-parallel ranks keeps
// the optimizer states (fp32 master, Adam moments) of 1/N of the parameters, in the tier its
// OffloadOptimizer options choose (pinned CPU tier with the CPU Adam step, or NVMe), steps
// only that slice, and all-gathers the updated low-precision parameters.
//
// Layout (zero_layout.h): parameters are packed, in the order given, into flat groups of at
// most `bucket_bytes` of gradients, each padded to a multiple of N × alignment elements; rank r
// owns slice r of every group. The model's parameters are views into the groups' flat
// parameter tensors (param_view()).
//
// Gradients, per micro-step, as backward produces them:
//   void* g = acquire_grad(id, tier, stream);   // add (+=) this micro-step's gradient here
//   grad_ready(id, stream);                      // written; releases the buffer
// When every parameter of a group is ready the group's gradients are reduce-scattered at once,
// overlapping the rest of backward, and each rank keeps the sum of its own slice:
//   stage 1: the buffers are full-size flat gradient tensors (2 bytes/param with fp16 grads),
//            accumulated over the micro-steps of a step, reduce-scattered in the last one;
//   stage 2: the buffers are `gradient_buckets` constant-size buckets reused across groups,
//            reduce-scattered every micro-step; the reduced slice lands in (is added to) the
//            optimizer's CPU-tier gradient shard. No full-size gradient exists.
// step(): gradient-norm clipping and the overflow check on the shards, combined with one
// all-reduce so every rank decides the same; the Adam step on the own slice; an in-place
// all-gather of every group's parameters. Model-state bytes per rank (Ψ parameters, K = 12):
//   stage 1: 4Ψ + KΨ/N       stage 2: 2Ψ + (2+K)Ψ/N (+ the buckets)
// Communication per step: a reduce-scatter and an all-gather of every group (2Ψ elements).
//
// Every rank must create the engine with the same parameters and options and announce the
// gradients of the same groups in the same order (the same backward): the collectives are
// matched by order. STRATA_COMM_DEBUG=on turns a disagreement into an error naming both calls.
//
// Checkpoints (save/load) hold each rank's slice plus the parameter map; load() accepts one
// written at any world size, bucket size or alignment and reshards it, bitwise.
//
// Errors: a failed collective (a dead peer, a timeout) fails grad_ready()/step() with the
// Communicator's message on every rank; the engine then refuses further work (recreate it and
// load the last checkpoint).
#pragma once

#include <absl/status/statusor.h>

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "strata/comm/communicator.h"
#include "strata/offload/offload_optimizer.h"
#include "strata/offload/zero_layout.h"
#include "strata/runtime/runtime.h"

namespace strata {

struct ZeroParam {
  std::string name;            // unique
  std::vector<int64_t> shape;  // elements = product (a scalar: {} or {1})
  uint32_t group = 0;          // Adam hyper-parameter group (ZeroOptions::groups)
  // fp32 initial values, shape's element count; empty: zeros. Every rank must pass the same.
  std::span<const float> initial;
};

struct ZeroOptions {
  uint32_t stage = 2;  // 1: optimizer states partitioned; 2: gradients too
  ParamType param_type = ParamType::kF16;
  GradType grad_type = GradType::kF16;
  // The most gradient bytes of one flat group (one reduce-scatter). A parameter larger than this
  // is split across groups. Small: more, smaller collectives; large: less overlap and (stage 2)
  // more bucket memory. Default as DeepSpeed's reduce_bucket_size in bytes of fp16.
  uint64_t bucket_bytes = 32ULL << 20;
  // Stage 2: buckets in use at once (one filling while another is reduced). >= 1.
  uint32_t gradient_buckets = 2;
  // Every group is padded to a multiple of ranks × alignment elements.
  uint32_t alignment = 64;
  // Where the flat parameter tensors (and stage 1's gradients) are homed.
  TierKind param_home = TierKind::kGpu;
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
  std::array<uint64_t, 3> params{};
  std::array<uint64_t, 3> grads{};
  std::array<uint64_t, 3> optimizer_states{};
  std::array<uint64_t, 3> buckets{};
  uint64_t model_states() const;  // params + grads + optimizer states, all tiers
};

struct ZeroStats {
  uint64_t steps = 0;            // step() calls that completed (skipped ones included)
  uint64_t micro_steps = 0;      // of the current step, completed by every group
  uint64_t reduce_scatters = 0;  // issued since create()
  uint64_t all_gathers = 0;
  // Communicator bytes (nccl-tests' sizes) from the end of the step before to the end of the
  // last one: its backward's reduce-scatters, the statistics all-reduce, the all-gathers (and
  // whatever else the trainer ran on the same Communicator meanwhile).
  uint64_t last_step_comm_bytes = 0;
  uint64_t last_step_ns = 0;       // step() wall time
  uint64_t last_step_wait_ns = 0;  // of which waiting for reduce-scatters still running
  uint64_t last_optimizer_ns = 0;  // of which the optimizer (statistics all-reduce included)
  uint64_t last_gather_ns = 0;     // of which the parameter all-gathers
};

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

  // The model's copy of a parameter. acquire_param()/release_param() wrap the store's
  // acquire/release of its group tensor and add the offset.
  absl::StatusOr<ZeroTensorView> param_view(ZeroParamId id) const;
  absl::StatusOr<void*> acquire_param(ZeroParamId id, TierKind tier, Stream& stream,
                                      AccessMode mode = AccessMode::kRead);
  absl::Status release_param(ZeroParamId id, Stream& stream);

  // This micro-step's gradient buffer of the parameter (count elements of grad_type): add the
  // gradient into it, with work on `stream` (or, from the host, after synchronizing `stream`:
  // the buffer may still be read by the previous reduce-scatter's copies). Stage 2 may wait here
  // for a bucket to come back from its reduce-scatter.
  absl::StatusOr<void*> acquire_grad(ZeroParamId id, TierKind tier, Stream& stream);
  // The gradient is complete once the work issued on `stream` so far is done. Releases the
  // buffer; the parameter's group is reduce-scattered when it is complete.
  absl::Status grad_ready(ZeroParamId id, Stream& stream);

  // After `accumulation_steps` micro-steps: waits for the reduce-scatters, steps this rank's
  // slices (clipping and overflow decided over all ranks) and all-gathers the parameters. On
  // a skipped step (overflow) the parameters stay as they were and nothing is gathered.
  absl::StatusOr<StepResult> step();
  // Drops the gradients of the micro-steps since the last step (every rank must call it).
  absl::Status zero_grad();

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
  Communicator& communicator();
  Runtime& runtime();

  struct Impl;
  explicit ZeroEngine(std::unique_ptr<Impl> impl);  // use create()

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata
