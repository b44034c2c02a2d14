// --workload=zero's output: the human table and the "zero" JSON object.
#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>
#include <absl/strings/str_join.h>

#include "bench/json.h"
#include "bench/zero3_workload.h"
#include "strata/base/size.h"

namespace strata::bench {
namespace {

uint64_t whole(double v) { return static_cast<uint64_t>(v + 0.5); }

std::string bound_json(const Zero3Bound& b) {
  return absl::StrFormat(
      R"({"compute_seconds": %s, "gather_seconds": %s, "reduce_scatter_seconds": %s, )"
      R"("comm_seconds": %s, "shard_read_seconds": %s, "optimizer_seconds": %s, "seconds": %s})",
      seconds_json(b.compute), seconds_json(b.gather), seconds_json(b.reduce_scatter),
      seconds_json(b.comm), seconds_json(b.shard_read), seconds_json(b.optimizer),
      seconds_json(b.seconds));
}

// The fields of one step's record, shared by the job and its ranks.
std::string sample_fields(const Zero3Report& report, const Zero3Sample& s) {
  const Zero3Bound b = bound_of(report, s);
  const Zero3Goal g = goal_of(report, s);
  return absl::StrCat(
      absl::StrFormat(
          R"("forward_seconds": %s, "backward_seconds": %s, "step_call_seconds": %s, )"
          R"("compute_seconds": %s, "optimizer_seconds": %s, "fetch_wait_seconds": %s, )"
          R"("gather_wait_seconds": %s, )"
          R"("reduce_scatter_wait_seconds": %s, "acquire_param_seconds": %s, )"
          R"("release_param_seconds": %s, "acquire_grad_seconds": %s, "grad_ready_seconds": %s, )"
          R"("grad_copy_seconds": %s, "outside_compute_seconds": %s, )",
          seconds_json(s.forward), seconds_json(s.backward), seconds_json(s.step_call),
          seconds_json(s.compute), seconds_json(s.optimizer), seconds_json(s.fetch_wait),
          seconds_json(s.gather_wait), seconds_json(s.reduce_scatter_wait),
          seconds_json(s.acquire_param), seconds_json(s.release_param),
          seconds_json(s.acquire_grad), seconds_json(s.grad_ready), seconds_json(s.grad_copy),
          seconds_json(s.outside_compute())),
      absl::StrFormat(
          R"("exposed_comm_seconds": %s, "exposed_comm_fraction": %s, )"
          R"("exposed_with_grad_waits_seconds": %s, "exposed_with_grad_waits_fraction": %s, )"
          R"("gathers": %d, )"
          R"("gathers_on_demand": %d, "gathers_prefetched": %d, "reuses": %d, "prefetch_late": %d, )"
          R"("gathers_dropped_unused": %d, "order_changes": %d, "gathered_peak_bytes": %d, )"
          R"("all_gather_bytes": %d, "reduce_scatter_bytes": %d, "nvme_read_bytes": %d, )",
          seconds_json(s.exposed()), ratio_json(s.exposed_fraction()),
          seconds_json(s.exposed_with_grad_waits()),
          ratio_json(s.exposed_with_grad_waits_fraction()), whole(s.gathers),
          whole(s.gathers_on_demand), whole(s.gathers_prefetched), whole(s.reuses),
          whole(s.prefetch_late), whole(s.dropped_unused), whole(s.order_changes),
          whole(s.gathered_peak_bytes), whole(s.all_gather_bytes), whole(s.reduce_scatter_bytes),
          whole(s.nvme_read_bytes)),
      absl::StrFormat(R"("optimizer_step_seconds": %s, "early_elements": %d, )"
                      R"("rolled_back": %s, "early_wait_seconds": %s, )",
                      seconds_json(s.optimizer_step), whole(s.early_elements),
                      json_bool(s.rolled_back > 0), seconds_json(s.early_wait)),
      absl::StrFormat(R"("overlap_bound_seconds": %s, "ratio": %s, "bound": %s, )"
                      R"("goal": {"exposed_fraction_max": %s, "applies": %s, "met": %s})",
                      seconds_json(b.seconds), ratio_json(b.seconds > 0 ? s.step / b.seconds : 0),
                      bound_json(b), ratio_json(kExposedGoal), json_bool(g.applies),
                      json_bool(g.met)));
}

std::string rank_json(const Zero3Report& report, const Zero3RankSummary& r) {
  const auto& t = r.model_states_by_tier;
  return absl::StrFormat(
      R"({"rank": %d, "step_seconds": %s, "all_step_seconds": %s, %s, "model_state_bytes": %d, )"
      R"("model_state_bytes_by_tier": {"gpu": %d, "cpu": %d, "nvme": %d}, )"
      R"("mean_nvme_read_bytes": %.1f, "rollback_rate": %s})",
      r.rank, seconds_json(r.median.step), seconds_list_json(r.all_step_seconds),
      sample_fields(report, r.median), r.model_state_bytes, t[0], t[1], t[2],
      r.mean_nvme_read_bytes, ratio_json(r.rollback_rate));
}

std::string baselines_json(const Zero3Report& r) {
  std::string read = "null";
  if (r.raw_read.has_value()) {
    read =
        absl::StrFormat(R"({"bytes": %d, "seconds": %s, "samples": %s})", r.raw_read->bytes,
                        seconds_json(r.raw_read->seconds), seconds_list_json(r.raw_read->samples));
  }
  return absl::StrFormat(
      R"({"calls_per_sample": %d, "all_gather_seconds": %s, "reduce_scatter_seconds": %s, )"
      R"("all_gather_samples": %s, "reduce_scatter_samples": %s, "shard_read": %s, )"
      R"("compute_ns_per_element": %s, "compute_elements_per_layer": %d, )"
      R"("compute_samples_ns": %s})",
      r.raw_comm.calls_per_sample, seconds_json(r.raw_comm.all_gather_seconds),
      seconds_json(r.raw_comm.reduce_scatter_seconds),
      seconds_list_json(r.raw_comm.all_gather_samples),
      seconds_list_json(r.raw_comm.reduce_scatter_samples), read,
      json_fixed(r.compute.ns_per_element, 4), r.compute.elements_per_layer,
      json_fixed_list(r.compute.samples_ns, 4));
}

std::string ms(double s) { return absl::StrFormat("%.3f ms", s * 1e3); }

std::string percent(double fraction, int digits = 1) {
  return absl::StrFormat("%.*f%%", digits, fraction * 100);
}

void print_row(const Zero3Report& report, const std::string& label, double step,
               const Zero3Sample& s, std::ostream& out) {
  const Zero3Bound b = bound_of(report, s);
  out << absl::StrFormat(
      "%-7s %9.5f %9.5f %6.3f %9.5f %9.5f %9.5f %9.5f %9.5f %8s %9.5f %9.5f %8d %5d %9s\n", label,
      step, b.seconds, b.seconds > 0 ? step / b.seconds : 0, s.compute, b.comm, b.shard_read,
      s.optimizer, s.exposed(), percent(s.exposed_fraction()), s.outside_compute(),
      s.acquire_param + s.acquire_grad + s.grad_ready, whole(s.gathers), whole(s.prefetch_late),
      format_bytes(whole(s.gathered_peak_bytes)));
}

std::string goal_text(const Zero3Report& report, const Zero3Sample& s) {
  const Zero3Bound b = bound_of(report, s);
  const Zero3Goal g = goal_of(report, s);
  if (!g.applies) {
    return absl::StrFormat(
        "does not apply: compute %s is below the communication %s%s (exposed %s of the step)",
        ms(b.compute), ms(std::max(b.comm, b.shard_read)),
        b.shard_read > b.comm ? " (the shard read)" : "", percent(s.exposed_fraction(), 2));
  }
  return absl::StrFormat(
      "%s: exposed %s of the step (compute %s >= communication %s); with the gradient-bucket "
      "waits in acquire_grad (ZeroStats::bucket_wait_ns), %s",
      g.met ? "met" : "NOT met", percent(s.exposed_fraction(), 2), ms(b.compute),
      ms(std::max(b.comm, b.shard_read)), percent(s.exposed_with_grad_waits_fraction(), 2));
}

}  // namespace

void print_zero3(const Zero3Report& r, std::ostream& out) {
  const Zero3Options& o = r.options;
  out << absl::StrFormat(
      "\nzero, ZeRO-DP stage 3 over %d rank(s) (%s): %d layers of %s fp16 (%d params, padded "
      "to %d, %d per rank), shards in %s, optimizer states in cpu; prefetch %s, max live %s, "
      "reuse window %s; compute %s per layer and pass (y = a*x + y, %d elements at %.3f ns "
      "each); median of %d step(s) after 1 warm-up, each step the slowest rank's\n",
      r.ranks, r.comm_backend, o.layers, format_bytes(o.layer_bytes), r.layer_params,
      r.padded_params, r.shard_params, o.param_home, format_bytes(r.prefetch_bytes),
      format_bytes(r.max_live_bytes), format_bytes(r.reuse_window_bytes),
      absl::FormatDuration(o.layer_compute), r.compute.elements_per_layer, r.compute.ns_per_element,
      o.steps);
  out << "baselines (median, slowest rank): all_gather of a layer "
      << ms(r.raw_comm.all_gather_seconds) << ", reduce_scatter of a layer "
      << ms(r.raw_comm.reduce_scatter_seconds);
  if (r.raw_read.has_value()) {
    out << ", read of this rank's shard (" << format_bytes(r.raw_read->bytes) << ") "
        << ms(r.raw_read->seconds);
  }
  out << "\n\n";
  out << absl::StrFormat("%-7s %9s %9s %6s %9s %9s %9s %9s %9s %8s %9s %9s %8s %5s %9s\n", "",
                         "step s", "bound s", "ratio", "compute", "comm", "read", "optimizer",
                         "exposed", "exposed%", "outside", "in calls", "gathers", "late", "peak");
  print_row(r, "job", r.step_seconds, r.median, out);
  for (const Zero3RankSummary& rank : r.per_rank) {
    print_row(r, absl::StrFormat("rank %d", rank.rank), rank.median.step, rank.median, out);
  }
  if (o.param_home == "nvme") {
    out << "NVMe reads per step (mean over the steps; the own shard is "
        << format_bytes(r.shard_bytes) << "):";
    for (const Zero3RankSummary& rank : r.per_rank) {
      out << " rank " << rank.rank << " " << format_bytes(whole(rank.mean_nvme_read_bytes));
    }
    out << "\n";
  }
  out << absl::StrFormat(
      "optimizer step, overlap %s: step() of the rank optimizer %s in the job's median step "
      "(rank %d), %d elements stepped early and kept, early wait %s; rollback rate",
      o.overlap ? "on" : "off", ms(r.median.optimizer_step), r.slowest_rank,
      whole(r.median.early_elements), ms(r.median.early_wait));
  for (const Zero3RankSummary& rank : r.per_rank) {
    out << absl::StrFormat(" rank %d %.2f", rank.rank, rank.rollback_rate);
  }
  out << "\n";
  out << "\ngoal (exposed communication <= 10% of the step where compute >= communication), "
         "the job's median step (rank "
      << r.slowest_rank << "): " << goal_text(r, r.median) << "\n";
  for (const std::string& note : r.notes) out << note << "\n";
  out << "bound = max(compute, comm, read) + optimizer: comm = gathers x the raw all_gather + "
         "layers x the raw reduce_scatter (the Communicator called directly, this run), read = "
         "the raw io_uring read of the rank's shard (nvme); ratio = step / bound; exposed = "
         "the engine's fetch_wait_ns (acquire_param's host time) + the gather waits (the "
         "trainer's stream synchronized before each layer's compute) + last_step_wait_ns; "
         "outside = step - compute - optimizer (every host wait, counted or not); in calls = "
         "host time inside acquire_param, acquire_grad and grad_ready; late = prefetch_late; "
         "peak = gathered_peak_bytes.\n";
}

std::string zero3_json(const Zero3Report& r) {
  const Zero3Options& o = r.options;
  std::vector<std::string> ranks;
  for (const Zero3RankSummary& rank : r.per_rank) ranks.push_back(rank_json(r, rank));
  return absl::StrFormat(
      R"({"ranks": %d, "stage": 3, "backend": "%s", "param_home": "%s", "state_home": "cpu", )"
      R"("overlap": %s, )"
      R"("layers": %d, "layer_bytes": %d, "layer_params": %d, "padded_params": %d, )"
      R"("shard_params": %d, "gathered_layer_bytes": %d, "shard_bytes": %d, )"
      R"("prefetch_bytes": %d, "max_live_bytes": %d, "reuse_window_bytes": %d, "steps": %d, )"
      R"("layer_compute_seconds": %s, "baselines": %s, "step_seconds": %s, )"
      R"("all_step_seconds": %s, "slowest_rank": %d, %s, "per_rank": [%s]})",
      r.ranks, r.comm_backend, o.param_home, json_bool(o.overlap), o.layers, o.layer_bytes,
      r.layer_params, r.padded_params, r.shard_params, r.gathered_layer_bytes, r.shard_bytes,
      r.prefetch_bytes, r.max_live_bytes, r.reuse_window_bytes, o.steps,
      seconds_json(absl::ToDoubleSeconds(o.layer_compute)), baselines_json(r),
      seconds_json(r.step_seconds), seconds_list_json(r.all_step_seconds), r.slowest_rank,
      sample_fields(r, r.median), absl::StrJoin(ranks, ", "));
}

}  // namespace strata::bench
