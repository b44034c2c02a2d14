// OffloadOptimizer: ZeRO-Offload's optimizer step, with ZeRO-Infinity's NVMe-resident states.
//
// The model computes with low-precision parameters on the GPU (store tensors); their fp32
// master weights and Adam moments live in the pinned CPU tier, or on NVMe, and the Adam step
// runs on the CPU (cpu_adam.h). Per training step:
//
//   backward: grad_ready(p, stream) as each gradient is produced. The gradient's D2H copy starts
//             at once and overlaps the rest of backward; when it lands, its sum of squares and
//             inf/nan flag are computed, so step() needs no extra pass over the gradients.
//   step():   global gradient-norm clipping and overflow skipping, then chunk by chunk: Adam on
//             the CPU, H2D of the updated parameters (chunk k's copies overlap chunk k+1's step).
//             With states on NVMe the step streams them: read chunk k+1, step chunk k, write
//             chunk k-1, with at most three staging chunks of pinned memory in use.
//
// Several grad_ready() calls for a parameter before step() accumulate (sum) its gradient, as
// torch's .grad does: gradient accumulation over micro-steps. The sum is kept in the gradient's
// own dtype, each micro-step rounded to nearest even, as torch accumulates an fp16 .grad.
//
// Data safety: a step either applies completely or not at all. An inf/nan gradient skips the
// step before anything is touched. With states on NVMe every chunk has two swap slots; a step
// writes the slot not holding the last committed state and commits only when every write has
// completed, so an I/O error fails the step, leaves the previous states readable, and puts the
// previous parameters back on the GPU. The gradients stay landed: step() can be retried.
// With states in the CPU tier they are updated in place (no I/O can fail there).
//
// Overlapped step (options.overlap, docs/optimizer.md): each parameter's Adam (with states on
// NVMe: each chunk's, once all its parameters' gradients are in) runs on a background thread as
// soon as its gradient for this step is final, while backward goes on. Early results stay on
// the host: the GPU copy is written only when step() has validated them — the global norm
// did not clip, nothing overflowed, hyper-parameters and loss scale are those the early step
// used, the gradient did not land again. Otherwise the early work is rolled back (states in the
// CPU tier: from a backup taken before the early step; on NVMe: the new states went to the
// uncommitted slot and are dropped) and stepped again in step(). Either way the result is
// bitwise that of the plain step. save(), load(), read_state(), write_state(), add_param() and
// zero_grad() between landings and step() roll early work back first.
//
// Thread-safe: grad_ready() may be called from several threads; step(), save() and load() wait
// for gradients still landing.
#pragma once

#include <absl/status/statusor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "strata/config/cpu_pool_settings.h"
#include "strata/device/device.h"
#include "strata/optimizer/cpu_adam.h"
#include "strata/runtime/runtime.h"
#include "strata/store/tensor_store.h"
#include "strata/store/tier.h"

