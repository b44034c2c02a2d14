#include "strata/base/size.h"

#include <absl/numeric/int128.h>
#include <absl/status/status.h>
#include <absl/strings/ascii.h>
#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>

#include <array>
#include <cmath>
#include <limits>

#include "strata/base/text.h"

namespace strata {
namespace {

using namespace text;  // std::string_view helpers (Debian's Abseil has its own string_view)

constexpr uint64_t kKi = uint64_t{1} << 10;
constexpr uint64_t kK = 1000;

struct Unit {
  std::string_view name;  // lower case
  uint64_t multiplier;
};

constexpr std::array<Unit, 12> kUnits = {{
    {"", 1},
    {"b", 1},
    {"kib", kKi},
    {"mib", kKi* kKi},
    {"gib", kKi* kKi* kKi},
    {"tib", kKi* kKi* kKi* kKi},
    {"pib", kKi* kKi* kKi* kKi* kKi},
    {"kb", kK},
    {"mb", kK* kK},
    {"gb", kK* kK* kK},
    {"tb", kK* kK* kK* kK},
    {"pb", kK* kK* kK* kK* kK},
}};

// Ignored fraction digits beyond this are far below a byte even for PiB.
constexpr int kMaxFractionDigits = 18;

std::string accepted_forms(bool allow_percent) {
  return cat("use a byte count with an optional unit (", kSizeExamples, ")",
             allow_percent ? " or a percentage (80%)" : "");
}

absl::Status malformed(std::string_view text, std::string_view why, bool allow_percent) {
  return absl::InvalidArgumentError(
      cat("'", text, "' is not a size (", why, "): ", accepted_forms(allow_percent)));
}

// A decimal number "digits[.digits]" split into parts; `integer` saturates above 2^64.
struct Decimal {
  absl::uint128 integer = 0;
  bool integer_overflow = false;
  absl::uint128 fraction = 0;        // the kept fraction digits as an integer
  absl::uint128 fraction_scale = 1;  // 10^(kept fraction digits)
  size_t length = 0;                 // characters consumed
};

// Parses the number at the start of `text`; returns the reason on a syntax error.
absl::StatusOr<Decimal> parse_decimal(std::string_view text) {
  Decimal d;
  size_t i = 0;
  for (; i < text.size() && absl::ascii_isdigit(static_cast<unsigned char>(text[i])); ++i) {
    d.integer = d.integer * 10 + static_cast<uint64_t>(text[i] - '0');
    if (d.integer > std::numeric_limits<uint64_t>::max()) {
      d.integer_overflow = true;
      d.integer = std::numeric_limits<uint64_t>::max();
    }
  }
  if (i == 0) return absl::InvalidArgumentError("it does not start with a number");
  if (i < text.size() && text[i] == '.') {
    ++i;
    const size_t start = i;
    for (; i < text.size() && absl::ascii_isdigit(static_cast<unsigned char>(text[i])); ++i) {
      if (i - start < kMaxFractionDigits) {
        d.fraction = d.fraction * 10 + static_cast<uint64_t>(text[i] - '0');
        d.fraction_scale *= 10;
      }
    }
    if (i == start) return absl::InvalidArgumentError("a '.' must be followed by digits");
  }
  d.length = i;
  return d;
}

absl::StatusOr<uint64_t> parse_size_impl(std::string_view raw, bool allow_percent) {
  const std::string_view text = trim(raw);
  if (text.empty()) {
    return absl::InvalidArgumentError(cat("'", raw, "' is empty: ", accepted_forms(allow_percent)));
  }
  if (text.front() == '-') {
    return absl::InvalidArgumentError(
        cat("'", raw, "' is negative: sizes must be positive; ", accepted_forms(allow_percent)));
  }
  absl::StatusOr<Decimal> number = parse_decimal(text);
  if (!number.ok()) return malformed(raw, to_std(number.status().message()), allow_percent);

  const std::string unit_text = lower(ltrim(text.substr(number->length)));
  const Unit* unit = nullptr;
  for (const Unit& u : kUnits) {
    if (u.name == unit_text) unit = &u;
  }
  if (unit == nullptr) {
    if (unit_text.size() == 1 &&
        std::string_view("kmgtp").find(unit_text[0]) != std::string::npos) {
      const char upper = absl::ascii_toupper(static_cast<unsigned char>(unit_text[0]));
      return malformed(raw,
                       absl::StrFormat("unit '%c' is ambiguous: write %ciB for binary or %cB "
                                       "for decimal units",
                                       upper, upper, upper),
                       allow_percent);
    }
    return malformed(raw,
                     cat("unknown unit '", text.substr(number->length),
                         "'; units are B, KiB, MiB, GiB, TiB, PiB, KB, MB, GB, TB, PB"),
                     allow_percent);
  }

  const absl::uint128 limit = std::numeric_limits<uint64_t>::max();
  absl::uint128 bytes = 0;
  if (!number->integer_overflow) {
    // Integer part < 2^64 and multiplier <= 2^50: the product fits in 128 bits.
    bytes = number->integer * unit->multiplier;
    // Round the fractional bytes to nearest, halves up; fraction < 10^18, so no overflow.
    bytes +=
        (number->fraction * unit->multiplier + number->fraction_scale / 2) / number->fraction_scale;
  }
  if (number->integer_overflow || bytes > limit) {
    return absl::InvalidArgumentError(
        cat("'", raw, "' is too large: sizes must be below 2^64 bytes (16 EiB)"));
  }
  if (bytes == 0) {
    const bool rounded = number->integer != 0 || number->fraction != 0;
    return absl::InvalidArgumentError(cat("'", raw, rounded ? "' rounds to 0 bytes" : "' is zero",
                                          ": sizes must be positive; ",
                                          accepted_forms(allow_percent)));
  }
  return absl::Uint128Low64(bytes);
}

absl::Status check_percent(double percent, std::string_view shown) {
  if (!(percent > 0 && percent <= 100)) {  // also rejects NaN
    return absl::InvalidArgumentError(
        cat("'", shown, "' is out of range: a percentage must be above 0% and at most 100%"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<uint64_t> parse_size(std::string_view text) {
  return parse_size_impl(text, /*allow_percent=*/false);
}

absl::StatusOr<SizeSetting> parse_size_setting(std::string_view raw, bool allow_percent) {
  const std::string_view text = trim(raw);
  if (text.empty() || text.back() != '%') {
    absl::StatusOr<uint64_t> bytes = parse_size_impl(raw, allow_percent);
    if (!bytes.ok()) return bytes.status();
    return SizeSetting::of_bytes(*bytes);
  }
  if (!allow_percent) {
    return absl::InvalidArgumentError(cat("'", raw,
                                          "' is a percentage, which is not accepted "
                                          "here: ",
                                          accepted_forms(false)));
  }
  const std::string_view number_text = rtrim(text.substr(0, text.size() - 1));
  if (!number_text.empty() && number_text.front() == '-') {
    return absl::InvalidArgumentError(
        cat("'", raw, "' is negative: a percentage must be above 0% and at most 100%"));
  }
  // parse_decimal checks the syntax strictly (SimpleAtod would accept "1e2" or "inf").
  absl::StatusOr<Decimal> number = parse_decimal(number_text);
  if (!number.ok()) return malformed(raw, to_std(number.status().message()), true);
  if (number->length != number_text.size()) {
    return malformed(raw, "a percentage is a plain number followed by '%'", true);
  }
  double percent = 0;
  if (!absl::SimpleAtod(to_absl(number_text), &percent)) {
    return malformed(raw, "a percentage is a plain number followed by '%'", true);
  }
  if (absl::Status s = check_percent(percent, raw); !s.ok()) return s;
  return SizeSetting::of_percent(percent);
}

absl::StatusOr<uint64_t> SizeSetting::resolve(uint64_t total, std::string_view what) const {
  if (!is_percent) {
    if (bytes == 0) {
      return absl::InvalidArgumentError(
          cat(what, "=0 is zero: sizes must be positive; ", accepted_forms(true)));
    }
    return bytes;
  }
  if (absl::Status s = check_percent(percent, to_string()); !s.ok()) {
    return absl::InvalidArgumentError(cat(what, "=", s.message()));
  }
  uint64_t result = total;
  if (percent < 100) {
    const long double exact = static_cast<long double>(total) * percent / 100.0L;
    long double whole = std::floor(exact);
    // 33.3 is stored as 33.29999...: an integer within rounding error above counts as reached,
    // so 33.3% of 1000 bytes is 333 as the user expects.
    if (whole + 1 - exact <= std::min(exact * 2.5e-16L, 1e-3L)) whole += 1;
    result = std::min(total, static_cast<uint64_t>(whole));
  }
  if (result == 0) {
    return absl::InvalidArgumentError(cat(what, "=", to_string(), " of ", format_bytes(total),
                                          " comes to 0 bytes: use a larger percentage "
                                          "or a byte count"));
  }
  return result;
}

std::string SizeSetting::to_string() const {
  if (is_percent) return cat(percent, "%");
  if (bytes == 0) return "0";
  // The largest unit that divides exactly, binary first: round-trips through parse_size.
  for (size_t i = 6; i >= 2; --i) {
    if (bytes % kUnits[i].multiplier == 0) {
      return cat(bytes / kUnits[i].multiplier, upper(kUnits[i].name.substr(0, 1)), "iB");
    }
  }
  for (size_t i = 11; i >= 7; --i) {
    if (bytes % kUnits[i].multiplier == 0) {
      return cat(bytes / kUnits[i].multiplier, upper(kUnits[i].name));
    }
  }
  return cat(bytes);
}

}  // namespace strata
