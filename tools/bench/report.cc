#include "bench/report.h"

#include <absl/strings/str_format.h>

#include <algorithm>
#include <optional>
#include <string>

#include "bench/link_check.h"
#include "bench/swap/gpu_paths.h"
#include "json.h"
#include "strata/base/size.h"
#include "strata/device/backend.h"

namespace strata::bench {
namespace {

Json staging_json(const std::optional<NvmeUse>& use) {
  if (!use.has_value()) return nullptr;
  return Json{{"bytes", use->bytes},
              {"chunk_bytes", use->chunk_bytes},
              {"peak_leases", use->peak_leases},
              {"peak_bytes", use->peak_bytes},
              {"waits", use->waits},
              {"wait_seconds", seconds_json(use->wait_seconds)}};
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

Json to_json(const Report& report, const ResolvedConfig& config, const Device& device) {
  Json results = Json::array();
  for (const Row& r : report.rows) {
    const bool has_baseline = r.baseline.has_value();
    // A figure of the baseline, or null when the row has none.
    auto baseline = [&](auto figure) { return has_baseline ? gbps_json(figure()) : Json(); };
    results.push_back(
        Json{{"path", r.path},
             {"tensor_bytes", r.tensor_bytes},
             {"total_bytes", r.total_bytes},
             {"repeats", r.repeats},
             {"gbps_median", gbps_json(r.runtime.median)},
             {"gbps_min", gbps_json(r.runtime.min)},
             {"gbps_max", gbps_json(r.runtime.max)},
             {"baseline_gbps", baseline([&] { return r.baseline->median; })},
             {"baseline_bytes", r.baseline_bytes},
             {"ratio", baseline([&] { return r.runtime.median / r.baseline->median; })},
             {"baseline_gbps_min", baseline([&] { return r.baseline->min; })},
             {"baseline_gbps_max", baseline([&] { return r.baseline->max; })},
             {"link", has_baseline ? Json(r.nvme_link ? "nvme" : "gpu") : Json()},
             {"link_gbps", baseline([&] { return std::max(r.link_gbps, r.baseline->max); })},
             {"link_rechecks", r.link_rechecks},
             {"link_limit_gbps", baseline([&] { return link_limit_gbps(r); })},
             {"staging", staging_json(r.nvme_use)},
             {"fetches_in_flight_peak",
              r.nvme_use.has_value() ? Json(r.nvme_use->fetches_in_flight_peak) : Json()}});
  }
  return Json{{"version", STRATA_VERSION},
              {"backend", to_string(config.backend)},
              {"device", device.description()},
              {"config",
               {{"gpu_bytes", config.gpu_bytes},
                {"cpu_bytes", config.cpu_bytes},
                {"io_engine", to_string(config.io_engine.kind)},
                {"engine", report.engine},
                {"engine_reason", report.engine_reason},
                {"io_block", config.io_block},
                {"io_depth", config.io_depth},
                {"verify", config.verify},
                {"nvme_paths", report.nvme_paths}}},
              {"results", std::move(results)}};
}

std::string document_with(Json document, const std::string& key, Json results) {
  document[key] = std::move(results);
  return json_line(document) + "\n";
}

std::string to_csv(const Report& report) {
  std::string out =
      "path,tensor_bytes,total_bytes,repeats,gbps_median,gbps_min,gbps_max,baseline_gbps,"
      "baseline_bytes,ratio\n";
  for (const Row& r : report.rows) {
    const bool base = r.baseline.has_value();
    out +=
        absl::StrFormat("%s,%d,%d,%d,%.3f,%.3f,%.3f,%s,%d,%s\n", r.path, r.tensor_bytes,
                        r.total_bytes, r.repeats, r.runtime.median, r.runtime.min, r.runtime.max,
                        base ? absl::StrFormat("%.3f", r.baseline->median) : "", r.baseline_bytes,
                        base ? absl::StrFormat("%.3f", r.runtime.median / r.baseline->median) : "");
  }
  return out;
}

}  // namespace strata::bench
