// offload-bench --workload=zero: a ZeRO-DP stage 3 training step (ZeroEngine, parameters
// partitioned and gathered by the recorded order) over a synthetic model, against its overlap
// bound measured in the same run, under strata-run -n N (or alone: one rank).
//
// The model: --layers layers of --layer-bytes fp16 parameters each, one parameter per layer and
// one flat group per layer (bucket_bytes = the layer's bytes; nothing persistent), shards homed
// in --param-home (gpu, cpu or nvme), optimizer states in the CPU tier. Each step, on every rank:
//   forward:  for each layer: acquire_param, the stream waited for, compute, release_param
//   backward: for each layer in reverse: acquire_param, the stream waited for, compute,
//             acquire_grad, the gradient copied in (waited for), grad_ready, release_param
//   step(), then the stream waited for
// where compute is --layer-compute of real work on the host (bench/zero/zero_baselines.h: a
// calibrated y = a·x + y over fp32 buffers, not a sleep). acquire_param() returns with the
// layer's gather ordered on the trainer's stream, not done; the host computes only once the
// stream has reached that point, as a host trainer reads parameters (that wait is gather_wait).
// One warm-up step (it records the order), then --steps timed ones, back to back: a step runs
// from the end of the previous step to the end of its own step() and of its work on the
// stream, so nothing the engine does between steps goes untimed. Before the warm-up step and
// after it, untimed, the CPU tier's io_uring registration queued so far is waited for
// (Runtime::wait_for_registration); CPU-tier pieces first used by the timed steps are noted.
//
// The baselines, on every rank at once: the compute's calibration and, with --param-home=nvme,
// an io_uring read of this rank's whole shard of the model (bench/raw_io.h), before the engine
// exists; all_gather and reduce_scatter of one layer through the Communicator called directly
// (the engine's buffers, tier and sizes), with the engine created and idle, before the warm-up
// step and after the last one. The overlap bound of a step is
//   max(compute, gathers × all_gather + layers × reduce_scatter, shard read) + optimizer
// (the optimizer: ZeroStats::last_optimizer_ns, the Adam step after backward, which no schedule
// overlaps with this loop's compute); the exposed communication is the engine's
// fetch_wait_ns + the gather waits + last_step_wait_ns of the step, also reported with the
// host time acquire_grad waited for gradient buckets (docs/bench.md).
#pragma once

#include <absl/time/time.h>

#include <array>
#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "bench/zero/zero_baselines.h"
#include "cli.h"
#include "strata/config/config.h"

namespace strata::bench {

struct Zero3Options {
  uint64_t layers = 8;
  uint64_t layer_bytes = uint64_t{1} << 20;               // fp16 parameters per layer
  absl::Duration layer_compute = absl::Milliseconds(10);  // per layer, forward and backward each
  std::string param_home = "cpu";                         // "gpu", "cpu" or "nvme"
  std::optional<uint64_t> prefetch_bytes;                 // nullopt: 2 layers' gathered bytes
  std::optional<uint64_t> max_live_bytes;                 // nullopt: 4 layers' gathered bytes
  std::optional<uint64_t> reuse_window_bytes;             // nullopt: ZeroOptions' default
  uint64_t steps = 5;                                     // timed, after one warm-up step
  std::string json;                                       // "-": stdout; "": none
  // --overlap-step=on: ZeroOptions.optimizer.overlap (the overlapped optimizer step: each
  // rank's Adam on its reduced slices starts as they land, docs/optimizer.md). One run is one
  // configuration: compare a run with on and one with off.
  bool overlap = false;
};

// The flags only --workload=zero takes, as given (--layers, --layer-bytes, --steps, --zero-stage
// and --json are shared with other workloads).
struct Zero3FlagText {
  std::string param_home = "cpu";
  std::string prefetch_bytes = "auto";
  std::string max_live_bytes = "auto";
  std::string reuse_window_bytes = "auto";
  std::string layer_compute = "10ms";
};

// Adds --param-home, --prefetch-bytes, --max-live-bytes, --reuse-window-bytes and
// --layer-compute; returns them.
std::vector<cli::Flag*> add_zero3_flags(cli::FlagSet& flags, Zero3FlagText* text);

// Parses the flags' text into `out`; a usage error names the flag.
std::optional<std::string> parse_zero3_flags(const Zero3FlagText& text, Zero3Options* out);

// A usage error in `options` (the message names the flag), or nullopt. The checks that need the
// rank count (a layer's gathered bytes against --max-live-bytes) come when the job is joined.
std::optional<std::string> validate(const Zero3Options& options);

// --zero-stage with --workload=zero: only 3.
std::optional<std::string> parse_zero3_stage(uint64_t value);

// One rank's record of one timed step. Times in seconds, counts and bytes per step (deltas from
// the end of the previous step() to the end of this one).
struct Zero3Sample {
  double step = 0;       // wall time
  double forward = 0;    // of which the forward loop
  double backward = 0;   // the backward loop
  double step_call = 0;  // step()
  double compute = 0;    // the compute kernels (forward and backward)
  double optimizer = 0;  // ZeroStats::last_optimizer_ns (the Adam step, statistics all-reduce)
  // ZeroStats::fetch_wait_ns: host time acquire_param spent fetching (issuing gathers, making
  // room, a shard's NVMe read); the gathers themselves are waited for on the stream:
  double fetch_wait = 0;
  double gather_wait = 0;  // the stream synchronized before each layer's compute: the gathers
  double reduce_scatter_wait = 0;  // ZeroStats::last_step_wait_ns
  // Host time inside the engine's calls (waits included), measured by the bench.
  double acquire_param = 0;
  double release_param = 0;
  double acquire_grad = 0;  // a gradient bucket still being reduce-scattered is waited for here
  double grad_ready = 0;
  double grad_copy = 0;  // writing the gradients (copies on the stream, waited for)
  // ZeroStats counters.
  double gathers = 0;  // on demand + prefetched
  double gathers_on_demand = 0;
  double gathers_prefetched = 0;
  double reuses = 0;
  double prefetch_late = 0;
  double dropped_unused = 0;
  double order_changes = 0;
  double gathered_peak_bytes = 0;  // since the engine was created (not a delta)
  // Bytes the Communicator counted (nccl-tests' sizes) and the store read from NVMe.
  double all_gather_bytes = 0;
  double reduce_scatter_bytes = 0;
  double nvme_read_bytes = 0;
  // The rank's optimizer (ZeroEngine::optimizer(), OffloadOptimizerStats): its step() time
  // (last_step_ns; with overlap the optimizer time exposed after the last gradient), the
  // elements it stepped early and kept, whether it rolled early work back, and its wait for the
  // early stepper's unit in progress.
  double optimizer_step = 0;
  double early_elements = 0;
  double rolled_back = 0;  // 0 or 1
  double early_wait = 0;

