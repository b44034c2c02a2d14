#include "json.h"

#include <absl/strings/str_format.h>

#include <cmath>
#include <cstdlib>

namespace cpp_trainer {

std::string json_number(double v) {
  if (!std::isfinite(v)) return "null";
  return absl::StrFormat("%.9g", v);
}

std::string json_number(float v) {
  if (!std::isfinite(v)) return "null";
  for (int digits = 6; digits < 9; ++digits) {
    std::string text = absl::StrFormat("%.*g", digits, v);
    if (std::strtof(text.c_str(), nullptr) == v) return text;
  }
  return absl::StrFormat("%.9g", v);
}

std::string json_number(uint64_t v) { return absl::StrFormat("%d", v); }

JsonObject& JsonObject::raw(std::string_view key, std::string value) {
  fields_.emplace_back(strata::text::json_quote(key), std::move(value));
  return *this;
}

namespace {
template <typename T>
std::string json_array(const std::vector<T>& values) {
  std::string array = "[";
  for (size_t i = 0; i < values.size(); ++i) {
    if (i > 0) array += ", ";
    array += json_number(values[i]);
  }
  return array + "]";
}
}  // namespace

JsonObject& JsonObject::add(std::string_view key, const std::vector<float>& values) {
  return raw(key, json_array(values));
}
JsonObject& JsonObject::add(std::string_view key, const std::vector<double>& values) {
  return raw(key, json_array(values));
}
JsonObject& JsonObject::add(std::string_view key, const std::vector<uint64_t>& values) {
  return raw(key, json_array(values));
}

std::string JsonObject::str(int indent) const {
  if (fields_.empty()) return "{}";
  const std::string pad(static_cast<size_t>(indent), ' ');
  const char* sep = indent > 0 ? ",\n" : ", ";
  std::string out = indent > 0 ? "{\n" : "{";
  for (size_t i = 0; i < fields_.size(); ++i) {
    if (i > 0) out += sep;
    out += pad + fields_[i].first + ": " + fields_[i].second;
  }
  return out + (indent > 0 ? "\n}" : "}");
}

}  // namespace cpp_trainer
