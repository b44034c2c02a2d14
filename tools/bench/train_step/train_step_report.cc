// The train-step workload's output: the human table and the "train_step" JSON object.
#include <absl/strings/str_format.h>

#include <algorithm>

#include "bench/train_step/train_step.h"
#include "json.h"
#include "strata/base/size.h"
#include "strata/device/backend.h"

namespace strata::bench {
namespace {

Json model_json(const PagingModel& m) {
  return Json{{"misses", m.misses},
              {"fetched_bytes", m.fetched_bytes},
              {"written_back_bytes", m.written_back_bytes}};
}

std::string model_text(const char* policy, const PagingModel& m) {
  return absl::StrFormat("%s %d misses, fetches %s, writes back %s", policy, m.misses,
                         format_bytes(m.fetched_bytes), format_bytes(m.written_back_bytes));
}

std::string gbps(double bytes_per_second) {
  return absl::StrFormat("%.2f GB/s", bytes_per_second / 1e9);
}

// Why the arena bound is what it is: its binding cut, or that no cut exceeds the bound.
std::string arena_bound_text(const TrainStepBound& b) {
  const ArenaBound& a = b.arena;
  if (a.seconds <= b.seconds()) {
    return absl::StrFormat(
        "arena bound %.4f s = the bound (no cut between layers gives more; the most, before %s: "
        "%.4f s)",
        b.arena_seconds(), a.where, a.seconds);
  }
  return absl::StrFormat(
      "arena bound %.4f s = compute before %s %.4f s + max(compute after it %.4f s, %s that must "
      "cross after it (%s read from there on - %s of %s) / %s %s = %.4f s)",
      b.arena_seconds(), a.where, a.compute_before_seconds, a.compute_after_seconds,
      format_bytes(a.cross_after_bytes), format_bytes(a.fetch_after_bytes),
      format_bytes(b.arena_capacity_bytes), b.arena_link == "H2D" ? "arena" : "arena and CPU tier",
      gbps(b.arena_link_bytes_per_second), b.arena_link,
      b.arena_link_bytes_per_second > 0
          ? static_cast<double>(a.cross_after_bytes) / b.arena_link_bytes_per_second
          : 0);
}

}  // namespace

void print_train_step(const TrainStepReport& report, std::ostream& out) {
  const TrainStepOptions& o = report.options;
  const TrainStepBound& b = report.bound;
  out << absl::StrFormat(
      "\ntrain-step: %d layers x (weight %s + activation %s%s) homed on %s, %s, compute %.3f ms "
      "per layer of forward and backward%s, GPU arena of %d layers (STRATA_GPU_BYTES=%s), median "
      "of %d step(s) after 1 warm-up%s%s\n",
      o.layers, format_bytes(o.layer_bytes), format_bytes(o.activation_bytes),
      o.optimizer ? " + gradient " + format_bytes(o.layer_bytes) : std::string(), o.home,
      o.optimizer ? "forward, backward, optimizer" : "forward, backward", o.compute_ms,
      o.optimizer ? absl::StrFormat(", %.3f ms of the optimizer", o.optimizer_ms) : std::string(),
      o.arena_layers, format_bytes(report.config.gpu_bytes), o.steps,
      o.sync_each_layer ? ", host waits for each layer's compute" : "",
      o.discard ? ", dead activations and gradients discarded" : "");
  out << absl::StrFormat("bound %.4f s = max(compute %.4f s, transfer %s / %s = %.4f s)\n",
                         b.seconds(), b.compute_seconds,
                         format_bytes(std::max(b.transfer_bytes, b.d2h_bytes)),
                         gbps(b.link_bytes_per_second), b.transfer_seconds());
  out << arena_bound_text(b) << "\n";
  if (o.activations == "stash") {
    out << absl::StrFormat(
        "activations through the stash: window %s, prefetch %s; %s out in forward and back in "
        "backward per step (what keep_tail does not keep); to the GPU %s, from it %s per step\n",
        format_bytes(stash_window_bytes(o)), format_bytes(stash_prefetch_bytes(o)),
        format_bytes(b.activation_transfer_bytes), format_bytes(b.transfer_bytes),
        format_bytes(b.d2h_bytes));
  }
  out << "model of one step in " << format_bytes(b.arena_bytes)
      << " (no prefetch): " << model_text("belady", b.belady) << "; " << model_text("lru", b.lru)
      << "\n";
  out << "link: H2D " << gbps(b.h2d_bytes_per_second) << " measured";
  if (report.config.backend == Backend::kHost) {
    out << absl::StrFormat(" (throttle %.2f GB/s)", o.link_gbps);
  }
  if (b.nvme_bytes_per_second.has_value()) {
    out << ", NVMe read " << gbps(*b.nvme_bytes_per_second) << " measured (" << report.engine
        << ")";
  }
  out << "\n\n";
  out << absl::StrFormat("%-10s %9s %7s %7s %8s %8s %11s %11s %6s %6s %6s %6s %7s %5s %6s %6s\n",
                         "policy", "step s", "ratio", "arena r", "stall s", "idle s", "to gpu",
                         "from gpu", "ms/in", "ms/out", "hits", "misses", "pf acc", "late",
                         "wasted", "failed");
  for (const TrainStepRun& r : report.runs) {
    out << absl::StrFormat(
        "%-10s %9.4f %7.3f %7.3f %8.4f %8.4f %11s %11s %6.2f %6.2f %6d %6d %7s %5d %6d %6d\n",
        r.policy, r.step_seconds, r.ratio_to_bound, r.ratio_to_arena_bound, r.stall_seconds,
        std::max(0.0, r.step_seconds - r.compute_seconds), format_bytes(r.bytes_to_gpu),
        format_bytes(r.bytes_from_gpu), r.seconds_per_fetch * 1e3, r.seconds_per_write_back * 1e3,
        r.hits, r.misses,
        r.prefetches_issued == 0 ? std::string("-") : absl::StrFormat("%.3f", r.prefetch_accuracy),
        r.prefetches_late, r.prefetches_wasted, r.prefetches_failed);
  }
  for (const TrainStepRun& r : report.runs) {
    if (!r.stash.has_value()) continue;
    const TrainStepRun::Stash& st = *r.stash;
    out << absl::StrFormat(
        "%-10s activations: %d loads (%d prefetched, %d kept, %d on demand), %s sent home, %d "
        "waits for window room (%.4f s); stash peak %s of the GPU tier, the tier's high-water "
        "mark %s\n",
        r.policy, st.loads, st.loads_prefetched, st.loads_kept, st.loads_on_demand,
        format_bytes(st.bytes_out), st.window_waits, st.window_wait_seconds,
        format_bytes(st.gpu_peak_bytes), format_bytes(r.gpu_tier_peak_bytes));
  }
  for (const TrainStepRun& r : report.runs) {
    if (r.timeline.has_value()) out << "\n" << step_timeline_text(r.policy, *r.timeline);
  }
  out << "\n";
  for (const std::string& note : report.notes) out << note << "\n";
  out << "ratio = step / bound; arena r = step / arena bound (the bound, or more where the arena "
         "cannot hold what the layers after a cut read: docs/train-step.md); transfer = the bytes "
         "Belady's offline paging (the model line) "
         "fetches into the arena per step; link = the slower of H2D and the NVMe read; stall = "
         "host time acquires waited; idle = step - the simulated compute's own time (the compute "
         "stream without work); to gpu / from gpu = bytes the step moved into the GPU tier "
         "(fetches, prefetches) and out of it (write-backs of evicted written copies); ms/in, "
         "ms/out = "
         "mean host time per move into and out of the GPU tier (for NVMe the read or the write "
         "itself).\n";
}

namespace {

Json stash_json(const TrainStepRun& r) {
  if (!r.stash.has_value()) return nullptr;
  const TrainStepRun::Stash& st = *r.stash;
  return Json{{"loads", st.loads},
              {"loads_prefetched", st.loads_prefetched},
              {"loads_kept", st.loads_kept},
              {"loads_on_demand", st.loads_on_demand},
              {"bytes_out", st.bytes_out},
              {"window_waits", st.window_waits},
              {"window_wait_seconds", seconds_json(st.window_wait_seconds)},
              {"gpu_peak_bytes", st.gpu_peak_bytes}};
}

Json run_json(const TrainStepRun& r) {
  return Json{{"policy", r.policy},
              {"step_seconds", seconds_json(r.step_seconds)},
              {"ratio_to_bound", ratio_json(r.ratio_to_bound)},
              {"ratio_to_arena_bound", ratio_json(r.ratio_to_arena_bound)},
              {"stall_seconds", seconds_json(r.stall_seconds)},
              {"bytes_moved", r.bytes_moved},
              {"bytes_to_gpu", r.bytes_to_gpu},
              {"bytes_from_gpu", r.bytes_from_gpu},
              {"hits", r.hits},
              {"misses", r.misses},
              {"prefetches_issued", r.prefetches_issued},
              {"prefetches_used", r.prefetches_used},
              {"prefetches_late", r.prefetches_late},
              {"prefetches_wasted", r.prefetches_wasted},
              {"prefetches_failed", r.prefetches_failed},
              {"prefetch_accuracy", ratio_json(r.prefetch_accuracy)},
              {"compute_seconds", seconds_json(r.compute_seconds)},
              {"early_writebacks", r.early_writebacks},
              {"early_writebacks_used", r.early_writebacks_used},
              {"early_writebacks_wasted", r.early_writebacks_wasted},
              {"discards", r.discards},
              {"seconds_per_move", seconds_json(r.seconds_per_move)},
              {"seconds_per_fetch", seconds_json(r.seconds_per_fetch)},
              {"seconds_per_write_back", seconds_json(r.seconds_per_write_back)},
              {"all_step_seconds", seconds_list_json(r.all_step_seconds)},
              {"gpu_tier_peak_bytes", r.gpu_tier_peak_bytes},
              {"activations", stash_json(r)},
              {"timeline", r.timeline.has_value() ? step_timeline_json(*r.timeline) : Json()}};
}

}  // namespace

Json train_step_json(const TrainStepReport& report) {
  const TrainStepOptions& o = report.options;
  const TrainStepBound& b = report.bound;
  const bool stash = o.activations == "stash";
  Json runs = Json::array();
  for (const TrainStepRun& r : report.runs) runs.push_back(run_json(r));
  return Json{
      {"bound_seconds", seconds_json(b.seconds())},
      {"arena_bound_seconds", seconds_json(b.arena_seconds())},
      {"arena_bound_cut", b.arena.where},
      {"arena_bound_cross_bytes", b.arena.cross_after_bytes},
      {"arena_bound_link", b.arena_link},
      {"compute_seconds", seconds_json(b.compute_seconds)},
      {"transfer_bytes", b.transfer_bytes},
      {"transfer_seconds", seconds_json(b.transfer_seconds())},
      {"link_gbps", ratio_json(b.link_bytes_per_second / 1e9)},
      {"h2d_gbps", ratio_json(b.h2d_bytes_per_second / 1e9)},
      {"nvme_read_gbps",
       b.nvme_bytes_per_second.has_value() ? ratio_json(*b.nvme_bytes_per_second / 1e9) : Json()},
      {"layers", o.layers},
      {"layer_bytes", o.layer_bytes},
      {"activation_bytes", o.activation_bytes},
      {"compute_ms", ratio_json(o.compute_ms)},
      {"optimizer", o.optimizer},
      {"optimizer_ms", ratio_json(o.optimizer_ms)},
      {"arena_layers", o.arena_layers},
      {"arena_bytes", b.arena_bytes},
      {"home", o.home},
      {"link_throttle_gbps",
       report.config.backend == Backend::kHost ? ratio_json(o.link_gbps) : Json()},
      {"steps", o.steps},
      {"sync_each_layer", o.sync_each_layer},
      {"discard", o.discard},
      {"early_writeback", o.early_writeback},
      {"model", {{"belady", model_json(b.belady)}, {"lru", model_json(b.lru)}}},
      {"activations", o.activations},
      {"activation_window_bytes", stash ? stash_window_bytes(o) : 0},
      {"activation_prefetch_bytes", stash ? stash_prefetch_bytes(o) : 0},
      {"activation_transfer_bytes", b.activation_transfer_bytes},
      {"d2h_bytes", b.d2h_bytes},
      {"runs", std::move(runs)}};
}

}  // namespace strata::bench
