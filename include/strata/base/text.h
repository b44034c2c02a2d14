// String helpers that take std::string_view (configuration, reports).
//
// Debian's Abseil is built with its own absl::string_view (ABSL_OPTION_USE_STD_STRING_VIEW 0),
// so absl::StrCat, StripAsciiWhitespace, SimpleAtoi, ... do not accept std::string_view.
#pragma once

#include <absl/strings/ascii.h>
#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/string_view.h>

#include <cstddef>
#include <limits>
#include <string>
#include <string_view>
#include <type_traits>

namespace strata::text {

inline absl::string_view to_absl(std::string_view s) { return {s.data(), s.size()}; }
inline std::string_view to_std(absl::string_view s) { return {s.data(), s.size()}; }

template <typename T>
void append(std::string& out, const T& value) {
  if constexpr (std::is_same_v<T, bool>) {
    out += value ? "true" : "false";
  } else if constexpr (std::is_arithmetic_v<T>) {
    out += absl::StrCat(value);
  } else if constexpr (std::is_convertible_v<const T&, std::string_view>) {
    out += std::string_view(value);
  } else {  // absl::string_view
    out += to_std(value);
  }
}

// absl::StrCat that also takes std::string_view.
template <typename... Args>
std::string cat(const Args&... args) {
  std::string out;
  (append(out, args), ...);
  return out;
}

inline std::string_view trim(std::string_view s) {
  return to_std(absl::StripAsciiWhitespace(to_absl(s)));
}

inline std::string_view ltrim(std::string_view s) {
  return to_std(absl::StripLeadingAsciiWhitespace(to_absl(s)));
}
inline std::string_view rtrim(std::string_view s) {
  return to_std(absl::StripTrailingAsciiWhitespace(to_absl(s)));
}

inline std::string lower(std::string_view s) { return absl::AsciiStrToLower(to_absl(s)); }
inline std::string upper(std::string_view s) { return absl::AsciiStrToUpper(to_absl(s)); }

template <typename Range>
std::string join(const Range& items, std::string_view separator) {
  std::string out;
  bool first = true;
  for (const auto& item : items) {
    if (!first) out += separator;
    first = false;
    append(out, item);
  }
  return out;
}

// Edits from a to b (optimal string alignment: insertions, deletions, substitutions and swaps of
// two adjacent characters, each one edit): how far a typo is from what was meant.
size_t edit_distance(std::string_view a, std::string_view b);

// "Did you mean": the candidate nearest to `name` by edit_distance, the first of equals; name
// empty and distance max() when there are no candidates. The name views the candidate.
struct Nearest {
  std::string_view name;
  size_t distance = std::numeric_limits<size_t>::max();
};
template <typename Range>
Nearest nearest(std::string_view name, const Range& candidates) {
  Nearest best;
  for (const auto& candidate : candidates) {
    const std::string_view c = candidate;
    const size_t d = edit_distance(name, c);
    if (d < best.distance) best = Nearest{c, d};
  }
  return best;
}

}  // namespace strata::text
