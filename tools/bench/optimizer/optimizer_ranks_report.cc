// The ranked optimizer workload's output: the human lines and the "optimizer" JSON object.
#include <absl/strings/str_format.h>

#include "bench/optimizer/optimizer_ranks.h"
#include "bench/optimizer/optimizer_workload.h"
#include "json.h"
#include "strata/base/size.h"

namespace strata::bench {
namespace {

uint64_t whole(double v) { return static_cast<uint64_t>(v + 0.5); }

uint64_t comm_total(const ZeroSample& s) {
  return whole(s.comm_bytes[0]) + whole(s.comm_bytes[1]) + whole(s.comm_bytes[2]);
}

// The time fields of one sample, shared by the run and its ranks.
void add_sample_fields(const ZeroSample& s, Json& into) {
  into["exposed_comm_seconds"] = seconds_json(s.exposed());
  into["reduce_scatter_wait_seconds"] = seconds_json(s.wait);
  into["gather_seconds"] = seconds_json(s.gather);
  into["stats_all_reduce_seconds"] = seconds_json(s.stats_reduce);
  into["optimizer_seconds"] = seconds_json(s.optimizer);
  into["adam_seconds"] = seconds_json(s.adam);
  into["outside_optimizer_seconds"] = seconds_json(s.outside_optimizer());
  into["engine_step_seconds"] = seconds_json(s.engine_step);
  into["grad_phase_seconds"] = seconds_json(s.grad_phase);
}

Json rank_json(const ZeroRankSummary& r) {
  Json rank{{"rank", r.rank},
            {"step_seconds", seconds_json(r.median.step)},
            {"all_step_seconds", seconds_list_json(r.all_step_seconds)}};
  add_sample_fields(r.median, rank);
  rank["comm_bytes_per_step"] = comm_total(r.median);
  rank["model_state_bytes"] = r.model_state_bytes;
  rank["model_state_bytes_by_tier"] = {
      {"gpu", r.by_tier[0]}, {"cpu", r.by_tier[1]}, {"nvme", r.by_tier[2]}};
  rank["bucket_bytes"] = r.bucket_bytes;
  return rank;
}

Json run_json(const ZeroReport& report, const ZeroRun& run) {
  Json ranks = Json::array();
  for (const ZeroRankSummary& r : run.ranks) ranks.push_back(rank_json(r));
  const ZeroSample& m = run.median;
  Json doc{{"ranks", report.ranks},
           {"stage", report.options.stage},
           {"backend", report.comm_backend},
           {"state_home", run.state_home},
           {"bucket_bytes", report.bucket_bytes},
           {"gradient_buckets", report.gradient_buckets},
           {"alignment", report.alignment},
           {"groups", report.groups},
           {"padded_params", report.padded_params},
           {"shard_params", report.shard_params},
           {"single_step_seconds", seconds_json(run.single.step_seconds)},
           {"ideal_seconds", seconds_json(run.ideal_seconds)},
           {"step_seconds", seconds_json(run.step_seconds)},
           {"ratio", ratio_json(run.ratio())},
           {"all_step_seconds", seconds_list_json(run.all_step_seconds)},
           {"slowest_rank", run.median_rank}};
  add_sample_fields(m, doc);
  doc["comm_bytes_per_step"] = comm_total(m);
  doc["engine_comm_bytes_per_step"] = whole(m.engine_comm_bytes);
  doc["comm_bytes"] = {{"reduce_scatter", whole(m.comm_bytes[0])},
                       {"all_gather", whole(m.comm_bytes[1])},
                       {"all_reduce", whole(m.comm_bytes[2])}};
  doc["per_rank"] = std::move(ranks);
  return doc;
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

Json zero_json(const ZeroReport& r) {
  const OptimizerOptions& o = r.options.optimizer;
  Json doc = optimizer_fields_json(o, r.tensors, r.isa, r.threads);
  doc["step_seconds"] = seconds_json(r.cpu.single.step_seconds);
  doc["all_step_seconds"] = optimizer_all_seconds_json(r.cpu.single);
  doc["stats"] = optimizer_stats_json(r.cpu.single);
  doc["zero"] = run_json(r, r.cpu);
  if (r.nvme.has_value()) {
    doc["nvme"] = Json{{"paths", r.nvme_paths},
                       {"engine", r.nvme_engine},
                       {"step_seconds", seconds_json(r.nvme->single.step_seconds)},
                       {"all_step_seconds", optimizer_all_seconds_json(r.nvme->single)},
                       {"stats", optimizer_stats_json(r.nvme->single)},
                       {"zero", run_json(r, *r.nvme)}};
  }
  return doc;
}

}  // namespace strata::bench