namespace strata {

// The dtype of the parameter copy the model computes with.
enum class ParamType { kF32, kF16, kBF16 };

// Bytes per element of a parameter or gradient type.
uint64_t element_bytes(ParamType type);
uint64_t element_bytes(GradType type);
// dst[i] = master[i] rounded to `type` (round to nearest even): the parameter a master weight
// becomes (the optimizer's step, and ZeRO's initial shards).
void round_master(const float* master, ParamType type, void* dst, uint64_t count);

// Hyper-parameters of one parameter group (torch's param_groups); changeable between steps.
// The same struct as the kernels' (cpu_adam.h): the defaults are documented there.
using AdamGroup = AdamHyper;

// fp16 loss scaling: gradients arrive multiplied by the scale. With `dynamic`, an overflow
// halves it (backoff) and `growth_interval` steps in a row without one double it (growth), as
// torch.cuda.amp.GradScaler.
struct LossScaling {
  float scale = 1.0F;
  bool dynamic = false;
  float growth_factor = 2.0F;
  float backoff_factor = 0.5F;
  uint32_t growth_interval = 2000;
  float min_scale = 1.0F;
};

// The gradient statistics step() decides clipping and overflow on.
struct GradStatistics {
  double sq_sum = 0.0;  // Σ g² of the landed gradients, as they are (loss scale included)
  bool non_finite = false;
};

// The overlapped step (see the header comment). Host memory it takes, allocated from the CPU
// tier on a parameter's first early step and kept: with states in the CPU tier a backup of the
// states (12 bytes an element) and, for fp16/bf16 parameters, the updated copy held until
// validation (2 bytes); with states on NVMe only the updated copy (2 bytes; 4 for fp32).
struct OverlapOptions {
  bool enabled = false;
  // Cap on those bytes; 0: only the CPU tier's capacity. A parameter that does not fit is
  // stepped in step(), as without overlap.
  uint64_t max_host_bytes = 0;
};

// Whether a landing completes its parameter's gradient for this step (options.overlap).
enum class GradCompletion {
  kOptimizerDefault,  // set_final_micro_step()'s setting (final unless told otherwise)
  kFinal,             // the last landing of this step: its Adam may start
  kMore,              // a micro-step that later landings add to
};

struct OffloadOptimizerOptions {
  // Where master weights and moments live: kCpu (pinned CPU tier) or kNvme (swap space,
  // streamed through staging chunks during the step).
  TierKind state_home = TierKind::kCpu;
  AdamGroup defaults;          // group 0
  float max_grad_norm = 0.0F;  // > 0: clip the global L2 norm of the gradients to this
  bool skip_on_overflow = true;
  LossScaling loss_scaling;
  // Elements per pipeline chunk; 0 derives it from the staging chunk size. The NVMe layout is
  // fixed by the chunk size at create(): load() accepts checkpoints of any chunking.
  uint64_t chunk_elements = 0;
  CpuIsa isa = CpuIsa::kAuto;  // tests force a kernel variant
  OverlapOptions overlap;
  // Data parallelism (ZeroEngine): each rank's optimizer holds part of the parameters, and its
  // gradients are sums over `grad_divisor` ranks. step() hands its local statistics to
  // `combine_grad_stats` (every rank, every step, also when nothing landed) and decides on
  // what comes back, so that every rank clips by the same norm and skips the same steps.
  std::function<absl::StatusOr<GradStatistics>(const GradStatistics&)> combine_grad_stats;
  float grad_divisor = 1.0F;  // gradients (and their norm) are divided by this before use
  // The CPUs the Adam kernels run on (cpu_pool.h; docs/optimizer.md, "Thread placement"):
  // nullopt takes the runtime's configuration (STRATA_ADAM_THREADS, STRATA_ADAM_RESERVE,
  // STRATA_ADAM_PIN). Each optimizer has its own pool, placed on the NUMA node of its states.
  std::optional<CpuPoolSettings> adam_pool;
};

// Where a parameter's gradient comes from.
enum class GradSource {
  kDevice,  // grad_ready(): `grad` is copied (D2H) into a CPU-tier landing buffer
  kHost,    // land_grad(): host memory the caller passes is copied (or added) into it
  kView,    // grad_written(): `grad` itself, at grad_offset, read in `grad_tier`; no copy
};

struct ParamSpec {
  std::string name;    // unique; the optimizer's own tensors are named "<name>.master" etc.
  TensorHandle param;  // `count` elements of `param_type`: the copy the model computes with
  TensorHandle grad;   // `count` elements of `grad_type`: written by backward
  ParamType param_type = ParamType::kF16;
  GradType grad_type = GradType::kF16;
  uint64_t count = 0;
  uint32_t group = 0;
  uint64_t param_offset = 0;  // bytes: the parameter is `count` elements from here in `param`
  // The tier through which the host reads `param` (when no initial master is given) and writes
  // it from a master (add_param, load, write_state): the CPU tier, or the GPU tier where it is
  // host memory (the host backend), which keeps a GPU-homed parameter from a second copy.
  TierKind param_host_tier = TierKind::kCpu;
  GradSource grad_source = GradSource::kDevice;
  uint64_t grad_offset = 0;             // bytes, GradSource::kView
  TierKind grad_tier = TierKind::kCpu;  // GradSource::kView: a tier the host can read
  // Initial fp32 master weights (`count` values), copied at add_param(); empty: the parameter
  // tensor's current contents, widened. The parameter tensor is then set to the rounded master,
  // so that the model and the optimizer start from the same weights.
  std::span<const float> initial_master;
};

struct ParamId {
  uint32_t index = UINT32_MAX;
  friend bool operator==(const ParamId&, const ParamId&) = default;
};

struct StepResult {
  bool skipped = false;    // an inf/nan gradient: nothing was updated, the gradients dropped
  double grad_norm = 0.0;  // global L2 norm of the unscaled gradients, before clipping
  double clip_coef = 1.0;  // factor the gradients were multiplied by (1: no clipping)
  uint64_t params_updated = 0;
  uint64_t step = 0;        // optimizer steps taken so far (skipped ones excluded)
  float loss_scale = 1.0F;  // the scale to use for the next backward
  // Overlap: elements whose Adam ran early and held, and whether early work was rolled back
  // (clipping, overflow, a changed hyper-parameter or loss scale, a second landing).
  uint64_t early_elements = 0;
  bool rolled_back = false;
};

struct OffloadOptimizerStats {
  uint64_t steps = 0;
  uint64_t skipped_steps = 0;
  uint64_t failed_steps = 0;
  uint64_t grads_landed = 0;  // grad_ready() calls completed
  uint64_t grad_bytes_landed = 0;
  uint64_t params = 0;
  uint64_t elements = 0;
  uint64_t chunk_elements = 0;
  uint64_t chunks = 0;             // chunk_elements-sized pieces of all registered elements
  uint64_t last_step_ns = 0;       // host time of the last step()
  uint64_t last_step_wait_ns = 0;  // of which waiting for gradients still landing
  uint64_t last_adam_ns = 0;       // of which running the CPU Adam kernels
  uint64_t last_nvme_wait_ns = 0;  // of which waiting for NVMe reads/writes
  uint64_t nvme_bytes_read = 0;
  uint64_t nvme_bytes_written = 0;
  // Swap bytes the states hold (states on NVMe): both slots of every chunk, each slot the
  // chunk's master and moments (12 bytes an element), each array rounded up to 1024 elements.
  uint64_t nvme_state_bytes = 0;
  uint64_t peak_staging_chunks = 0;  // pinned staging chunks held at once by one step
  // Overlapped step. last_step_ns is then what step() adds after backward: the time exposed.
  uint64_t overlap_early_steps = 0;    // steps in which early work was kept
  uint64_t overlap_rollbacks = 0;      // steps in which early work was rolled back
  uint64_t last_early_elements = 0;    // elements stepped early and kept, last step
  uint64_t last_redone_elements = 0;   // elements stepped early, rolled back, stepped again
  uint64_t last_early_adam_ns = 0;     // background time of the last step's early work
  uint64_t last_rollback_ns = 0;       // of last_step_ns: restoring backups
  uint64_t last_early_wait_ns = 0;     // of last_step_ns: waiting for the early stepper
  uint64_t overlap_host_bytes = 0;     // backups and held copies allocated
  uint64_t overlap_budget_misses = 0;  // parameters (chunks) stepped late: over max_host_bytes
};

class OffloadOptimizer {
 public:
  // The runtime must outlive the optimizer. FailedPrecondition when states are to live on NVMe
  // and the runtime has no NVMe tier.
  static absl::StatusOr<std::unique_ptr<OffloadOptimizer>> create(
      Runtime& runtime, OffloadOptimizerOptions options = {});
  ~OffloadOptimizer();
  OffloadOptimizer(const OffloadOptimizer&) = delete;
  OffloadOptimizer& operator=(const OffloadOptimizer&) = delete;

