// Byte sizes as users write them: in STRATA_* variables and in tools' flags.
//
// Accepted: a number with an optional unit, case-insensitive, optionally separated by spaces:
//   4096, 4096B, 512KiB, 64MiB, 40GiB, 1TiB, 1PiB   (binary units: 2^10, 2^20, ...)
//   2KB, 10MB, 1.5GB, 1TB, 1PB                      (decimal units: 10^3, 10^6, ...)
// Fractions are allowed and rounded to the nearest byte (halves round up): 1.5KiB = 1536 bytes.
// Bare K/M/G/T/P are rejected as ambiguous (is 1G 10^9 or 2^30 bytes?).
// Zero, negative and values of 2^64 bytes or more are errors.
//
// Error messages start with the quoted text ("'12XB' is not a size: ..."), never with a
// variable or flag name: callers prefix their own (STRATA_GPU_BYTES=, --bytes=).
#pragma once

#include <absl/status/statusor.h>

#include <cstdint>
#include <string>
#include <string_view>

#include "strata/base/format_bytes.h"

namespace strata {

// The accepted forms, for messages: "4096, 512KiB, 64MiB, 40GiB, 1.5GB".
inline constexpr std::string_view kSizeExamples = "4096, 512KiB, 64MiB, 40GiB, 1.5GB";

// Parses a positive byte count. InvalidArgument on every error.
absl::StatusOr<uint64_t> parse_size(std::string_view text);

// A size that is either absolute or a percentage of a total known only later (free device
// memory, physical memory, free disk space).
struct SizeSetting {
  uint64_t bytes = 0;  // used when !is_percent
  double percent = 0;  // in (0, 100], used when is_percent
  bool is_percent = false;

  static SizeSetting of_bytes(uint64_t b) { return {b, 0, false}; }
  static SizeSetting of_percent(double p) { return {0, p, true}; }

  // Bytes for this setting given `total` (floor of the percentage). `what` names the setting
  // in the error when a percentage of `total` comes to zero bytes or the setting is invalid.
  absl::StatusOr<uint64_t> resolve(uint64_t total, std::string_view what) const;

  // A form parse_size_setting accepts back: "80%", "12.5%", "1GiB", "1500MB", "4097".
  std::string to_string() const;

  friend bool operator==(const SizeSetting&, const SizeSetting&) = default;
};

// parse_size, plus "80%" / "12.5%" (0 < p <= 100) when allow_percent.
absl::StatusOr<SizeSetting> parse_size_setting(std::string_view text, bool allow_percent);

// Human-readable: "512 B", "4.00 KiB", "1.50 GiB".

}  // namespace strata