  double exposed() const { return fetch_wait + gather_wait + reduce_scatter_wait; }
  double exposed_fraction() const { return step > 0 ? exposed() / step : 0; }
  // With the time acquire_grad spent (waiting for a gradient bucket to come back from its
  // reduce-scatter: communication, ZeroStats::bucket_wait_ns, not in exposed()).
  double exposed_with_grad_waits() const { return exposed() + acquire_grad; }
  double exposed_with_grad_waits_fraction() const {
    return step > 0 ? exposed_with_grad_waits() / step : 0;
  }
  // The step's host time outside compute and the optimizer: the engine's calls (their waits for
  // communication included), the gradient copies and the step()'s own other work. An upper
  // bound of the exposed communication that does not rely on the engine's counters.
  double outside_compute() const {
    const double rest = step - compute - optimizer;
    return rest > 0 ? rest : 0;
  }
};

// What a step could at best take with these baselines (seconds per step).
struct Zero3Bound {
  double compute = 0;         // the sample's compute
  double gather = 0;          // its gathers × the raw all_gather of a layer
  double reduce_scatter = 0;  // layers × the raw reduce_scatter of a layer
  double comm = 0;            // gather + reduce_scatter (one communicator: they take turns)
  double shard_read = 0;      // the raw read of this rank's shard (--param-home=nvme)
  double optimizer = 0;       // the sample's optimizer
  double seconds = 0;         // max(compute, comm, shard_read) + optimizer
};

struct Zero3RankSummary {
  int rank = 0;
  Zero3Sample median;  // this rank's step with the median time (the lower middle one)
  std::vector<double> all_step_seconds;
  std::array<uint64_t, 3> model_states_by_tier{};  // ZeroMemory params + grads + states
  // NVMe bytes read per timed step, on average: the reads the engine's prefetch hints start in
  // the background land in one step's window or the next, so one step's count varies.
  double mean_nvme_read_bytes = 0;
  double rollback_rate = 0;  // steps whose early work was rolled back / steps
  uint64_t model_state_bytes = 0;
};

struct Zero3Report {
  Zero3Options options;
  int ranks = 1;
  std::string comm;  // Communicator::description() of rank 0
  std::string comm_backend;
  ResolvedConfig config;
  std::string device;
  // The engine's options and layout (per layer: one flat group).
  uint64_t layer_params = 0;
  uint64_t padded_params = 0;  // per layer
  uint64_t shard_params = 0;   // per layer and rank
  uint64_t gathered_layer_bytes = 0;
  uint64_t prefetch_bytes = 0;
  uint64_t max_live_bytes = 0;
  uint64_t reuse_window_bytes = 0;
  uint64_t shard_bytes = 0;  // this rank's shard of the whole model
  // The baselines (each sample the slowest rank's; the median).
  ComputeCalibration compute;
  RawCollectiveTimes raw_comm;
  std::optional<RawReadTimes> raw_read;  // --param-home=nvme, when io_uring is available
  std::string nvme_dirs;                 // --param-home=nvme: NvmeDirs::describe()
  // The steps: per step the slowest rank's time; the median (lower middle) step, its rank and
  // that rank's sample.
  std::vector<double> all_step_seconds;
  double step_seconds = 0;
  int slowest_rank = 0;
  Zero3Sample median;
  std::vector<Zero3RankSummary> per_rank;
  std::vector<std::string> notes;
};

Zero3Bound bound_of(const Zero3Report& report, const Zero3Sample& sample);
// The goal of issue 16: exposed communication at most 10% of the step when the compute covers
// the communication (compute >= comm and >= the shard read). `applies` false: it does not.
struct Zero3Goal {
  bool applies = false;
  bool met = false;
};
Zero3Goal goal_of(const Zero3Report& report, const Zero3Sample& sample);
inline constexpr double kExposedGoal = 0.10;

// Joins the job, runs the workload and, on rank 0, prints the results (stdout; stderr with
// --json=-) and writes the JSON document. Returns the exit code: 0, 1 on a failure, 2 (through
// `flags`) for a usage error.
int run_zero_workload(const Zero3Options& options, const cli::FlagSet& flags);

void print_zero3(const Zero3Report& report, std::ostream& out);
// The value of the "zero" key of offload-bench's JSON document for this workload.
nlohmann::ordered_json zero3_json(const Zero3Report& report);

}  // namespace strata::bench
