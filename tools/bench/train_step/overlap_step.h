// offload-bench --workload=train-step --overlap-step=off|on|both|none: the optimizer time
// exposed after backward, with and without the overlapped step (docs/optimizer.md), through a
// real OffloadOptimizer driven by a synthetic backward.
//
// The model is the train-step workload's: --layers layers of a --layer-bytes fp16 weight (one
// parameter each) and its fp16 gradient, both in the GPU tier; the optimizer's states in
// --home (the CPU tier, or NVMe through the swap space). A step is one period of a training
// loop, per configuration:
//   forward:  for each layer from the first: its weight acquired on the GPU for reading (the
//             compute stream then waits for that weight's upload by the previous step's
//             step(), and for nothing else), its simulated compute (--compute-ms, a timed wait
//             on the compute stream, bench/train_step/simulated_compute.h: no core burnt) enqueued,
//             the weight released; with --sync-each-layer the host waits for the layer's compute.
//             Its end is when the stream reaches it (a host callback takes the time).
//   backward: for each layer from the last: its compute enqueued, then grad_ready(layer,
//             stream), so the gradient's D2H starts when the compute ends; with
//             --sync-each-layer (the default) the host waits for each layer's compute before
//             the next; without it the host runs ahead, as a trainer's backward hooks do on a
//             GPU. The host then waits for the stream: the last gradient is computed.
//   step():   its wall time is OffloadOptimizerStats::last_step_ns, the optimizer time exposed
//             after the last gradient. Nothing waits for the uploads it leaves in flight: the
//             next step's forward waits for each weight when it needs it.
// The step's time runs from the forward's start to step()'s return; the forward's wait is its
// time less its compute (layers × compute): how long its layers waited for their uploads. After
// the last measured step the uploads are waited for, untimed.
// Configurations, each in a fresh Runtime, one after another, one warm-up step then --steps
// measured ones:
//   off      overlap disabled: the plain step, the baseline of every ratio;
//   on       overlap enabled;
//   on-clip  overlap enabled, max_grad_norm below the gradients' norm: every step clips, so
//            every step's early work is rolled back and stepped again (rollback rate 1);
//   on-inf   overlap enabled, an inf written into the first layer's gradient (the last to
//            land) by the backward of every --overlap-inf-every-th measured step: that step is
//            skipped and its early work rolled back.
// The bound of a step: max(compute, transfer, optimizer), where compute is layers × compute × 2
// (forward and backward), transfer the busier direction of the link (the gradients down, the
// parameters up: the same bytes) at --link-gbps, and optimizer the plain step's time once the
// last gradient has landed (off's last_step_ns - last_step_wait_ns: Adam, its uploads, with
// states on NVMe their I/O).
#pragma once

#include <absl/status/statusor.h>

#include <algorithm>
#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "bench/train_step/train_step.h"
#include "strata/config/config.h"
#include "strata/optimizer/offload_optimizer.h"

namespace strata::bench {

struct OverlapStepOptions {
  std::string mode = "both";  // "off", "on", "both" or "none"
  uint64_t inf_every = 2;     // on-inf: an inf in every this-many-th measured step
};

// A usage error (the message names the flag), or nullopt.
std::optional<std::string> validate(const OverlapStepOptions& options);

// The configurations --overlap-step runs, in order: off; on, on-clip, on-inf; or all four.
std::vector<std::string> overlap_configurations(const std::string& mode);

// One measured step of one configuration.
struct OverlapStepSample {
  double exposed_seconds = 0;           // last_step_ns: step()'s wall time after the last gradient
  double forward_seconds = 0;           // from the forward's start to the stream reaching its end
  double forward_wait_seconds = 0;      // forward_seconds less its compute (layers × compute)
  double first_layer_wait_seconds = 0;  // the same for the forward's first layer alone
  double backward_seconds = 0;          // from the forward's end to the stream's end
  double step_seconds = 0;              // forward + backward + step()
  bool rolled_back = false;
  bool skipped = false;
  double exposed_after_landing_seconds() const {
    return static_cast<double>(stats.last_step_ns -
                               std::min(stats.last_step_ns, stats.last_step_wait_ns)) *
           1e-9;
  }
  uint64_t early_elements = 0;   // StepResult::early_elements
  uint64_t redone_elements = 0;  // stepped early, rolled back, stepped again (last_redone_elements)
  OffloadOptimizerStats stats;   // right after step()
};

struct OverlapStepRun {
  std::string name;  // "off", "on", "on-clip", "on-inf"
  bool overlap = false;
  float max_grad_norm = 0;
  uint64_t inf_every = 0;                  // 0: no inf injected
  std::vector<OverlapStepSample> samples;  // every measured step, in order
  // Summaries over `samples`: medians (the lower middle one for an even count).
  OverlapStepSample median;  // the step with the median exposed time
  double step_seconds = 0;   // median end-to-end step
  // Median forward and its wait for the previous step's uploads (the issue's "the next step's
  // first layers do not wait for the last group").
  double forward_seconds = 0;
  double forward_wait_seconds = 0;
  double first_layer_wait_seconds = 0;
  double rolled_back_exposed_seconds = 0;  // median over rolled-back steps; 0: none
  double kept_exposed_seconds = 0;         // median over the others; 0: none
  uint64_t rollbacks = 0;
  // The warm-up step, which waits for every early step before step() (so, unlike the measured
  // steps, its early work does not depend on the stepper keeping up): what it kept, redid and
  // whether it rolled back.
  uint64_t warmup_early_elements = 0;
  uint64_t warmup_redone_elements = 0;
  bool warmup_rolled_back = false;
  double rollback_rate() const {
    return samples.empty() ? 0
                           : static_cast<double>(rollbacks) / static_cast<double>(samples.size());
  }
};

struct OverlapStepReport {
  TrainStepOptions train;
  OverlapStepOptions options;
  std::string state_home;  // "cpu" or "nvme"
  std::string device;
  uint64_t params = 0;  // elements in all
  uint64_t chunk_elements = 0;
  double compute_seconds = 0;    // layers × compute × 2 (forward and backward)
  double transfer_seconds = 0;   // layers × layer bytes at --link-gbps; 0 when not throttled
  double optimizer_seconds = 0;  // the plain step after landing (off), else the on run's Adam
  std::vector<OverlapStepRun> runs;
  std::vector<std::string> notes;

  double bound_seconds() const;
  const OverlapStepRun* find(const std::string& name) const;
  // The exposed time against the plain step's (off) in the same run; 0 without "off".
  double exposed_ratio(const OverlapStepRun& run) const;
  // The same after the last gradient has landed (last_step_ns - last_step_wait_ns): without
  // the last gradient's D2H and statistics, which are backward's transfer, not the optimizer.
  double exposed_after_landing_ratio(const OverlapStepRun& run) const;
  // A rolled-back step's exposed time against the plain step's; 0 without one.
  double rollback_cost(const OverlapStepRun& run) const;
  double ratio_to_bound(const OverlapStepRun& run) const;
};

// Runs the configurations of `options.mode` (not "none") with the train-step workload's model,
// device and NVMe directories. Progress lines go to `human`.
absl::StatusOr<OverlapStepReport> run_overlap_step(const TrainStepOptions& train,
                                                   const OverlapStepOptions& options,
                                                   const Config& base,
                                                   const std::vector<std::string>& nvme_paths,
                                                   std::ostream& human);

void print_overlap_step(const OverlapStepReport& report, std::ostream& out);
// The value of the "overlap_step" key of offload-bench's JSON document.
nlohmann::ordered_json overlap_step_json(const OverlapStepReport& report);

}  // namespace strata::bench
