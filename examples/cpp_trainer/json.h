// A small JSON writer for cpp_trainer's --json report: one object, written field by field.
// Strings are quoted by the library's strata::text::json_quote.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "strata/base/text.h"

namespace cpp_trainer {

// A number as JSON: integers exactly, floating point with 9 significant digits (a float's
// round trip); NaN and infinities, which JSON lacks, as null.
std::string json_number(double v);
// A float in the fewest digits that read back as the same float (0.05, not 0.0500000007).
std::string json_number(float v);
std::string json_number(uint64_t v);

// Builds `{"key": value, ...}` in insertion order; values are JSON text.
class JsonObject {
 public:
  JsonObject& raw(std::string_view key, std::string value);
  JsonObject& add(std::string_view key, std::string_view value) {
    return raw(key, strata::text::json_quote(value));
  }
  JsonObject& add(std::string_view key, const char* value) {
    return raw(key, strata::text::json_quote(value));
  }
  JsonObject& add(std::string_view key, double value) { return raw(key, json_number(value)); }
  JsonObject& add(std::string_view key, float value) { return raw(key, json_number(value)); }
  JsonObject& add(std::string_view key, uint64_t value) { return raw(key, json_number(value)); }
  JsonObject& add(std::string_view key, bool value) { return raw(key, value ? "true" : "false"); }
  JsonObject& add(std::string_view key, const std::vector<float>& values);
  JsonObject& add(std::string_view key, const std::vector<double>& values);
  JsonObject& add(std::string_view key, const std::vector<uint64_t>& values);
  JsonObject& add(std::string_view key, const JsonObject& value) { return raw(key, value.str()); }
  // One line per field, indented by `indent` spaces per level (0: all on one line).
  std::string str(int indent = 0) const;

 private:
  std::vector<std::pair<std::string, std::string>> fields_;
};

}  // namespace cpp_trainer
