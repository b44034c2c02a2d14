// OffloadOptimizer's shared state, private to offload/ (its small helpers are defined in
// optimizer_impl.cc): the API and registration (offload_optimizer.cc), gradient landing
// (grad_landing.cc), the step (optimizer_step.cc), the NVMe state layout (nvme_states.cc) and
// checkpoints (optimizer_checkpoint.cc).
#pragma once

#include <absl/status/statusor.h>
#include <absl/synchronization/mutex.h>

#include <array>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "overlap_phase.h"
#include "strata/nvme/swap_space.h"
#include "strata/optimizer/cpu_pool.h"
#include "strata/optimizer/offload_optimizer.h"
#include "strata/store/staging.h"

namespace strata {

ParamCopyType copy_type(ParamType type);  // (element_bytes, round_master: offload_optimizer.h)
// dst[i] = src[i] widened to fp32.
void widen_param(const void* src, ParamType type, float* dst, uint64_t count);

// A one-shot completion an I/O callback signals and the step thread waits for.
class Completion {
 public:
  void signal(absl::Status status);
  absl::Status wait();  // blocks until signalled
  bool pending() const;

 private:
  mutable absl::Mutex mu_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
};

// NVMe state arrays are whole multiples of this many elements (4 KiB of fp32), so that each
// array of a chunk starts aligned for O_DIRECT.
inline constexpr uint64_t kNvmeChunkGranule = 1024;

// A contiguous run of one parameter's elements inside a pipeline chunk.
struct Piece {
  uint32_t param = 0;
  uint64_t offset = 0;        // element offset in the parameter
  uint64_t count = 0;         // elements
  uint64_t chunk_offset = 0;  // element offset in the chunk
};

struct OffloadOptimizer::Impl {
  struct Param {
    std::string name;
    TensorHandle param;
    TensorHandle grad;
    ParamType param_type = ParamType::kF16;
    GradType grad_type = GradType::kF16;
    uint64_t count = 0;
    uint32_t group = 0;
    uint64_t flat_offset = 0;   // first element in the concatenation of all parameters
    uint64_t param_offset = 0;  // bytes into `param`
    TierKind param_host_tier = TierKind::kCpu;
    GradSource grad_source = GradSource::kDevice;
    // Where step() reads the gradient: the landing buffer (CPU tier, owned) or, for kView, the
    // caller's tensor at an offset in the tier it names.
    TensorHandle grad_host;
    bool owns_grad_host = true;
    TierKind grad_tier = TierKind::kCpu;
    uint64_t grad_offset = 0;  // bytes
    // States in the CPU tier (state_home == kCpu); on NVMe they live in `chunks`.
    TensorHandle master;
    TensorHandle exp_avg;
    TensorHandle exp_avg_sq;
    uint64_t steps = 0;  // steps this parameter took: its Adam bias correction
    // Overlap (early_step.cc), created on the first early step: with states in the CPU tier,
    // master, exp_avg and exp_avg_sq as they were before it (a rollback swaps these handles
    // with the three above: no copy); the updated parameter copy (param_type; fp32 with states
    // on NVMe) until step() validates it.
    std::array<TensorHandle, 3> backup;
    TensorHandle held_copy;
  };

  // What early steps assume of step(): compared there, any difference rolls them back.
  struct EarlyPlan {
    std::vector<AdamGroup> groups;
    float loss_scale = 1.0F;
    std::vector<uint64_t> param_steps;  // each parameter's step count
    // Each parameter's units: [first, last] chunks on NVMe, itself with states in the CPU tier;
    // each unit's parameters [first, last] and how many.
    std::vector<std::pair<uint32_t, uint32_t>> units_of_param;
    std::vector<std::pair<uint32_t, uint32_t>> params_of_unit;
  };

