#include "json.h"

#include <absl/strings/str_format.h>

#include <cmath>
#include <cstdlib>

namespace strata {
namespace {

// The double nearest to what `text` (a printf conversion of a finite value) says.
Json parsed(const std::string& text) { return std::strtod(text.c_str(), nullptr); }

}  // namespace

Json json_fixed(double value, int digits) {
  if (!std::isfinite(value)) return nullptr;
  // No decimals: an integer, as "%.0f" wrote it (12345, not 12345.0), where int64 holds it.
  if (digits == 0 && std::abs(value) < 9e18) return std::llround(value);
  return parsed(absl::StrFormat("%.*f", digits, value));
}

Json json_significant(double value, int digits) {
  if (!std::isfinite(value)) return nullptr;
  return parsed(absl::StrFormat("%.*g", digits, value));
}

Json json_float(float value) {
  if (!std::isfinite(value)) return nullptr;
  for (int digits = 6; digits < 9; ++digits) {
    std::string text = absl::StrFormat("%.*g", digits, value);
    if (std::strtof(text.c_str(), nullptr) == value) return parsed(text);
  }
  return parsed(absl::StrFormat("%.9g", value));
}

Json json_fixed_list(const std::vector<double>& values, int digits) {
  Json list = Json::array();
  for (double v : values) list.push_back(json_fixed(v, digits));
  return list;
}

Json json_general_list(const std::vector<double>& values) {
  Json list = Json::array();
  for (double v : values) list.push_back(json_general(v));
  return list;
}

std::string json_line(const Json& document, int indent) {
  return document.dump(indent, ' ', false, Json::error_handler_t::replace);
}

}  // namespace strata
