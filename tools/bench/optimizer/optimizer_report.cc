// The optimizer workload's output: the human lines and the "optimizer" JSON object.
#include <absl/strings/str_format.h>
#include <absl/strings/str_join.h>

#include "bench/optimizer/optimizer_baselines.h"
#include "bench/optimizer/optimizer_workload.h"
#include "json.h"
#include "strata/base/size.h"

namespace strata::bench {
namespace {

Json stats_json(const OptimizerStepRun& run) {
  const OffloadOptimizerStats& s = run.stats;
  return Json{{"last_step_ns", s.last_step_ns},
              {"last_step_wait_ns", s.last_step_wait_ns},
              {"last_adam_ns", s.last_adam_ns},
              {"last_nvme_wait_ns", s.last_nvme_wait_ns},
              {"peak_staging_chunks", s.peak_staging_chunks},
              {"chunk_elements", s.chunk_elements},
              {"chunks", s.chunks},
              {"nvme_bytes_read", run.nvme_bytes_read},
              {"nvme_bytes_written", run.nvme_bytes_written}};
}

Json all_seconds_json(const OptimizerStepRun& run) {
  return seconds_list_json(run.all_step_seconds);
}

double gbps(double bytes_per_second) { return bytes_per_second / 1e9; }

// "1.50 G", "100.00 M", "512.00 K": decimal, as --params is written.
std::string count_text(double count) {
  if (count >= 1e9) return absl::StrFormat("%.2f G", count / 1e9);
  if (count >= 1e6) return absl::StrFormat("%.2f M", count / 1e6);
  if (count >= 1e3) return absl::StrFormat("%.2f K", count / 1e3);
  return absl::StrFormat("%.0f", count);
}

}  // namespace

Json optimizer_fields_json(const OptimizerOptions& options, uint64_t tensors,
                           const std::string& isa, uint32_t threads) {
  return Json{{"params", options.params},
              {"dtype", options.dtype},
              {"bytes_per_param", bytes_per_param(options.dtype)},
              {"tensors", tensors},
              {"repeat", options.repeat},
              {"isa", isa},
              {"threads", threads}};
}

Json optimizer_stats_json(const OptimizerStepRun& run) { return stats_json(run); }
Json optimizer_all_seconds_json(const OptimizerStepRun& run) { return all_seconds_json(run); }

void print_optimizer(const OptimizerReport& r, std::ostream& out) {
  const OptimizerOptions& o = r.options;
  const auto n = static_cast<double>(o.params);
  const uint64_t bpp = bytes_per_param(o.dtype);
  out << absl::StrFormat(
      "\noptimizer: %s params (%d) in %d tensors, %s gradients and parameter copies (%d B per "
      "param), AdamW on %d threads (%s kernels); median of %d step(s) after 1 warm-up\n",
      count_text(n), o.params, r.tensors, o.dtype, bpp, r.threads, r.isa, o.repeat);
  out << absl::StrFormat(
      "floor  %10.5f s = %d B x params / %.2f GB/s (median triad a = b + s*c over 3 x %s on %d "
      "threads, %s, alternated with the steps)\n",
      r.floor_seconds, bpp, gbps(r.triad_bytes_per_second), format_bytes(o.params * 4), r.threads,
      TriadBuffers::description());
  out << absl::StrFormat(
      "       %10.5f s = %d B x params / %.2f GB/s (median in-place pass x = x * k over the same "
      "buffers, 24 B per element: the step's own access shape on its state)\n",
      r.in_place_floor_seconds, bpp, gbps(r.in_place_bytes_per_second));
  const OffloadOptimizerStats& s = r.cpu.stats;
  out << absl::StrFormat(
      "step   %10.5f s   ratio to floor %.3f (to the in-place pass %.3f)   %s params/s   (states "
      "in the CPU tier; Adam kernels %.4f s, waiting for gradients %.4f s)\n",
      r.cpu.step_seconds, r.ratio_to_floor(), r.ratio_to_in_place_floor(),
      count_text(n / r.cpu.step_seconds), static_cast<double>(s.last_adam_ns) * 1e-9,
      static_cast<double>(s.last_step_wait_ns) * 1e-9);
  out << absl::StrFormat(
      "naive  %10.5f s   the step is %.1fx faster   (scalar textbook AdamW, one thread; %s)\n",
      r.naive_seconds, r.cpu.step_seconds > 0 ? r.naive_seconds / r.cpu.step_seconds : 0,
      r.naive_measured_params == o.params
          ? std::string("every parameter")
          : absl::StrFormat("measured on the first %s params in %.4f s, scaled",
                            count_text(static_cast<double>(r.naive_measured_params)),
                            r.naive_measured_seconds));
  if (r.nvme.has_value()) {
    const OptimizerNvme& v = *r.nvme;
    const OffloadOptimizerStats& ns = v.run.stats;
    const double bound = v.bound_seconds();
    out << absl::StrFormat(
        "nvme   %10.5f s   ratio to bound %s   (states on NVMe in %s, engine %s; NVMe wait %.4f s, "
        "Adam kernels %.4f s, peak staging chunks %d; read %s, wrote %s)\n",
        v.run.step_seconds,
        bound > 0 ? absl::StrFormat("%.3f", bound / v.run.step_seconds) : std::string("-"),
        absl::StrJoin(v.paths, ","), v.engine, static_cast<double>(ns.last_nvme_wait_ns) * 1e-9,
        static_cast<double>(ns.last_adam_ns) * 1e-9, ns.peak_staging_chunks,
        format_bytes(v.run.nvme_bytes_read), format_bytes(v.run.nvme_bytes_written));
    if (bound > 0) {
      out << absl::StrFormat(
          "bound  %10.5f s = %s / %.2f GB/s read + %s / %.2f GB/s written (raw io_uring over the "
          "same directories; %.5f s if the drive overlapped reads and writes fully)\n",
          bound, format_bytes(v.state_bytes), gbps(v.read_bytes_per_second),
          format_bytes(v.state_bytes), gbps(v.write_bytes_per_second),
          v.overlapped_bound_seconds());
    }
  }
  out << "\n";
  for (const std::string& note : r.notes) out << note << "\n";
  out << "ratio to floor = floor / step (1.0: at the memory-bandwidth floor); step = host time of "
         "OffloadOptimizer::step() with the gradients already landed; GB/s = 1e9 bytes/s.\n";
}

Json optimizer_json(const OptimizerReport& r) {
  const OptimizerOptions& o = r.options;
  Json doc = optimizer_fields_json(o, r.tensors, r.isa, r.threads);
  doc.update(
      Json{{"floor_seconds", seconds_json(r.floor_seconds)},
           {"triad_gbps", ratio_json(gbps(r.triad_bytes_per_second))},
           {"triad_bytes", r.triad_bytes},
           {"triad_bytes_per_element", o.params > 0 ? r.triad_bytes / o.params : 0},
           {"in_place_gbps", ratio_json(gbps(r.in_place_bytes_per_second))},
           {"in_place_floor_seconds", seconds_json(r.in_place_floor_seconds)},
           {"ratio_to_in_place_floor", ratio_json(r.ratio_to_in_place_floor())},
           {"step_seconds", seconds_json(r.cpu.step_seconds)},
           {"ratio_to_floor", ratio_json(r.ratio_to_floor())},
           {"params_per_second", json_fixed(static_cast<double>(o.params) / r.cpu.step_seconds, 0)},
           {"all_step_seconds", all_seconds_json(r.cpu)},
           {"stats", stats_json(r.cpu)},
           {"naive_seconds", seconds_json(r.naive_seconds)},
           {"naive_measured_params", r.naive_measured_params},
           {"naive_measured_seconds", seconds_json(r.naive_measured_seconds)}});
  if (r.nvme.has_value()) {
    const OptimizerNvme& v = *r.nvme;
    const double bound = v.bound_seconds();
    // The bound's figures, or null where the raw baseline could not run.
    auto bounded = [&](Json figure) { return bound > 0 ? figure : Json(); };
    doc["nvme"] =
        Json{{"bound_seconds", bounded(seconds_json(bound))},
             {"step_seconds", seconds_json(v.run.step_seconds)},
             {"ratio_to_bound", bounded(ratio_json(bound / v.run.step_seconds))},
             {"overlapped_bound_seconds", bounded(seconds_json(v.overlapped_bound_seconds()))},
             {"read_gbps", bounded(ratio_json(gbps(v.read_bytes_per_second)))},
             {"write_gbps", bounded(ratio_json(gbps(v.write_bytes_per_second)))},
             {"state_bytes", v.state_bytes},
             {"paths", v.paths},
             {"engine", v.engine},
             {"all_step_seconds", all_seconds_json(v.run)},
             {"stats", stats_json(v.run)}};
  }
  return doc;
}

}  // namespace strata::bench
