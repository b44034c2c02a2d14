#include "bench/report.h"

#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>
#include <absl/strings/str_join.h>

#include <algorithm>
#include <optional>
#include <string>

#include "bench/gpu_paths.h"
#include "bench/json.h"
#include "bench/link_check.h"
#include "strata/base/size.h"
#include "strata/device/backend.h"

namespace strata::bench {
namespace {

std::string staging_json(const std::optional<NvmeUse>& use) {
  if (!use.has_value()) return "null";
  return absl::StrFormat(
      R"({"bytes": %d, "chunk_bytes": %d, "peak_leases": %d, "peak_bytes": %d, "waits": %d, )"
      R"("wait_seconds": %s})",
      use->bytes, use->chunk_bytes, use->peak_leases, use->peak_bytes, use->waits,
      seconds_json(use->wait_seconds));
}

// The NVMe rows' use of the staging pool and the drives' queue, one line each.
void print_nvme_use(const Report& report, std::ostream& out) {
  bool header = false;
  for (const Row& r : report.rows) {
    if (!r.nvme_use.has_value()) continue;
    const NvmeUse& u = *r.nvme_use;
    if (!header) {
      out << absl::StrFormat(
          "staging (STRATA_STAGING_BYTES: %s, leases of up to %s) and NVMe reads over each "
          "row's runtime passes:\n",
          format_bytes(u.bytes), format_bytes(u.chunk_bytes));
      header = true;
    }
    out << absl::StrFormat(
        "  %-9s %10s  staging peak %s in %d lease(s), %d wait(s) (%.3f s); up to %d tensor(s)' "
        "reads in flight\n",
        r.path, format_bytes(r.tensor_bytes), format_bytes(u.peak_bytes), u.peak_leases, u.waits,
        u.wait_seconds, u.fetches_in_flight_peak);
  }
}

}  // namespace
void print_table(const Report& report, const Device& device, std::ostream& out) {
  const bool simulated = device.backend() == Backend::kHost;
  out << absl::StrFormat("\n%-9s %10s %10s %26s %9s %6s %15s\n", "path", "tensor", "total",
                         "runtime GB/s med (min-max)", "baseline", "ratio", "CPU s/GB rt/base");
  for (const Row& r : report.rows) {
    const bool base = r.baseline.has_value();
    out << absl::StrFormat(
        "%-9s %10s %10s %8.2f (%7.2f-%7.2f) %9s %6s %15s%s\n", r.path, format_bytes(r.tensor_bytes),
        format_bytes(r.total_bytes), r.runtime.median, r.runtime.min, r.runtime.max,
        base ? absl::StrFormat("%.2f", r.baseline->median) : "-",
        base ? absl::StrFormat("%.3f", r.runtime.median / r.baseline->median) : "-",
        absl::StrFormat("%.3f/%s", r.runtime.cpu_seconds_per_gb,
                        base ? absl::StrFormat("%.3f", r.baseline->cpu_seconds_per_gb) : "-"),
        simulated && is_gpu_path(r.path) ? "  (host-simulated GPU)" : "");
  }
  out << "\n";
  bool gpu_rows = false;
  for (const Row& r : report.rows) gpu_rows |= is_gpu_path(r.path);
  if (gpu_rows) {
    out << "gpu baseline: " << gpu_baseline_description(device) << "\n";
  }
  print_nvme_use(report, out);
  for (const std::string& note : report.notes) out << note << "\n";
  out << "Same bytes, same run; GB/s = 1e9 bytes/s; ratio = runtime median / baseline median; "
         "CPU s/GB counts every thread of the process.\n"
         "Checked: no runtime median above its link (the baseline's fastest pass) + the larger of "
         "its spread and 25% (200% for a drive); a figure above that fails the run.\n";
}

std::string to_json(const Report& report, const ResolvedConfig& config, const Device& device) {
  std::vector<std::string> results;
  for (const Row& r : report.rows) {
    const bool has_baseline = r.baseline.has_value();
    results.push_back(absl::StrFormat(
        R"({"path": %s, "tensor_bytes": %d, "total_bytes": %d, "repeats": %d, )"
        R"("gbps_median": %s, "gbps_min": %s, "gbps_max": %s, "baseline_gbps": %s, )"
        R"("baseline_bytes": %d, "ratio": %s, "baseline_gbps_min": %s, "baseline_gbps_max": %s, )"
        R"("link": %s, "link_gbps": %s, "link_rechecks": %d, "link_limit_gbps": %s, )"
        R"("staging": %s, "fetches_in_flight_peak": %s})",
        json_quote(r.path), r.tensor_bytes, r.total_bytes, r.repeats, gbps_json(r.runtime.median),
        gbps_json(r.runtime.min), gbps_json(r.runtime.max),
        has_baseline ? gbps_json(r.baseline->median) : "null", r.baseline_bytes,
        has_baseline ? gbps_json(r.runtime.median / r.baseline->median) : "null",
        has_baseline ? gbps_json(r.baseline->min) : "null",
        has_baseline ? gbps_json(r.baseline->max) : "null",
        has_baseline ? json_quote(r.nvme_link ? "nvme" : "gpu") : "null",
        has_baseline ? gbps_json(std::max(r.link_gbps, r.baseline->max)) : "null", r.link_rechecks,
        has_baseline ? gbps_json(link_limit_gbps(r)) : "null", staging_json(r.nvme_use),
        r.nvme_use.has_value() ? absl::StrCat(r.nvme_use->fetches_in_flight_peak) : "null"));
  }
  std::vector<std::string> paths;
  for (const std::string& path : report.nvme_paths) paths.push_back(json_quote(path));
  return absl::StrFormat(
      R"({"version": %s, "backend": %s, "device": %s, "config": {"gpu_bytes": %d, )"
      R"("cpu_bytes": %d, "io_engine": %s, "engine": %s, "engine_reason": %s, )"
      R"("io_block": %d, "io_depth": %d, "verify": %s, "nvme_paths": [%s]}, "results": [%s]})",
      json_quote(STRATA_VERSION), json_quote(to_string(config.backend)),
      json_quote(device.description()), config.gpu_bytes, config.cpu_bytes,
      json_quote(to_string(config.io_engine.kind)), json_quote(report.engine),
      json_quote(report.engine_reason), config.io_block, config.io_depth, json_bool(config.verify),
      absl::StrJoin(paths, ", "), absl::StrJoin(results, ", "));
}

std::string to_csv(const Report& report) {
  std::string out =
      "path,tensor_bytes,total_bytes,repeats,gbps_median,gbps_min,gbps_max,baseline_gbps,"
      "baseline_bytes,ratio\n";
  for (const Row& r : report.rows) {
    const bool base = r.baseline.has_value();
    out += absl::StrFormat("%s,%d,%d,%d,%.3f,%.3f,%.3f,%s,%d,%s\n", r.path, r.tensor_bytes,
                           r.total_bytes, r.repeats, r.runtime.median, r.runtime.min, r.runtime.max,
                           base ? gbps_json(r.baseline->median) : "", r.baseline_bytes,
                           base ? gbps_json(r.runtime.median / r.baseline->median) : "");
  }
  return out;
}

}  // namespace strata::bench
