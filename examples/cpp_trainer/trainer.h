// What cpp_trainer's two training paths share: the options, the result they report, and the
// parameters of the data split.
#pragma once

#include <absl/status/statusor.h>
#include <absl/strings/str_cat.h>

#include <array>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "json.h"
#include "model.h"
#include "strata/activations/activation_stash.h"
#include "strata/runtime/runtime.h"
#include "strata/zero/zero_engine.h"

namespace cpp_trainer {

using strata::Json;  // the report's documents (tools/json.h)

inline constexpr float kLr = 2e-3F;
inline constexpr float kWeightDecay = 1e-4F;

// `st` with `what` in front of its message: which step of the example failed.
inline absl::Status annotate(const absl::Status& st, const std::string& what) {
  return st.ok() ? st : absl::Status(st.code(), absl::StrCat(what, ": ", st.message()));
}

struct Args {
  int steps = 300;
  // --states: given, or (states_given false) NVMe when the runtime has an NVMe tier, else CPU.
  strata::TierKind states = strata::TierKind::kNvme;
  bool states_given = false;
  bool own_arena = false;  // STRATA_GPU_BYTES unset: the example sized the GPU arena
  float max_loss = 0.05F;
  double tolerance = 1e-3;
  uint32_t zero_stage = 0;           // 0: one rank, OffloadOptimizer; 1, 2, 3: ZeroEngine
  uint64_t bucket_bytes = 64 << 10;  // ZeroOptions::bucket_bytes
  uint32_t accumulation = 1;         // micro-steps per step
  std::string json;                  // "" none, "-" stdout, else a file (rank 0 writes)
  // Stage 3 (ZeroOptions of the same names), sized for this model's 535 KiB of parameters: the
  // biases stay whole, each weight is partitioned; one large layer is fetched ahead, and the
  // gathered bytes stay under the two large layers plus the small ones.
  strata::TierKind param_home = strata::TierKind::kCpu;  // where each rank's shards live
  uint64_t prefetch_bytes = 256 << 10;
  uint64_t max_live_bytes = 640 << 10;
  uint64_t persist_below_bytes = 2 << 10;
  uint64_t reuse_window_bytes = 256 << 10;
  // hpZ (ZeroOptions::hpz_node_ranks): --hpz takes LOCAL_WORLD_SIZE; without it,
  // STRATA_ZERO_HPZ=1 does (strata::hpz_node_ranks_from_environment); 0: off.
  uint32_t hpz_node_ranks = 0;
  std::string stage3_flag;  // the first stage-3 flag given ("" none): only --zero-stage=3 has them
  // Activation offload (--zero-stage=0): the layer outputs saved for backward go through an
  // ActivationStash (ActivationStashOptions of the same names).
  bool offload_activations = false;
  strata::TierKind activation_home = strata::TierKind::kCpu;
  uint64_t activation_window_bytes = 128 << 10;
  uint64_t activation_prefetch_bytes = UINT64_MAX;  // unset: half the window
  std::string activation_trace;  // "" none, else arena-replay's trace of the window
  // Each step's micro-batches get random sizes (seeded, the same in every run) instead of equal
  // ones: variable activation sizes, as variable sequence lengths give.
  bool variable_batches = false;
  // The overlapped optimizer step (OffloadOptimizerOptions::overlap): each parameter's Adam runs
  // as its gradient of the step's last micro-step lands, validated by step().
  bool overlap_step = false;
};

// Bytes of model states (parameters, gradients, optimizer states) this rank holds, by tier.
struct ModelStateBytes {
  std::array<uint64_t, 3> by_tier{};  // indexed by TierKind
  uint64_t total() const { return by_tier[0] + by_tier[1] + by_tier[2]; }
};

// What a training run hands back for the report. The losses are the global batch's (every
// rank's), the weights this rank's copy at the end, [W; b] per layer.
struct RunResult {
  int rank = 0;
  int ranks = 1;
  std::vector<float> losses;
  Weights weights;
  uint64_t moved_bytes = 0;                  // between tiers, this rank's store
  uint64_t nvme_read = 0, nvme_written = 0;  // by the optimizer, registration included
  // This rank's optimizer states (12 bytes an element: master and two moments), and what a
  // training step read and wrote of them on NVMe, averaged over the steps (registration, which
  // writes the initial states, left out).
  uint64_t state_bytes = 0;
  uint64_t nvme_read_per_step = 0, nvme_written_per_step = 0;
  ModelStateBytes model_states;
  uint64_t bucket_memory = 0;        // stage 2's gradient buckets (not model states)
  uint64_t comm_bytes_per_step = 0;  // the engine's last step, 0 at stage 0
  uint64_t groups = 0;               // flat groups (stage 1, 2)
  // Stage 1, 2: the largest element-wise difference between the ranks' final weights (0: the
  // all-gathers left every rank the same copy), and whether every rank moved bytes between tiers.
  double replica_difference = 0;
  bool every_rank_moved = true;
  // Stage 3: the engine's fetch statistics at the end of training (before the final weights
  // are read), and the time compute waited for communication, summed over the run: the host's
  // wait on the stream after acquire_param (where the gathers are waited for), the fetching in
  // acquire_param (ZeroStats::fetch_wait_ns), acquire_grad waiting for a bucket
  // (bucket_wait_ns) and each step's wait for its reduce-scatters (last_step_wait_ns).
  strata::ZeroStats zero_stats;
  uint64_t exposed_comm_ns = 0;
  uint64_t partitioned_groups = 0;  // of `groups`, the ones whose parameters are sharded
  // The GPU tier's high-water mark over the run, and with --offload-activations the stash's
  // counters at the end.
  uint64_t gpu_tier_peak_bytes = 0;
  uint64_t gpu_arena_bytes = 0;
  std::string backend;  // "host" or "cuda"
  strata::ActivationStashStats activations;
  // Per step, from this rank's OffloadOptimizerStats after it: the optimizer time exposed after
  // the last gradient (last_step_ns: with --overlap-step what step() adds after backward,
  // without it the whole step), the elements whose Adam ran early and was kept
  // (last_early_elements), and whether early work was rolled back (overlap_rollbacks grew).
  std::vector<uint64_t> optimizer_ns, early_elements;
  std::vector<bool> rolled_back;
};

// How the header line names the arena: " (the example's own ...)" when the example sized it.
inline const char* arena_note(const Args& args) {
  return args.own_arena ? " (the example's own; STRATA_GPU_BYTES sets another)" : "";
}

// The samples [first, first + count) of the global batch that micro-step `micro` of rank `rank`
// takes: rank r takes [r·B/N, (r+1)·B/N), cut into `micro_steps` pieces the same way.
struct SampleRange {
  int first, count;
};
SampleRange samples(int rank, int ranks, uint32_t micro, uint32_t micro_steps);
// --variable-batches: the step's `micro_steps` micro-batches of one rank, random sizes (at least
// one sample each) that cover the batch, drawn from `step`.
std::vector<SampleRange> variable_samples(int step, uint32_t micro_steps);

// What a training run's steps moved between the optimizer and NVMe: `before` and `after` are
// the optimizer's statistics around the training loop.
void count_state_traffic(const strata::OffloadOptimizerStats& before,
                         const strata::OffloadOptimizerStats& after, int steps, RunResult& result);

// optimizer_report.cc. Appends the step just taken to `result`'s per-step optimizer figures
// (`rollbacks_before`: overlap_rollbacks before that step); the text a step's report line adds
// with --overlap-step; the summary line; the JSON document's "optimizer" object.
void record_optimizer_step(const strata::OffloadOptimizerStats& after, uint64_t rollbacks_before,
                           RunResult& result);
std::string overlap_note(const Args& args, const RunResult& r, size_t step);
void print_optimizer_summary(std::FILE* human, const Args& args, const RunResult& r);
Json optimizer_json(const RunResult& r);

// The report's numbers (--json): a double to 9 significant digits, floats each in the fewest
// digits that read back as the same float (0.05, not 0.0500000007).
inline Json json_double(double v) { return strata::json_significant(v, 9); }
Json json_floats(const std::vector<float>& values);

// flags.cc: parses the command line into `args` and checks the flags together; the exit code
// when the program should not run (0 after --help, 2 on a usage error, with the message
// written), nullopt when it should.
std::optional<int> parse_flags(int argc, char** argv, Args& args);

// Today's path: one rank, parameters and gradients as store tensors, OffloadOptimizer.
// `human`: where rank 0 writes its progress lines.
absl::StatusOr<RunResult> run_offload(strata::Runtime& rt, const Args& args, const Weights& init,
                                      const Weights& teacher, std::FILE* human);
// ZeRO-DP stage 1, 2 or 3 over the ranks of the job (strata-run, torchrun; alone: one rank).
absl::StatusOr<RunResult> run_zero(strata::Runtime& rt, const Args& args, const Weights& init,
                                   const Weights& teacher, std::FILE* human);
// Stage 3: the bytes of the largest parameter group gathered whole, in the layout the engine
// will plan at `ranks` (the least --max-live-bytes that works), with the parameter it starts
// with; 0 when nothing is partitioned. InvalidArgument where the engine will reject the layout
// (it then says why).
struct LargestGather {
  uint64_t bytes = 0;
  std::string first_param;
};
absl::StatusOr<LargestGather> largest_gather(const Args& args, int ranks);

}  // namespace cpp_trainer
