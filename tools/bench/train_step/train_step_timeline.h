// offload-bench --workload=train-step --timeline=FILE: where one step's time goes.
//
// With the flag every policy's store records its measured steps (TensorStore::set_timeline: each
// move's issue, I/O and completion, each wait, each acquire) and the bench adds the step, each
// layer on the host and each layer's compute on the compute stream. FILE gets the Chrome trace
// (chrome://tracing, Perfetto), one process per policy; the report gets, for each policy's median
// step, the compute stream's idle time (the step beyond its compute) attributed to what the host
// thread was doing meanwhile: which wait, for which move, in which phase of that move (being
// issued, its I/O, waiting for the completion worker to see it end). docs/train-step.md.
#pragma once

#include <absl/status/status.h>

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <utility>
#include <vector>

#include "strata/store/timeline.h"

namespace strata::bench {

struct StepTimelineSummary {
  double step_ms = 0;     // the step span's length
  double compute_ms = 0;  // the compute stream busy within it (the union of compute spans)
  double idle_ms = 0;     // step - compute
  // The idle time by cause, largest first; the causes add up to idle_ms (to the sampling grain).
  std::vector<std::pair<std::string, double>> idle_ms_by_cause;
  // The moves that ended within the step, by direction and purpose ("nvme->gpu prefetch").
  struct Moves {
    std::string kind;
    uint64_t count = 0;
    double mean_ms = 0;   // issue start to completion seen
    double issue_ms = 0;  // of which the issue (staging leases, submitting)
    double io_ms = 0;     // issue end to I/O end (host I/O moves only)
    double lag_ms = 0;    // I/O end to completion seen
    // Other moves in flight beside it on average over its life: reads (nvme->*) and writes
    // (*->nvme): the queue it shared the drives with.
    double reads_beside = 0;
    double writes_beside = 0;
  };
  std::vector<Moves> moves;
  // The NVMe drives within the step: the time some chunk's read or write was in flight (the
  // union of the chunk spans), and the bytes of the chunks that ended in it. Busy for most of the
  // step at a low rate: the step is bound by the drives, reads and write-backs together.
  double nvme_busy_ms = 0;
  uint64_t nvme_read_bytes = 0;
  uint64_t nvme_write_bytes = 0;
  double h2d_busy_ms = 0;      // the H2D link carrying copies (the union of its copy spans)
  uint64_t waits = 0;          // wait spans on the host track within the step
  double staging_wait_ms = 0;  // staging waits on any thread within the step
};

// The summary of [start_ns, end_ns] of `spans` (one timeline). `host_track`: the trainer's.
StepTimelineSummary summarize_step(const std::vector<Timeline::Span>& spans, int64_t start_ns,
                                   int64_t end_ns, const std::string& host_track = "host");

// Writes `text` to `path` (--timeline=FILE); an error names the file and the cause.
absl::Status write_timeline_file(const std::string& path, const std::string& text);

std::string step_timeline_text(const std::string& policy, const StepTimelineSummary& s);
nlohmann::ordered_json step_timeline_json(const StepTimelineSummary& s);

}  // namespace strata::bench
