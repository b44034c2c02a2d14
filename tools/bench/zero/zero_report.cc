// --workload=zero's output: the human table and the "zero" JSON object.
#include <absl/strings/str_format.h>

#include <utility>

#include "bench/zero/zero_workload.h"
#include "json.h"
#include "strata/base/size.h"

namespace strata::bench {
namespace {

uint64_t whole(double v) { return static_cast<uint64_t>(v + 0.5); }

Json bound_json(const Zero3Bound& b) {
  return Json{{"compute_seconds", seconds_json(b.compute)},
              {"gather_seconds", seconds_json(b.gather)},
              {"reduce_scatter_seconds", seconds_json(b.reduce_scatter)},
              {"comm_seconds", seconds_json(b.comm)},
              {"shard_read_seconds", seconds_json(b.shard_read)},
              {"optimizer_seconds", seconds_json(b.optimizer)},
              {"seconds", seconds_json(b.seconds)}};
}

// The fields of one step's record, shared by the job and its ranks.
void add_sample_fields(const Zero3Report& report, const Zero3Sample& s, Json& into) {
  const Zero3Bound b = bound_of(report, s);
  const Zero3Goal g = goal_of(report, s);
  const std::pair<const char*, double> seconds[] = {
      {"forward_seconds", s.forward},
      {"backward_seconds", s.backward},
      {"step_call_seconds", s.step_call},
      {"compute_seconds", s.compute},
      {"optimizer_seconds", s.optimizer},
      {"fetch_wait_seconds", s.fetch_wait},
      {"gather_wait_seconds", s.gather_wait},
      {"reduce_scatter_wait_seconds", s.reduce_scatter_wait},
      {"acquire_param_seconds", s.acquire_param},
      {"release_param_seconds", s.release_param},
      {"acquire_grad_seconds", s.acquire_grad},
      {"grad_ready_seconds", s.grad_ready},
      {"grad_copy_seconds", s.grad_copy},
      {"outside_compute_seconds", s.outside_compute()},
      {"exposed_comm_seconds", s.exposed()}};
  for (const auto& [key, value] : seconds) into[key] = seconds_json(value);
  into["exposed_comm_fraction"] = ratio_json(s.exposed_fraction());
  into["exposed_with_grad_waits_seconds"] = seconds_json(s.exposed_with_grad_waits());
  into["exposed_with_grad_waits_fraction"] = ratio_json(s.exposed_with_grad_waits_fraction());
  const std::pair<const char*, double> counts[] = {{"gathers", s.gathers},
                                                   {"gathers_on_demand", s.gathers_on_demand},
                                                   {"gathers_prefetched", s.gathers_prefetched},
                                                   {"reuses", s.reuses},
                                                   {"prefetch_late", s.prefetch_late},
                                                   {"gathers_dropped_unused", s.dropped_unused},
                                                   {"order_changes", s.order_changes},
                                                   {"gathered_peak_bytes", s.gathered_peak_bytes},
                                                   {"all_gather_bytes", s.all_gather_bytes},
                                                   {"reduce_scatter_bytes", s.reduce_scatter_bytes},
                                                   {"nvme_read_bytes", s.nvme_read_bytes}};
  for (const auto& [key, value] : counts) into[key] = whole(value);
  into["optimizer_step_seconds"] = seconds_json(s.optimizer_step);
  into["early_elements"] = whole(s.early_elements);
  into["rolled_back"] = s.rolled_back > 0;
  into["early_wait_seconds"] = seconds_json(s.early_wait);
  into["overlap_bound_seconds"] = seconds_json(b.seconds);
  into["ratio"] = ratio_json(b.seconds > 0 ? s.step / b.seconds : 0);
  into["bound"] = bound_json(b);
  into["goal"] = {
      {"exposed_fraction_max", ratio_json(kExposedGoal)}, {"applies", g.applies}, {"met", g.met}};
}

Json rank_json(const Zero3Report& report, const Zero3RankSummary& r) {
  const auto& t = r.model_states_by_tier;
  Json rank{{"rank", r.rank},
            {"step_seconds", seconds_json(r.median.step)},
            {"all_step_seconds", seconds_list_json(r.all_step_seconds)}};
  add_sample_fields(report, r.median, rank);
  rank["model_state_bytes"] = r.model_state_bytes;
  rank["model_state_bytes_by_tier"] = {{"gpu", t[0]}, {"cpu", t[1]}, {"nvme", t[2]}};
  rank["mean_nvme_read_bytes"] = json_fixed(r.mean_nvme_read_bytes, 1);
  rank["rollback_rate"] = ratio_json(r.rollback_rate);
  return rank;
}

Json baselines_json(const Zero3Report& r) {
  Json read = nullptr;
  if (r.raw_read.has_value()) {
    read = {{"bytes", r.raw_read->bytes},
            {"seconds", seconds_json(r.raw_read->seconds)},
            {"samples", seconds_list_json(r.raw_read->samples)}};
  }
  return Json{{"calls_per_sample", r.raw_comm.calls_per_sample},
              {"all_gather_seconds", seconds_json(r.raw_comm.all_gather_seconds)},
              {"reduce_scatter_seconds", seconds_json(r.raw_comm.reduce_scatter_seconds)},
              {"all_gather_samples", seconds_list_json(r.raw_comm.all_gather_samples)},
              {"reduce_scatter_samples", seconds_list_json(r.raw_comm.reduce_scatter_samples)},
              {"shard_read", std::move(read)},
              {"compute_ns_per_element", json_fixed(r.compute.ns_per_element, 4)},
              {"compute_elements_per_layer", r.compute.elements_per_layer},
              {"compute_samples_ns", json_fixed_list(r.compute.samples_ns, 4)}};
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

Json zero3_json(const Zero3Report& r) {
  const Zero3Options& o = r.options;
  Json doc{{"ranks", r.ranks},
           {"stage", 3},
           {"backend", r.comm_backend},
           {"param_home", o.param_home},
           {"state_home", "cpu"},
           {"overlap", o.overlap},
           {"layers", o.layers},
           {"layer_bytes", o.layer_bytes},
           {"layer_params", r.layer_params},
           {"padded_params", r.padded_params},
           {"shard_params", r.shard_params},
           {"gathered_layer_bytes", r.gathered_layer_bytes},
           {"shard_bytes", r.shard_bytes},
           {"prefetch_bytes", r.prefetch_bytes},
           {"max_live_bytes", r.max_live_bytes},
           {"reuse_window_bytes", r.reuse_window_bytes},
           {"steps", o.steps},
           {"layer_compute_seconds", seconds_json(absl::ToDoubleSeconds(o.layer_compute))},
           {"baselines", baselines_json(r)},
           {"step_seconds", seconds_json(r.step_seconds)},
           {"all_step_seconds", seconds_list_json(r.all_step_seconds)},
           {"slowest_rank", r.slowest_rank}};
  add_sample_fields(r, r.median, doc);
  Json ranks = Json::array();
  for (const Zero3RankSummary& rank : r.per_rank) ranks.push_back(rank_json(r, rank));
  doc["per_rank"] = std::move(ranks);
  return doc;
}

}  // namespace strata::bench
