// offload-bench's output: the human table and the JSON document.
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include "bench/common.h"
#include "json.h"
#include "strata/config/config.h"
#include "strata/device/device.h"

namespace strata::bench {

struct Report {
  std::vector<Row> rows;
  std::string engine;  // the I/O engine that ran (SwapStats) or the configured one
  std::string engine_reason;
  std::vector<std::string> nvme_paths;  // directories the NVMe paths used; empty: none ran
  std::vector<std::string> notes;       // footer lines: what each baseline is
};

void print_table(const Report& report, const Device& device, std::ostream& out);
// One header line, then one line per row: the JSON row fields, an empty field for a missing
// baseline.
std::string to_csv(const Report& report);
Json to_json(const Report& report, const ResolvedConfig& config, const Device& device);
// A workload's document: to_json's (without path rows) with the workload's results under `key`,
// its last key, as one line of text.
std::string document_with(Json document, const std::string& key, Json results);

}  // namespace strata::bench
