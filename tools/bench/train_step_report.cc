// The train-step workload's output: the human table and the "train_step" JSON object.
#include <absl/strings/str_format.h>
#include <absl/strings/str_join.h>

#include <algorithm>

#include "bench/json.h"
#include "bench/train_step.h"
#include "strata/base/size.h"
#include "strata/device/backend.h"

namespace strata::bench {
namespace {

std::string model_json(const PagingModel& m) {
  return absl::StrFormat(R"({"misses": %d, "fetched_bytes": %d, "written_back_bytes": %d})",
                         m.misses, m.fetched_bytes, m.written_back_bytes);
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

std::string train_step_json(const TrainStepReport& report) {
  const TrainStepOptions& o = report.options;
  const TrainStepBound& b = report.bound;
  std::vector<std::string> runs;
  for (const TrainStepRun& r : report.runs) {
    std::vector<std::string> all;
    for (double s : r.all_step_seconds) all.push_back(seconds_json(s));
    std::string stash = "null";
    if (r.stash.has_value()) {
      const TrainStepRun::Stash& st = *r.stash;
      stash = absl::StrFormat(
          R"({"loads": %d, "loads_prefetched": %d, "loads_kept": %d, "loads_on_demand": %d, )"
          R"("bytes_out": %d, "window_waits": %d, "window_wait_seconds": %s, )"
          R"("gpu_peak_bytes": %d})",
          st.loads, st.loads_prefetched, st.loads_kept, st.loads_on_demand, st.bytes_out,
          st.window_waits, seconds_json(st.window_wait_seconds), st.gpu_peak_bytes);
    }
    runs.push_back(absl::StrFormat(
        R"({"policy": "%s", "step_seconds": %s, "ratio_to_bound": %s, )"
        R"("ratio_to_arena_bound": %s, "stall_seconds": %s, )"
        R"("bytes_moved": %d, "bytes_to_gpu": %d, "bytes_from_gpu": %d, "hits": %d, )"
        R"("misses": %d, "prefetches_issued": %d, )"
        R"("prefetches_used": %d, "prefetches_late": %d, "prefetches_wasted": %d, )"
        R"("prefetches_failed": %d, "prefetch_accuracy": %s, "compute_seconds": %s, )"
        R"("early_writebacks": %d, "early_writebacks_used": %d, "early_writebacks_wasted": %d, )"
        R"("discards": %d, )"
        R"("seconds_per_move": %s, "seconds_per_fetch": %s, "seconds_per_write_back": %s, )"
        R"("all_step_seconds": [%s], "gpu_tier_peak_bytes": %d, "activations": %s, )"
        R"("timeline": %s})",
        r.policy, seconds_json(r.step_seconds), ratio_json(r.ratio_to_bound),
        ratio_json(r.ratio_to_arena_bound), seconds_json(r.stall_seconds), r.bytes_moved,
        r.bytes_to_gpu, r.bytes_from_gpu, r.hits, r.misses, r.prefetches_issued, r.prefetches_used,
        r.prefetches_late, r.prefetches_wasted, r.prefetches_failed,
        ratio_json(r.prefetch_accuracy), seconds_json(r.compute_seconds), r.early_writebacks,
        r.early_writebacks_used, r.early_writebacks_wasted, r.discards,
        seconds_json(r.seconds_per_move), seconds_json(r.seconds_per_fetch),
        seconds_json(r.seconds_per_write_back), absl::StrJoin(all, ", "), r.gpu_tier_peak_bytes,
        stash, r.timeline.has_value() ? step_timeline_json(*r.timeline) : "null"));
  }
  return absl::StrFormat(
      R"({"bound_seconds": %s, "arena_bound_seconds": %s, "arena_bound_cut": %s, )"
      R"("arena_bound_cross_bytes": %d, "arena_bound_link": "%s", )"
      R"("compute_seconds": %s, "transfer_bytes": %d, )"
      R"("transfer_seconds": %s, "link_gbps": %s, "h2d_gbps": %s, "nvme_read_gbps": %s, )"
      R"("layers": %d, "layer_bytes": %d, "activation_bytes": %d, "compute_ms": %s, )"
      R"("optimizer": %s, "optimizer_ms": %s, "arena_layers": %d, "arena_bytes": %d, )"
      R"("home": "%s", "link_throttle_gbps": %s, "steps": %d, "sync_each_layer": %s, )"
      R"("discard": %s, "early_writeback": %s, )"
      R"("model": {"belady": %s, "lru": %s}, "activations": "%s", )"
      R"("activation_window_bytes": %d, "activation_prefetch_bytes": %d, )"
      R"("activation_transfer_bytes": %d, "d2h_bytes": %d, "runs": [%s]})",
      seconds_json(b.seconds()), seconds_json(b.arena_seconds()), json_quote(b.arena.where),
      b.arena.cross_after_bytes, b.arena_link, seconds_json(b.compute_seconds), b.transfer_bytes,
      seconds_json(b.transfer_seconds()), ratio_json(b.link_bytes_per_second / 1e9),
      ratio_json(b.h2d_bytes_per_second / 1e9),
      b.nvme_bytes_per_second.has_value() ? ratio_json(*b.nvme_bytes_per_second / 1e9) : "null",
      o.layers, o.layer_bytes, o.activation_bytes, ratio_json(o.compute_ms), json_bool(o.optimizer),
      ratio_json(o.optimizer_ms), o.arena_layers, b.arena_bytes, o.home,
      report.config.backend == Backend::kHost ? ratio_json(o.link_gbps) : "null", o.steps,
      json_bool(o.sync_each_layer), json_bool(o.discard), json_bool(o.early_writeback),
      model_json(b.belady), model_json(b.lru), o.activations,
      o.activations == "stash" ? stash_window_bytes(o) : 0,
      o.activations == "stash" ? stash_prefetch_bytes(o) : 0, b.activation_transfer_bytes,
      b.d2h_bytes, absl::StrJoin(runs, ", "));
}

}  // namespace strata::bench
