#include "strata/base/size.h"

#include <absl/strings/str_format.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <limits>
#include <string>

namespace strata {
namespace {

uint64_t size_of(std::string_view text) {
  absl::StatusOr<uint64_t> parsed = parse_size(text);
  INFO(text << ": " << parsed.status().ToString());
  REQUIRE(parsed.ok());
  return *parsed;
}

std::string error_of(std::string_view text) {
  absl::StatusOr<uint64_t> parsed = parse_size(text);
  INFO(text);
  REQUIRE_FALSE(parsed.ok());
  CHECK(parsed.status().code() == absl::StatusCode::kInvalidArgument);
  return std::string(parsed.status().message());
}

constexpr uint64_t kKiB = 1024;
constexpr uint64_t kMiB = kKiB * 1024;
constexpr uint64_t kGiB = kMiB * 1024;
constexpr uint64_t kTiB = kGiB * 1024;

TEST_CASE("parse_size: plain byte counts and binary units", "[size]") {
  CHECK(size_of("4096") == 4096);
  CHECK(size_of("1") == 1);
  CHECK(size_of("4096B") == 4096);
  CHECK(size_of("512KiB") == 512 * kKiB);
  CHECK(size_of("64MiB") == 64 * kMiB);
  CHECK(size_of("40GiB") == 40 * kGiB);
  CHECK(size_of("1TiB") == kTiB);
  CHECK(size_of("2PiB") == 2 * kTiB * 1024);
  CHECK(size_of("18446744073709551615") == std::numeric_limits<uint64_t>::max());
}

TEST_CASE("parse_size: decimal units", "[size]") {
  CHECK(size_of("2KB") == 2000);
  CHECK(size_of("10MB") == 10'000'000);
  CHECK(size_of("1.5GB") == 1'500'000'000);
  CHECK(size_of("3TB") == 3'000'000'000'000);
  CHECK(size_of("1PB") == 1'000'000'000'000'000);
}

TEST_CASE("parse_size: units are case-insensitive, spaces are allowed", "[size]") {
  CHECK(size_of("64mib") == 64 * kMiB);
  CHECK(size_of("64MIB") == 64 * kMiB);
  CHECK(size_of("1gb") == 1'000'000'000);
  CHECK(size_of("100b") == 100);
  CHECK(size_of("64 MiB") == 64 * kMiB);
  CHECK(size_of("  8GiB  ") == 8 * kGiB);
  CHECK(size_of("1\t KiB") == kKiB);
}

TEST_CASE("parse_size: fractions round to the nearest byte", "[size]") {
  CHECK(size_of("1.5KiB") == 1536);
  CHECK(size_of("0.5MiB") == 512 * kKiB);
  CHECK(size_of("1.25GiB") == kGiB + kGiB / 4);
  CHECK(size_of("1.0001KB") == 1000);  // 1000.1 → 1000
  CHECK(size_of("1.0005KB") == 1001);  // 1000.5 → 1001 (halves round up)
  CHECK(size_of("1.4") == 1);
  CHECK(size_of("2.5") == 3);
  CHECK(size_of("0.001KiB") == 1);  // 1.024 → 1
  // Fraction digits far past a byte's precision are accepted.
  CHECK(size_of("1.000000000000000000000001GiB") == kGiB);
}

TEST_CASE("parse_size: malformed text names the text and the accepted forms", "[size]") {
  for (std::string_view bad : {"12XB", "abc", "1..5GB", "1.GB", ".5GB", "GiB", "1.5.5GB", "1 2",
                               "+5GiB", "5GiB!", "0x10", "1e9", "5 Gi B", "１GB"}) {
    const std::string message = error_of(bad);
    INFO(message);
    // Not "'" + std::string(bad) + "'": GCC 12 at -O3 reports a false -Werror=restrict in it.
    const std::string quoted = absl::StrFormat("'%s'", bad);
    CHECK(message.find(quoted) == 0);
    CHECK(message.find("is not a size") != std::string::npos);
    CHECK(message.find("4096, 512KiB, 64MiB, 40GiB, 1.5GB") != std::string::npos);
    // Callers add their own name; the parser must not assume an environment variable.
    CHECK(message.find("STRATA_") == std::string::npos);
    CHECK(message.find("%") == std::string::npos);
  }
  CHECK(error_of("12XB").find("unknown unit 'XB'") != std::string::npos);
  CHECK(error_of("1..5GB").find("'.' must be followed by digits") != std::string::npos);
  CHECK(error_of("abc").find("does not start with a number") != std::string::npos);
}

TEST_CASE("parse_size: bare K/M/G/T/P are rejected as ambiguous", "[size]") {
  for (std::string_view bad : {"1G", "4k", "10M", "2T", "1p"}) {
    const std::string message = error_of(bad);
    INFO(message);
    CHECK(message.find("ambiguous") != std::string::npos);
  }
  CHECK(error_of("1G").find("GiB for binary or GB for decimal") != std::string::npos);
}

TEST_CASE("parse_size: empty, negative, zero and overflow", "[size]") {
  CHECK(error_of("").find("'' is empty") == 0);
  CHECK(error_of("   ").find("is empty") != std::string::npos);
  CHECK(error_of("-5GiB").find("'-5GiB' is negative: sizes must be positive") == 0);
  CHECK(error_of("-1").find("negative") != std::string::npos);
  CHECK(error_of("0").find("'0' is zero: sizes must be positive") == 0);
  CHECK(error_of("0GiB").find("is zero") != std::string::npos);
  CHECK(error_of("0.0MiB").find("is zero") != std::string::npos);
  CHECK(error_of("0.4").find("'0.4' rounds to 0 bytes") == 0);
  for (std::string_view huge : {"99999999TiB", "18446744073709551616", "16384PiB",
                                "99999999999999999999999999999999999999999999"}) {
    const std::string message = error_of(huge);
    INFO(message);
    CHECK(message.find("is too large: sizes must be below 2^64 bytes") != std::string::npos);
    CHECK(message.find(std::string(huge)) != std::string::npos);
  }
  // Just below the limit works: 16383 PiB.
  CHECK(size_of("16383PiB") == 16383 * kTiB * 1024);
}

TEST_CASE("parse_size_setting: percentages", "[size]") {
  absl::StatusOr<SizeSetting> s = parse_size_setting("80%", true);
  REQUIRE(s.ok());
  CHECK(s->is_percent);
  CHECK(s->percent == 80);
  s = parse_size_setting(" 12.5 % ", true);
  REQUIRE(s.ok());
  CHECK(s->percent == 12.5);
  s = parse_size_setting("100%", true);
  REQUIRE(s.ok());
  CHECK(s->percent == 100);
  s = parse_size_setting("64MiB", true);
  REQUIRE(s.ok());
  CHECK_FALSE(s->is_percent);
  CHECK(s->bytes == 64 * kMiB);
}

TEST_CASE("parse_size_setting: percentage errors", "[size]") {
  const auto error = [](std::string_view text, bool allow) {
    absl::StatusOr<SizeSetting> s = parse_size_setting(text, allow);
    INFO(text);
    REQUIRE_FALSE(s.ok());
    CHECK(s.status().code() == absl::StatusCode::kInvalidArgument);
    return std::string(s.status().message());
  };
  CHECK(error("0%", true).find("'0%' is out of range") == 0);
  CHECK(error("0.0%", true).find("out of range") != std::string::npos);
  CHECK(error("100.5%", true).find("at most 100%") != std::string::npos);
  CHECK(error("150%", true).find("out of range") != std::string::npos);
  CHECK(error("-5%", true).find("'-5%' is negative") == 0);
  CHECK(error("%", true).find("is not a size") != std::string::npos);
  CHECK(error("80%%", true).find("is not a size") != std::string::npos);
  CHECK(error("1e2%", true).find("is not a size") != std::string::npos);
  CHECK(error("5GiB%", true).find("is not a size") != std::string::npos);
  CHECK(error("12XB", true).find("or a percentage (80%)") != std::string::npos);
  const std::string refused = error("80%", false);
  CHECK(refused.find("'80%' is a percentage, which is not accepted here") == 0);
  CHECK(refused.find("or a percentage") == std::string::npos);
  CHECK(error("12XB", false).find("percentage") == std::string::npos);
}

TEST_CASE("SizeSetting::resolve", "[size]") {
  CHECK(*SizeSetting::of_bytes(4096).resolve(1, "X") == 4096);  // totals bound only percentages
  CHECK(*SizeSetting::of_percent(25).resolve(1000, "X") == 250);
  CHECK(*SizeSetting::of_percent(33.3).resolve(1000, "X") == 333);  // floor
  CHECK(*SizeSetting::of_percent(100).resolve(std::numeric_limits<uint64_t>::max(), "X") ==
        std::numeric_limits<uint64_t>::max());
  CHECK(*SizeSetting::of_percent(50).resolve(std::numeric_limits<uint64_t>::max(), "X") ==
        std::numeric_limits<uint64_t>::max() / 2);

  absl::StatusOr<uint64_t> r = SizeSetting::of_percent(1).resolve(50, "STRATA_CPU_BYTES");
  REQUIRE_FALSE(r.ok());
  CHECK(std::string(r.status().message()).find("STRATA_CPU_BYTES=1% of 50 B comes to 0 bytes") ==
        0);
  r = SizeSetting::of_bytes(0).resolve(100, "STRATA_GPU_BYTES");
  REQUIRE_FALSE(r.ok());
  CHECK(std::string(r.status().message()).find("STRATA_GPU_BYTES=0 is zero") == 0);
  // Values set from C++ bypass the parser and are checked here.
  r = SizeSetting::of_percent(120).resolve(100, "STRATA_GPU_BYTES");
  REQUIRE_FALSE(r.ok());
  CHECK(std::string(r.status().message()).find("STRATA_GPU_BYTES='120%' is out of range") == 0);
  r = SizeSetting::of_percent(std::numeric_limits<double>::quiet_NaN()).resolve(100, "X");
  CHECK_FALSE(r.ok());
}

TEST_CASE("SizeSetting::to_string round-trips through parse_size_setting", "[size]") {
  CHECK(SizeSetting::of_percent(80).to_string() == "80%");
  CHECK(SizeSetting::of_percent(12.5).to_string() == "12.5%");
  CHECK(SizeSetting::of_bytes(kGiB).to_string() == "1GiB");
  CHECK(SizeSetting::of_bytes(1536 * kMiB).to_string() == "1536MiB");
  CHECK(SizeSetting::of_bytes(1'500'000'000).to_string() == "1500MB");
  CHECK(SizeSetting::of_bytes(4097).to_string() == "4097");
  CHECK(SizeSetting::of_bytes(0).to_string() == "0");
  for (uint64_t bytes : {uint64_t{1}, uint64_t{1000}, uint64_t{4096}, 3 * kTiB, uint64_t{123456789},
                         std::numeric_limits<uint64_t>::max()}) {
    const SizeSetting setting = SizeSetting::of_bytes(bytes);
    absl::StatusOr<SizeSetting> back = parse_size_setting(setting.to_string(), false);
    INFO(setting.to_string());
    REQUIRE(back.ok());
    CHECK(*back == setting);
  }
}

TEST_CASE("format_bytes", "[size]") {
  CHECK(format_bytes(0) == "0 B");
  CHECK(format_bytes(1023) == "1023 B");
  CHECK(format_bytes(1024) == "1.00 KiB");
  CHECK(format_bytes(1536 * kMiB) == "1.50 GiB");
  CHECK(format_bytes(40 * kGiB) == "40.00 GiB");
  CHECK(format_bytes(kTiB) == "1.00 TiB");
  CHECK(format_bytes(std::numeric_limits<uint64_t>::max()) == "16.00 EiB");
}

}  // namespace
}  // namespace strata