  // One early unit's progress: a parameter (states in the CPU tier) or a chunk (on NVMe).
  enum class Early : uint8_t {
    kNone,     // not stepped early (step() steps it, as without overlap)
    kQueued,   // its gradient is final: waiting for the stepper
    kStepped,  // stepped early, pending validation
    kStale,    // stepped early, then its gradient changed or the step failed: step() redoes it
  };
  struct EarlyUnit {
    Early state = Early::kNone;
    bool backed_up = false;  // CPU states: the backup holds the pre-step states
    uint64_t order = 0;      // when it was queued: uploads go in reverse (forward order)
  };

  // The landing state of one parameter's gradient, guarded by landing_mu.
  struct Landing {
    uint32_t landed = 0;   // landings processed since the last step (0: no gradient)
    uint32_t pending = 0;  // landings issued, not processed yet
    double sq_sum = 0.0;   // of the accumulated gradient, after the latest landing
    bool non_finite = false;
    double partial_sq = 0.0;  // of the landing whose pieces are being processed
    bool partial_non_finite = false;
    absl::Status failed;      // a landing that did not complete: the gradient is incomplete
    bool final_seen = false;  // overlap: a final landing since arming (NVMe chunk counting)
  };

  // One D2H copy to process once it has completed.
  struct LandingJob {
    uint32_t param = 0;
    std::unique_ptr<Event> copied;
    bool direct = false;       // straight into grad_host, which this job holds acquired
    void* host = nullptr;      // direct: grad_host's address
    absl::Status aborted;      // issuing failed after earlier pieces were queued: end the landing
    StagingPool::Lease lease;  // otherwise: one piece in a staging chunk, to add
    uint64_t offset = 0;       // elements
    uint64_t count = 0;
    bool first_piece = false;
    bool last_piece = false;
    bool final = false;  // overlap: the landing completes the gradient for this step
  };

  // With states on NVMe: one chunk of chunk_elements elements, [master | exp_avg | exp_avg_sq]
  // in each of two swap slots; `current` holds the committed state. Each array holds `stride`
  // elements: the chunk's registered elements rounded up to kNvmeChunkGranule, so that a chunk
  // the parameters fill only partly (the last one; all of them with small parameters) is read
  // and written at the size of its states, not of a whole chunk.
  struct NvmeChunk {
    ExtentHandle slots[2];
    uint32_t current = 0;
    uint64_t stride = 0;
  };

  Impl(Runtime& r, OffloadOptimizerOptions o) : runtime(r), options(std::move(o)) {}

  Runtime& runtime;
  const OffloadOptimizerOptions options;
  StagingPool* pool = nullptr;            // the runtime's, or own_pool
  std::unique_ptr<StagingPool> own_pool;  // without an NVMe tier the runtime has none
  uint64_t chunk_elements = 0;
  std::unique_ptr<Stream> d2h_stream;  // gradient landings
  std::unique_ptr<Stream> h2d_stream;  // parameter updates
  // The lander's releases and acquires of landing buffers, after it has waited for their copy:
  // nothing is queued on it, so they are ready at once. On d2h_stream they would wait behind
  // the landings issued since (and the trainer's compute those wait for): an early step, or
  // an accumulating landing, that acquires the buffer would wait for the end of backward.
  std::unique_ptr<Stream> lander_stream;

  // Serialises step(), save(), load(), add_param(), read_state(): they change the layout or
  // the states. Held before landing_mu/state_mu, never while waiting for them in reverse.
  absl::Mutex step_mu;
  // Serialises issuing landings, so that a parameter's landings queue in call order.
  absl::Mutex issue_mu;

  mutable absl::Mutex state_mu;  // the registry below, read by every call
  std::vector<Param> params ABSL_GUARDED_BY(state_mu);
  std::vector<AdamGroup> groups ABSL_GUARDED_BY(state_mu);
  std::vector<NvmeChunk> chunks ABSL_GUARDED_BY(state_mu);
  uint64_t elements ABSL_GUARDED_BY(state_mu) = 0;
  uint64_t step_count ABSL_GUARDED_BY(state_mu) = 0;
  float loss_scale ABSL_GUARDED_BY(state_mu) = 1.0F;
  uint64_t good_steps ABSL_GUARDED_BY(state_mu) = 0;  // since the last overflow (growth)
  OffloadOptimizerStats counters ABSL_GUARDED_BY(state_mu);