  absl::StatusOr<uint32_t> add_group(const AdamGroup& group);
  // Changes a group's hyper-parameters for the steps to come (a learning-rate schedule: call it
  // between step() and the next backward). With overlap, the early steps armed for the next
  // step take the new values while none has run; a change after one has (during backward) is
  // still applied exactly: step() sees that the early work used other values and redoes it.
  absl::Status set_group(uint32_t group, const AdamGroup& hyper);
  absl::StatusOr<AdamGroup> group(uint32_t group) const;
  absl::Status set_loss_scale(float scale);

  // Registers a parameter: creates its master/moment state (moments zero) and its landing
  // buffer for gradients in the CPU tier.
  absl::StatusOr<ParamId> add_param(const ParamSpec& spec);
  absl::StatusOr<ParamId> find_param(std::string_view name) const;

  // The parameter's gradient is complete once the work issued so far on `stream` is done.
  // Returns after issuing its D2H copy; the rest happens in the background.
  absl::Status grad_ready(ParamId param, Stream& stream,
                          GradCompletion completion = GradCompletion::kOptimizerDefault);
  // GradSource::kHost: `src` holds the parameter's gradient (count elements of grad_type) in
  // host memory. The first landing since the last step copies it, later ones add it; returns
  // once it has landed (its statistics computed).
  absl::Status land_grad(ParamId param, const void* src,
                         GradCompletion completion = GradCompletion::kOptimizerDefault);
  // GradSource::kView: the gradient in the `grad` tensor is final; computes its statistics.
  // With overlap, the tensor must not change again before step() unless announced again.
  absl::Status grad_written(ParamId param,
                            GradCompletion completion = GradCompletion::kOptimizerDefault);
  // With options.overlap: whether landings complete this step's gradients (true: the default,
  // set again by every step()) or belong to a micro-step that later ones add to (false).
  // Getting it wrong never changes a result: a parameter stepped early that lands again is
  // rolled back and stepped in step(); only the early work is lost.
  void set_final_micro_step(bool final);
  // Blocks until every early step queued so far has run (tests and benches that separate the
  // early work from step()'s; training never needs it).
  void wait_for_early_steps();
  // Drops every gradient landed since the last step.
  absl::Status zero_grad();

