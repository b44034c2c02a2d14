// The optimizer workload's output: the human lines and the "optimizer" JSON object.
#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>
#include <absl/strings/str_join.h>

#include "bench/json.h"
#include "bench/optimizer_baselines.h"
#include "bench/optimizer_workload.h"
#include "strata/base/size.h"

namespace strata::bench {
namespace {

std::string stats_json(const OptimizerStepRun& run) {
  const OffloadOptimizerStats& s = run.stats;
  return absl::StrFormat(
      R"({"last_step_ns": %d, "last_step_wait_ns": %d, "last_adam_ns": %d, )"
      R"("last_nvme_wait_ns": %d, "peak_staging_chunks": %d, "chunk_elements": %d, "chunks": %d, )"
      R"("nvme_bytes_read": %d, "nvme_bytes_written": %d})",
      s.last_step_ns, s.last_step_wait_ns, s.last_adam_ns, s.last_nvme_wait_ns,
      s.peak_staging_chunks, s.chunk_elements, s.chunks, run.nvme_bytes_read,
      run.nvme_bytes_written);
}

std::string all_seconds_json(const OptimizerStepRun& run) {
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

std::string optimizer_stats_json(const OptimizerStepRun& run) { return stats_json(run); }
std::string optimizer_all_seconds_json(const OptimizerStepRun& run) {
  return all_seconds_json(run);
}

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

std::string optimizer_json(const OptimizerReport& r) {
  const OptimizerOptions& o = r.options;
  std::string nvme = "null";
  if (r.nvme.has_value()) {
    const OptimizerNvme& v = *r.nvme;
    const double bound = v.bound_seconds();
    const bool has_bound = bound > 0;
    nvme = absl::StrFormat(
        R"({"bound_seconds": %s, "step_seconds": %s, "ratio_to_bound": %s, )"
        R"("overlapped_bound_seconds": %s, "read_gbps": %s, )"
        R"("write_gbps": %s, "state_bytes": %d, "paths": %s, "engine": "%s", )"
        R"("all_step_seconds": %s, "stats": %s})",
        has_bound ? seconds_json(bound) : "null", seconds_json(v.run.step_seconds),
        has_bound ? ratio_json(bound / v.run.step_seconds) : "null",
        has_bound ? seconds_json(v.overlapped_bound_seconds()) : "null",
        has_bound ? ratio_json(gbps(v.read_bytes_per_second)) : "null",
        has_bound ? ratio_json(gbps(v.write_bytes_per_second)) : "null", v.state_bytes,
        json_strings(v.paths), v.engine, all_seconds_json(v.run), stats_json(v.run));
  }
  return absl::StrFormat(
      R"({"params": %d, "dtype": "%s", "bytes_per_param": %d, "tensors": %d, "repeat": %d, )"
      R"("isa": "%s", "threads": %d, "floor_seconds": %s, "triad_gbps": %s, "triad_bytes": %d, )"
      R"("triad_bytes_per_element": %d, "in_place_gbps": %s, "in_place_floor_seconds": %s, )"
      R"("ratio_to_in_place_floor": %s, )"
      R"("step_seconds": %s, "ratio_to_floor": %s, "params_per_second": %s, )"
      R"("all_step_seconds": %s, "stats": %s, "naive_seconds": %s, "naive_measured_params": %d, )"
      R"("naive_measured_seconds": %s%s})",
      o.params, o.dtype, bytes_per_param(o.dtype), r.tensors, o.repeat, r.isa, r.threads,
      seconds_json(r.floor_seconds), ratio_json(gbps(r.triad_bytes_per_second)), r.triad_bytes,
      o.params > 0 ? r.triad_bytes / o.params : 0, ratio_json(gbps(r.in_place_bytes_per_second)),
      seconds_json(r.in_place_floor_seconds), ratio_json(r.ratio_to_in_place_floor()),
      seconds_json(r.cpu.step_seconds), ratio_json(r.ratio_to_floor()),
      absl::StrFormat("%.0f", static_cast<double>(o.params) / r.cpu.step_seconds),
      all_seconds_json(r.cpu), stats_json(r.cpu), seconds_json(r.naive_seconds),
      r.naive_measured_params, seconds_json(r.naive_measured_seconds),
      r.nvme.has_value() ? ", \"nvme\": " + nvme : std::string());
}

}  // namespace strata::bench
