// offload-bench --workload=optimizer: the CPU optimizer step of ZeRO-Offload, timed through the
// public OffloadOptimizer API in a Runtime, against what the machine allows.
//
// For --params parameters with fp16, bf16 or fp32 gradients and parameter copies it reports, all
// measured in the same run (docs/bench.md):
//   - the memory-bandwidth floor: bytes per parameter (28 for fp16/bf16: grad read 2, master, m
//     and v read and written 24, copy written 2; 32 for fp32) x params / the bandwidth of a
//     STREAM-like triad over buffers of the optimizer state's size, on every core (oneTBB);
//   - OffloadOptimizer::step() with states in the pinned CPU tier (median of --repeat steps
//     after one warm-up step), and its ratio to the floor (floor / step: 1.0 is at the floor);
//   - a naive loop: a textbook scalar Adam, one thread, on a prefix of the parameters when there
//     are many (scaled to the full count);
//   - with an NVMe tier configured (STRATA_NVME_PATHS), the step with states on NVMe against
//     the NVMe bound: the state's bytes read and written at the rates of a raw io_uring pass
//     (bench/raw_io.h) over the same directories.
#pragma once

#include <absl/status/statusor.h>

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "cli.h"
#include "strata/config/config.h"
#include "strata/optimizer/offload_optimizer.h"

namespace strata::bench {

struct OptimizerOptions {
  uint64_t params = 32'000'000;  // --params=32M
  std::string dtype = "fp16";    // of the gradients and the parameter copies: fp16, bf16, fp32
  uint64_t repeat = 5;           // timed steps after one warm-up step
};

// --params: digits with an optional K, M or G suffix (10^3, 10^6, 10^9): "1000000", "1M",
// "100M", "1G". The error (a usage error) names the flag and the accepted form.
std::optional<std::string> parse_param_count(const std::string& text, uint64_t* out);

// A usage error in `options` (the message names the flag), or nullopt. Does not look at memory.
std::optional<std::string> validate(const OptimizerOptions& options);

// Bytes the optimizer moves per parameter and step: 28 (fp16/bf16) or 32 (fp32).
uint64_t bytes_per_param(const std::string& dtype);

// One configuration of the step (states in the CPU tier or on NVMe).
struct OptimizerStepRun {
  std::string state_home;   // "cpu" or "nvme"
  double step_seconds = 0;  // the median step (the lower middle one for an even --repeat)
  std::vector<double> all_step_seconds;
  OffloadOptimizerStats stats;   // right after the median step
  uint64_t nvme_bytes_read = 0;  // during the median step
  uint64_t nvme_bytes_written = 0;
};

struct OptimizerNvme {
  std::vector<std::string> paths;
  std::string engine;  // the swap space's I/O engine, and why
  std::string engine_reason;
  uint64_t state_bytes = 0;                // master, m, v: read once and written once per step
  double read_bytes_per_second = 0;        // raw io_uring read pass, median
  double write_bytes_per_second = 0;       // raw io_uring write pass, median
  std::vector<std::string> buffered_dirs;  // where the raw pass could not use O_DIRECT
  // state_bytes / read + state_bytes / write: a drive that reads and writes one at a time.
  double bound_seconds() const;
  // max(state_bytes / read, state_bytes / write): one that overlaps them fully (the step
  // reads chunk k+1 while it writes chunk k-1).
  double overlapped_bound_seconds() const;
  OptimizerStepRun run;
};

struct OptimizerReport {
  OptimizerOptions options;
  ResolvedConfig config;  // the CPU-state run's
  std::string device;
  std::string isa;  // adam_isa()
  uint32_t threads = 0;
  uint64_t tensors = 0;  // the parameters are split into this many tensors
  // The floor.
  uint64_t triad_bytes = 0;  // bytes one triad pass moves
  double triad_bytes_per_second = 0;
  double floor_seconds = 0;
  // The in-place reference (TriadBuffers::in_place): the same bytes per parameter at the
  // bandwidth of the step's own access shape.
  double in_place_bytes_per_second = 0;
  double in_place_floor_seconds = 0;
  OptimizerStepRun cpu;
  // The naive loop.
  uint64_t naive_measured_params = 0;
  double naive_measured_seconds = 0;  // median over the measured prefix
  double naive_seconds = 0;           // scaled to every parameter
  std::optional<OptimizerNvme> nvme;
  std::vector<std::string> notes;

  double ratio_to_floor() const {
    return cpu.step_seconds > 0 ? floor_seconds / cpu.step_seconds : 0;
  }
  double ratio_to_in_place_floor() const {
    return cpu.step_seconds > 0 ? in_place_floor_seconds / cpu.step_seconds : 0;
  }
};

// Runs the workload and prints or writes its output: the human lines to stdout (to stderr with
// --json=-), the JSON document to `json` ("-": stdout; "": none). Returns the exit code: 0, 1 on
// a failure, 2 (through `flags`) when the machine has too little memory for --params.
int run_optimizer_workload(const OptimizerOptions& options, const std::string& json,
                           const cli::FlagSet& flags);

void print_optimizer(const OptimizerReport& report, std::ostream& out);
// The value of the "optimizer" key of offload-bench's JSON document.
nlohmann::ordered_json optimizer_json(const OptimizerReport& report);

// Shared with the ranked workload (bench/optimizer/optimizer_ranks.h).
// Element counts of the tensors --params is split into (at most 16 Mi elements each, as equal as
// possible).
std::vector<uint64_t> optimizer_tensor_counts(uint64_t params);
// The single-rank step as this workload times it (a Runtime sized to --params from `base`, an
// OffloadOptimizer with states at `home`, one warm-up step, then --repeat timed ones), without
// the floor's passes beside the steps. Fills report.notes, and report.config and report.device
// for kCpu; `nvme_paths` is used for kNvme only.
absl::StatusOr<OptimizerStepRun> run_single_rank_steps(const OptimizerOptions& options,
                                                       const Config& base, TierKind home,
                                                       const std::vector<std::string>& nvme_paths,
                                                       OptimizerReport& report,
                                                       std::ostream& human);
// The fields both the optimizer and the ZeRO documents open with: params, dtype,
// bytes_per_param, tensors, repeat, isa, threads.
nlohmann::ordered_json optimizer_fields_json(const OptimizerOptions& options, uint64_t tensors,
                                             const std::string& isa, uint32_t threads);
// `run`'s "stats" object and its "all_step_seconds" array, as in optimizer_json().
nlohmann::ordered_json optimizer_stats_json(const OptimizerStepRun& run);
nlohmann::ordered_json optimizer_all_seconds_json(const OptimizerStepRun& run);

}  // namespace strata::bench