  mutable absl::Mutex landing_mu;
  absl::CondVar landing_changed;
  std::vector<Landing> landings ABSL_GUARDED_BY(landing_mu);
  std::deque<LandingJob> jobs ABSL_GUARDED_BY(landing_mu);
  bool stopping ABSL_GUARDED_BY(landing_mu) = false;
  std::thread lander;

  // Overlap (early_step.cc), guarded by landing_mu: the stepper thread steps queued units.
  bool final_default ABSL_GUARDED_BY(landing_mu) = true;  // set_final_micro_step()
  OverlapPhase overlap ABSL_GUARDED_BY(landing_mu);       // armed: final landings queue early steps
  std::shared_ptr<const EarlyPlan> early_plan ABSL_GUARDED_BY(landing_mu);
  std::vector<EarlyUnit> early_units ABSL_GUARDED_BY(landing_mu);
  std::vector<uint32_t> unit_finals ABSL_GUARDED_BY(landing_mu);  // its parameters now final
  std::deque<uint32_t> early_queue ABSL_GUARDED_BY(landing_mu);
  uint64_t early_order ABSL_GUARDED_BY(landing_mu) = 0;
  // The parameters the stepper reads right now: a landing into one of them waits.
  std::pair<uint32_t, uint32_t> early_busy ABSL_GUARDED_BY(landing_mu) = {1, 0};  // [first, last]
  bool early_running ABSL_GUARDED_BY(landing_mu) = false;
  // A unit taken off the queue whose step has not begun (the stepper is getting its staging
  // chunk): wait_for_early_steps() waits for it too; quiesce_stepper() need not (the unit is
  // still kQueued, and the stepper drops it once settle_early() has reset it).
  bool early_claimed ABSL_GUARDED_BY(landing_mu) = false;
  uint64_t early_ns ABSL_GUARDED_BY(landing_mu) = 0;  // stepper time since arming
  std::unique_ptr<Stream> early_stream;               // the stepper's acquires
  std::thread stepper;

  // Registry access.
  absl::StatusOr<Param> param_copy(ParamId id) const;
  std::vector<Param> params_snapshot() const;

  // grad_landing.cc
  void run_lander();
  absl::Status process(LandingJob& job);
  absl::Status issue_landing(uint32_t index, const Param& p, Stream& stream,
                             GradCompletion completion);
  void wait_for_landings();  // every issued landing processed

