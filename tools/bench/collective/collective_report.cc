// offload-bench --workload=collective's output: the table and the "collective" JSON object.
#include <absl/strings/str_format.h>

#include "bench/collective/collective_workload.h"
#include "bench/common.h"
#include "json.h"
#include "strata/base/size.h"

namespace strata::bench {
void print_collective_header(const CollectiveReport& report, std::ostream& out) {
  out << absl::StrFormat("\n%d rank(s), %s; time: median of %d samples, slowest rank\n",
                         report.ranks, report.backend, report.repeat);
  out << absl::StrFormat("%-15s %10s %6s %11s %8s %8s %11s %11s %6s\n", "op", "size", "calls",
                         "time us", "algbw", "busbw", "base time", "base busbw", "ratio");
}

void print_collective_row(const CollectiveRow& r, std::ostream& out) {
  out << absl::StrFormat("%-15s %10s %6d %11.1f %8.3f %8.3f %11.1f %11.3f %6.3f\n", r.op,
                         format_bytes(r.bytes), r.calls_per_sample, r.time_s * 1e6, r.algbw_gbps,
                         r.busbw_gbps, r.baseline_time_s * 1e6, r.baseline_busbw_gbps, r.ratio);
}

void print_collective_footer(const CollectiveReport& report, std::ostream& out) {
  out << "\nbaseline: " << report.baseline << "\n"
      << "size: all_gather the gathered output, reduce_scatter the full input, all_reduce and "
         "broadcast the buffer (float32, equal shards, in place); GB/s = 1e9 bytes/s; busbw = "
         "algbw x (n-1)/n (all_gather, reduce_scatter), 2(n-1)/n (all_reduce), 1 (broadcast); "
         "ratio = baseline time / strata time.\n";
}

Json collective_json(const CollectiveReport& report) {
  Json rows = Json::array();
  for (const CollectiveRow& r : report.rows) {
    rows.push_back(Json{{"op", r.op},
                        {"bytes", r.bytes},
                        {"calls_per_sample", r.calls_per_sample},
                        {"time_s", json_general(r.time_s)},
                        {"algbw_gbps", json_general(r.algbw_gbps)},
                        {"busbw_gbps", json_general(r.busbw_gbps)},
                        {"baseline_time_s", json_general(r.baseline_time_s)},
                        {"baseline_algbw_gbps", json_general(r.baseline_algbw_gbps)},
                        {"baseline_busbw_gbps", json_general(r.baseline_busbw_gbps)},
                        {"ratio", json_general(r.ratio)},
                        {"samples_s", json_general_list(r.samples_s)},
                        {"baseline_samples_s", json_general_list(r.baseline_samples_s)}});
  }
  return Json{{"backend", report.backend},
              {"ranks", report.ranks},
              {"description", report.description},
              {"baseline", report.baseline},
              {"repeat", report.repeat},
              {"warmups", report.warmups},
              {"time", "median over samples of the slowest rank's time"},
              {"rows", std::move(rows)}};
}

}  // namespace strata::bench
