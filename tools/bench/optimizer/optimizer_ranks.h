// offload-bench --workload=optimizer over ranks: the ZeRO-DP partitioned optimizer step
// (ZeroEngine::step(), stage 1 or 2) against the single-rank step scaled by 1/N, measured in the
// same run under strata-run -n N (or alone with --zero-stage).
//
// Every rank builds the optimizer workload's model (--params parameters split into the same
// tensors, --dtype parameters and gradients, AdamW with the same hyper-parameters) in a
// ZeroEngine over the job's Communicator, with states in the CPU tier (and, when
// STRATA_NVME_PATHS is set, again on NVMe). Per sample: the ranks meet at a barrier, the gradient
// phase announces every parameter's gradient (acquire_grad(), a fixed pseudo-random gradient
// copied in, grad_ready(): stage 2 reduce-scatters each group as it fills), then step() is timed
// alone. One warm-up sample, then --repeat timed ones; each sample counts with its slowest rank
// (an all-gather of every rank's samples afterwards). Then rank 0 alone runs the single-rank
// OffloadOptimizer step over the whole model, as the optimizer workload does, while the other
// ranks wait at a barrier: ideal = that step / N.
#pragma once

#include <array>
#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "bench/optimizer/optimizer_workload.h"
#include "cli.h"

namespace strata::bench {

struct ZeroBenchOptions {
  OptimizerOptions optimizer;  // --params, --dtype, --repeat
  uint32_t stage = 2;          // --zero-stage (default 2 under strata-run)
  std::string json;            // "-": stdout; "": none
};

// --zero-stage: 1 or 2. The error (a usage error) names the flag.
std::optional<std::string> parse_zero_stage(uint64_t value, uint32_t* out);

// One rank's record of one sample. Times in seconds; bytes as the Communicator counts them
// (nccl-tests' sizes) from the barrier before the gradient phase to the end of step().
struct ZeroSample {
  double step = 0;          // wall time of step()
  double engine_step = 0;   // ZeroStats::last_step_ns
  double optimizer = 0;     // ZeroStats::last_optimizer_ns (the statistics all-reduce included)
  double adam = 0;          // of which the Adam kernels (OffloadOptimizerStats::last_adam_ns)
  double stats_reduce = 0;  // of which the statistics all-reduce, issue to wait (AllReduceTimer)
  double wait = 0;          // ZeroStats::last_step_wait_ns: reduce-scatters still running
  double gather = 0;        // ZeroStats::last_gather_ns: the parameter all-gathers
  double grad_phase = 0;    // wall time of the gradient phase (not part of the step)
  double engine_comm_bytes = 0;        // ZeroStats::last_step_comm_bytes
  std::array<double, 3> comm_bytes{};  // reduce-scatter, all-gather, all-reduce
  // The step's communication: waiting for reduce-scatters, the all-gathers, the statistics
  // all-reduce.
  double exposed() const { return wait + gather + stats_reduce; }
  // The step's time outside the optimizer (engine_step − optimizer): the reduce-scatter wait and
  // the gathers, and the engine's other work (stage 1 zeroes its full gradients there).
  double outside_optimizer() const { return engine_step > optimizer ? engine_step - optimizer : 0; }
};

struct ZeroRankSummary {
  int rank = 0;
  ZeroSample median;  // this rank's sample with the median step time (the lower middle one)
  std::vector<double> all_step_seconds;
  uint64_t model_state_bytes = 0;     // ZeroMemory::model_states()
  std::array<uint64_t, 3> by_tier{};  // params + grads + optimizer states, by TierKind
  uint64_t bucket_bytes = 0;          // stage 2's buckets, every tier
};

// The partitioned step with states in one tier, and its single-rank baseline.
struct ZeroRun {
  std::string state_home;    // "cpu" or "nvme"
  OptimizerStepRun single;   // rank 0 alone, the whole model
  double ideal_seconds = 0;  // single.step_seconds / ranks
  // Per sample, the slowest rank's step; its median (the lower middle one) and that sample.
  std::vector<double> all_step_seconds;
  double step_seconds = 0;
  int median_rank = 0;  // the slowest rank of the median sample
  ZeroSample median;
  std::vector<ZeroRankSummary> ranks;
  double ratio() const { return step_seconds > 0 ? ideal_seconds / step_seconds : 0; }
};

struct ZeroReport {
  ZeroBenchOptions options;
  int ranks = 1;
  std::string comm;  // Communicator::description() of rank 0
  std::string comm_backend;
  ResolvedConfig config;  // the single-rank CPU-state run's
  std::string device;
  std::string isa;
  uint32_t threads = 0;
  uint64_t tensors = 0;
  // The engine's layout.
  uint64_t bucket_bytes = 0;
  uint32_t gradient_buckets = 0;
  uint32_t alignment = 0;
  uint64_t groups = 0;
  uint64_t padded_params = 0;
  uint64_t shard_params = 0;
  ZeroRun cpu;
  std::optional<ZeroRun> nvme;
  std::vector<std::string> nvme_paths;
  std::string nvme_engine;
  std::vector<std::string> notes;
};

// True when --workload=optimizer runs the ranked workload: more than one rank in the job (the
// launch variables; also when they do not parse, so that the error is reported) or
// --zero-stage given.
bool zero_workload_wanted(bool zero_stage_given);

// Joins the job, runs the workload and, on rank 0, prints the results (stdout; stderr with
// --json=-) and writes the JSON document. Returns the exit code: 0, 1 on a failure, 2 (through
// `flags`) for a usage error, a --params this machine cannot hold on every rank included.
int run_optimizer_ranks_workload(const ZeroBenchOptions& options, const cli::FlagSet& flags);

void print_zero(const ZeroReport& report, std::ostream& out);
// The value of the "optimizer" key of offload-bench's JSON document for this workload.
nlohmann::ordered_json zero_json(const ZeroReport& report);

}  // namespace strata::bench