  // early_step.cc
  void run_stepper();
  absl::Status step_unit(uint32_t unit, const EarlyPlan& plan);
  absl::Status step_param_early(uint32_t index, const EarlyPlan& plan, bool& missed);
  absl::Status step_chunk_early(uint32_t chunk, const EarlyPlan& plan, StagingPool::Lease lease,
                                bool& missed);
  // Creates a parameter's overlap buffers within the budget; false: they do not fit.
  absl::StatusOr<bool> overlap_buffers(uint32_t index, bool backup);
  // Arms early steps for the landings to come (options.overlap): snapshots the plan. Takes
  // state_mu, then landing_mu. Refused while step() settles (OverlapPhase).
  void arm();
  // step() has set the next step's loss scale and counts: arm() may follow. Takes landing_mu.
  void end_settling();
  // A landing is about to write parameter `index`'s gradient: waits while the stepper reads it,
  // and unqueues its units (queued) or marks them stale (stepped early).
  void before_grad_write(uint32_t index) ABSL_EXCLUSIVE_LOCKS_REQUIRED(landing_mu);
  // A landing of parameter `index` was processed: queues its units once their gradients are final.
  void note_landing(uint32_t index, bool final) ABSL_EXCLUSIVE_LOCKS_REQUIRED(landing_mu);
  bool final_of(GradCompletion completion) ABSL_EXCLUSIVE_LOCKS_REQUIRED(landing_mu) {
    return completion == GradCompletion::kFinal ||
           (completion == GradCompletion::kOptimizerDefault && final_default);
  }
  // Blocks while the stepper reads parameter `index`'s gradient (a landing is about to write it).
  void wait_until_unread(uint32_t index) ABSL_EXCLUSIVE_LOCKS_REQUIRED(landing_mu);
  // Stops queueing and waits for the stepper; queued units are dropped (step() steps them).
  void quiesce_stepper() ABSL_EXCLUSIVE_LOCKS_REQUIRED(landing_mu);
  // set_group(): the armed plan takes the new hyper-parameters while no early step has run
  // (a schedule that changes them between steps keeps its early work); once one has, step()
  // finds the plan's differ and redoes the early work, as for any change it did not assume.
  void retarget_early(std::vector<AdamGroup> groups);
  // Restores every unit stepped early and forgets early work; with `rearm`, arms again.
  // Callers hold step_mu.
  absl::Status roll_back_early(bool rearm);
  // Arms again when it goes out of scope (after the caller's locks are released).
  struct Rearm {
    Impl& impl;
    ~Rearm() { impl.arm(); }
  };
  // step(): the units whose early work holds (kStepped, when `valid`) are returned and left
  // alone; the others are restored. Leaves nothing armed.
  struct EarlyOutcome {
    std::vector<uint32_t> kept;  // units, in upload order (forward order)
    uint64_t kept_elements = 0;
    uint64_t redone_elements = 0;
    bool rolled_back = false;
    uint64_t rollback_ns = 0;
    uint64_t early_ns = 0;
  };
  absl::StatusOr<EarlyOutcome> settle_early(bool valid);
  // Issues the H2D copies of the kept units' updated parameters, and with states on NVMe
  // returns their chunks for commit.
  absl::Status upload_kept(const EarlyOutcome& kept, std::vector<uint64_t>& written);

  // nvme_states.cc
  // Elements of each state array in chunk `chunk`'s slots, and the bytes of one slot.
  uint64_t chunk_stride(uint64_t chunk) const;
  uint64_t chunk_state_bytes(uint64_t chunk) const { return 12 * chunk_stride(chunk); }
  // Swap bytes of both slots of every chunk.
  uint64_t nvme_state_bytes() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_mu);
  // Extends the NVMe layout by `count` elements whose master starts as `master`.
  absl::Status nvme_append(const std::string& name, uint64_t flat_offset, uint64_t count,
                           const float* master);
  // The pieces of chunk `chunk` that belong to `params` (all of them when `only` is empty).
  std::vector<Piece> chunk_pieces(uint64_t chunk, const std::vector<Param>& params,
                                  const std::vector<bool>* only) const;
  absl::Status read_chunk(uint64_t chunk, uint32_t slot, void* dst, Completion& done);
  absl::Status write_chunk(uint64_t chunk, uint32_t slot, const void* src, Completion& done);
  absl::Status write_extent(ExtentHandle extent, const void* src, uint64_t bytes, Completion& done);
  uint32_t current_slot(uint64_t chunk) const;
  void commit_slots(const std::vector<uint64_t>& written);

  // Adam over one piece (states already offset to it); writes the parameter copy to `copy`.
  // `backup`: empty, or three arrays the states are copied into before they are stepped.
  absl::Status adam_piece(const Param& p, const AdamGroup& group, uint64_t step, float grad_scale,
                          const Piece& piece, const std::byte* grad, float* master, float* exp_avg,
                          float* exp_avg_sq, void* copy, std::span<float* const> backup = {}) const;
  // The gradient scale of a step without clipping: what early steps use.
  float unclipped_grad_scale(float scale) const;

  // Sets a parameter's tensor to its rounded master, through its CPU copy.
  absl::Status write_param_tensor(const Param& p, uint64_t offset, const float* master,
                                  uint64_t count);
  // Reads a parameter's state (any of the three arrays may be null).
  absl::Status read_param_state(const Param& p, float* master, float* exp_avg, float* exp_avg_sq);

  // optimizer_step.cc
  absl::StatusOr<StepResult> step();

  // The threads every Adam, statistics and accumulation kernel of this optimizer runs on.
  std::unique_ptr<CpuPool> adam_pool;
};

}  // namespace strata
