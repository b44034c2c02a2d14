// The JSON the tools and examples write (offload-bench's documents, strata-info --json,
// arena-replay --json, cpp_trainer --json): documents are nlohmann::ordered_json (keys stay in the
// order written, the order the docs show), and figures are rounded here to the precision each
// kind needs, so that a document says no more digits than were measured.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace strata {

using Json = nlohmann::ordered_json;

// `value` rounded to `digits` decimals (the number "%.*f" writes; with 0 digits an integer);
// null when not finite: JSON has no NaN or infinity, and the readers (Python's json with
// allow_nan=False) refuse them.
Json json_fixed(double value, int digits);
// `value` to `digits` significant digits (the number "%.*g" writes); null when not finite.
Json json_significant(double value, int digits);
// A float in the fewest digits that read back as the same float (0.05, not 0.0500000007);
// null when not finite.
Json json_float(float value);

// The precisions offload-bench's documents use: GB/s of the path rows (3 decimals); seconds (6:
// steps last tens of ms); ratios and fractions (4: 1.02 against 1.10 is the point of a
// workload); and figures that span many magnitudes (collective times and rates: 6 significant
// digits).
inline Json gbps_json(double value) { return json_fixed(value, 3); }
inline Json seconds_json(double value) { return json_fixed(value, 6); }
inline Json ratio_json(double value) { return json_fixed(value, 4); }
inline Json json_general(double value) { return json_significant(value, 6); }

// [v, ...] with each value at `digits` decimals, or in json_general's form.
Json json_fixed_list(const std::vector<double>& values, int digits);
inline Json seconds_list_json(const std::vector<double>& values) {
  return json_fixed_list(values, 6);
}
Json json_general_list(const std::vector<double>& values);

// One document as one line of text (`indent` > 0: one line per value, indented so). Strings
// that are not UTF-8 (a path, a device's name) are written with U+FFFD in place of their bad
// bytes rather than failing the run.
std::string json_line(const Json& document, int indent = -1);

}  // namespace strata
