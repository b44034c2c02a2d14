#include "bench/json.h"

#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>
#include <absl/strings/str_join.h>

namespace strata::bench {

std::string json_strings(const std::vector<std::string>& items) {
  std::vector<std::string> quoted;
  quoted.reserve(items.size());
  for (const std::string& item : items) quoted.push_back(text::json_quote(item));
  return absl::StrCat("[", absl::StrJoin(quoted, ", "), "]");
}

std::string json_fixed(double value, int digits) { return absl::StrFormat("%.*f", digits, value); }

std::string json_general(double value) { return absl::StrFormat("%.6g", value); }

std::string json_fixed_list(const std::vector<double>& values, int digits) {
  std::vector<std::string> texts;
  texts.reserve(values.size());
  for (double v : values) texts.push_back(json_fixed(v, digits));
  return absl::StrCat("[", absl::StrJoin(texts, ", "), "]");
}

std::string json_general_list(const std::vector<double>& values) {
  std::vector<std::string> texts;
  texts.reserve(values.size());
  for (double v : values) texts.push_back(json_general(v));
  return absl::StrCat("[", absl::StrJoin(texts, ", "), "]");
}

}  // namespace strata::bench
