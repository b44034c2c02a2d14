// The JSON pieces every offload-bench workload writes, in one place: strings (escaped by
// strata::text::json_quote, re-exported here), numbers
// at the precision each kind of figure needs, lists and booleans. Each workload's report builds
// its document from these, so a fix to the escaping or a format lands once.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "strata/base/text.h"

namespace strata::bench {

using text::json_quote;
// ["a", "b"]: each item a json_quote.
std::string json_strings(const std::vector<std::string>& items);

// A number with `digits` decimals ("%.*f").
std::string json_fixed(double value, int digits);
// The precisions the documents use: GB/s of the path rows (3 decimals); seconds (6: steps last
// tens of ms); ratios and fractions (4: 1.02 against 1.10 is the point of a workload); and
// figures that span many magnitudes (collective times and rates: 6 significant digits).
inline std::string gbps_json(double value) { return json_fixed(value, 3); }
inline std::string seconds_json(double value) { return json_fixed(value, 6); }
inline std::string ratio_json(double value) { return json_fixed(value, 4); }
std::string json_general(double value);  // "%.6g"

// [v, ...] with each value at `digits` decimals, or in json_general's form.
std::string json_fixed_list(const std::vector<double>& values, int digits);
inline std::string seconds_list_json(const std::vector<double>& values) {
  return json_fixed_list(values, 6);
}
std::string json_general_list(const std::vector<double>& values);

inline const char* json_bool(bool value) { return value ? "true" : "false"; }

}  // namespace strata::bench