  // Steps every parameter that received a gradient since the last step. The updated
  // parameters are in their store tensors for any work issued after step() returns (the store
  // orders it). Errors leave the previous state in place (see the header comment).
  absl::StatusOr<StepResult> step();

  // Checkpoint: master weights, moments, step counts, hyper-parameters and the loss scale into
  // `directory` (created if missing; an existing checkpoint there is replaced atomically).
  absl::Status save(const std::string& directory);
  // Restores a checkpoint written by save() for the same parameters (names, counts), then sets
  // every parameter tensor to its rounded master: training resumes bit for bit.
  absl::Status load(const std::string& directory);

  // A copy of the parameter's fp32 state, for inspection and tests; spans may be empty to skip.
  absl::Status read_state(ParamId param, std::span<float> master, std::span<float> exp_avg,
                          std::span<float> exp_avg_sq);
  // Replaces a parameter's fp32 state and step count (checkpoint formats other than save()'s),
  // then sets its parameter tensor to the rounded master. With states on NVMe each chunk is
  // written to its other slot and committed once written.
  absl::Status write_state(ParamId param, std::span<const float> master,
                           std::span<const float> exp_avg, std::span<const float> exp_avg_sq,
                           uint64_t param_steps);
  // The step counter and the loss scaler's state, for checkpoints kept elsewhere.
  struct ScalerState {
    uint64_t step = 0;
    float loss_scale = 1.0F;
    uint64_t good_steps = 0;
  };
  ScalerState scaler_state() const;
  absl::Status set_scaler_state(const ScalerState& state);
  uint64_t step_count() const;
  uint64_t param_step_count(ParamId param) const;
  float loss_scale() const;
  OffloadOptimizerStats stats() const;

  struct Impl;
  explicit OffloadOptimizer(std::unique_ptr<Impl> impl);  // use create()

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata
