// The ranked optimizer workload's output: the human lines and the "optimizer" JSON object.
#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>
#include <absl/strings/str_join.h>

#include "bench/json.h"
#include "bench/optimizer_workload.h"
#include "bench/zero_workload.h"
#include "strata/base/size.h"

namespace strata::bench {
namespace {

uint64_t whole(double v) { return static_cast<uint64_t>(v + 0.5); }

uint64_t comm_total(const ZeroSample& s) {
  return whole(s.comm_bytes[0]) + whole(s.comm_bytes[1]) + whole(s.comm_bytes[2]);
}

// The time fields of one sample, shared by the run and its ranks.
std::string sample_fields(const ZeroSample& s) {
  return absl::StrFormat(
      R"("exposed_comm_seconds": %s, "reduce_scatter_wait_seconds": %s, "gather_seconds": %s, )"
      R"("stats_all_reduce_seconds": %s, "optimizer_seconds": %s, "adam_seconds": %s, )"
      R"("outside_optimizer_seconds": %s, "engine_step_seconds": %s, "grad_phase_seconds": %s)",
      seconds_json(s.exposed()), seconds_json(s.wait), seconds_json(s.gather),
      seconds_json(s.stats_reduce), seconds_json(s.optimizer), seconds_json(s.adam),
      seconds_json(s.outside_optimizer()), seconds_json(s.engine_step), seconds_json(s.grad_phase));
}

std::string rank_json(const ZeroRankSummary& r) {
  return absl::StrFormat(
      R"({"rank": %d, "step_seconds": %s, "all_step_seconds": %s, %s, "comm_bytes_per_step": %d, )"
      R"("model_state_bytes": %d, "model_state_bytes_by_tier": {"gpu": %d, "cpu": %d, )"
      R"("nvme": %d}, "bucket_bytes": %d})",
      r.rank, seconds_json(r.median.step), seconds_list_json(r.all_step_seconds),
      sample_fields(r.median), comm_total(r.median), r.model_state_bytes, r.by_tier[0],
      r.by_tier[1], r.by_tier[2], r.bucket_bytes);
}

std::string run_json(const ZeroReport& report, const ZeroRun& run) {
  std::vector<std::string> ranks;
  for (const ZeroRankSummary& r : run.ranks) ranks.push_back(rank_json(r));
  const ZeroSample& m = run.median;
  return absl::StrFormat(
      R"({"ranks": %d, "stage": %d, "backend": "%s", "state_home": "%s", "bucket_bytes": %d, )"
      R"("gradient_buckets": %d, "alignment": %d, "groups": %d, "padded_params": %d, )"
      R"("shard_params": %d, "single_step_seconds": %s, "ideal_seconds": %s, )"
      R"("step_seconds": %s, "ratio": %s, "all_step_seconds": %s, "slowest_rank": %d, %s, )"
      R"("comm_bytes_per_step": %d, "engine_comm_bytes_per_step": %d, )"
      R"("comm_bytes": {"reduce_scatter": %d, "all_gather": %d, "all_reduce": %d}, )"
      R"("per_rank": [%s]})",
      report.ranks, report.options.stage, report.comm_backend, run.state_home, report.bucket_bytes,
      report.gradient_buckets, report.alignment, report.groups, report.padded_params,
      report.shard_params, seconds_json(run.single.step_seconds), seconds_json(run.ideal_seconds),
      seconds_json(run.step_seconds), ratio_json(run.ratio()),
      seconds_list_json(run.all_step_seconds), run.median_rank, sample_fields(m), comm_total(m),
      whole(m.engine_comm_bytes), whole(m.comm_bytes[0]), whole(m.comm_bytes[1]),
      whole(m.comm_bytes[2]), absl::StrJoin(ranks, ", "));
}

void print_run(const ZeroReport& report, const ZeroRun& run, std::ostream& out) {
  const ZeroSample& m = run.median;
  const int n = report.ranks;
  out << absl::StrFormat("states %s:\n", run.state_home == "cpu" ? "in the CPU tier" : "on NVMe");
  out << absl::StrFormat(
      "single %10.5f s   one rank, the whole model (OffloadOptimizer::step() on rank 0 alone, "
      "Adam kernels %.4f s)\n",
      run.single.step_seconds, static_cast<double>(run.single.stats.last_adam_ns) * 1e-9);
  out << absl::StrFormat("ideal  %10.5f s   = single / %d\n", run.ideal_seconds, n);
  out << absl::StrFormat(
      "zero   %10.5f s   ratio %.3f (ideal / zero)   slowest rank %d: optimizer %.4f s (Adam "
      "kernels %.4f s), exposed comm %.4f s (reduce-scatter wait %.4f s, all-gather %.4f s, "
      "statistics all-reduce %.4f s), outside the optimizer %.4f s; comm %s per step\n",
      run.step_seconds, run.ratio(), run.median_rank, m.optimizer, m.adam, m.exposed(), m.wait,
      m.gather, m.stats_reduce, m.outside_optimizer(), format_bytes(comm_total(m)));
  for (const ZeroRankSummary& r : run.ranks) {
    out << absl::StrFormat(
        "rank %-2d%10.5f s   optimizer %.4f s, exposed comm %.4f s, gradient phase %.4f s;   "
        "model states %s (gpu %s, cpu %s, nvme %s)\n",
        r.rank, r.median.step, r.median.optimizer, r.median.exposed(), r.median.grad_phase,
        format_bytes(r.model_state_bytes), format_bytes(r.by_tier[0]), format_bytes(r.by_tier[1]),
        format_bytes(r.by_tier[2]));
  }
}

}  // namespace

void print_zero(const ZeroReport& r, std::ostream& out) {
  const OptimizerOptions& o = r.options.optimizer;
  out << absl::StrFormat(
      "\noptimizer, ZeRO-DP stage %d over %d ranks (%s): %d params in %d tensors, %s gradients "
      "and parameters, AdamW (%s kernels, %d threads per rank); %d flat groups of at most %s, "
      "%d params padded, %d per rank; median of %d step(s) after 1 warm-up, each step the "
      "slowest rank's\n",
      r.options.stage, r.ranks, r.comm_backend, o.params, r.tensors, o.dtype, r.isa, r.threads,
      r.groups, format_bytes(r.bucket_bytes), r.padded_params, r.shard_params, o.repeat);
  print_run(r, r.cpu, out);
  if (r.nvme.has_value()) print_run(r, *r.nvme, out);
  out << "\n";
  for (const std::string& note : r.notes) out << note << "\n";
  out << "zero = host time of ZeroEngine::step() after the gradient phase (not timed; stage 2's "
         "reduce-scatters overlap it); ratio = (single / ranks) / zero, 1.0 is perfect scaling; "
         "exposed comm = the step's reduce-scatter wait + all-gathers + statistics all-reduce "
         "(which the engine counts inside the optimizer); outside the optimizer = the engine's "
         "step time minus its optimizer time.\n";
}

std::string zero_json(const ZeroReport& r) {
  const OptimizerOptions& o = r.options.optimizer;
  std::string nvme;
  if (r.nvme.has_value()) {
    nvme = absl::StrFormat(
        R"(, "nvme": {"paths": %s, "engine": "%s", "step_seconds": %s, "all_step_seconds": %s, )"
        R"("stats": %s, "zero": %s})",
        json_strings(r.nvme_paths), r.nvme_engine, seconds_json(r.nvme->single.step_seconds),
        optimizer_all_seconds_json(r.nvme->single), optimizer_stats_json(r.nvme->single),
        run_json(r, *r.nvme));
  }
  return absl::StrFormat(
      R"({"params": %d, "dtype": "%s", "bytes_per_param": %d, "tensors": %d, "repeat": %d, )"
      R"("isa": "%s", "threads": %d, "step_seconds": %s, "all_step_seconds": %s, "stats": %s, )"
      R"("zero": %s%s})",
      o.params, o.dtype, bytes_per_param(o.dtype), r.tensors, o.repeat, r.isa, r.threads,
      seconds_json(r.cpu.single.step_seconds), optimizer_all_seconds_json(r.cpu.single),
      optimizer_stats_json(r.cpu.single), run_json(r, r.cpu), nvme);
}

}  // namespace strata::bench
