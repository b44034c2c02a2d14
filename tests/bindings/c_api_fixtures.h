// Shared by the C API tests (c_api_*_test.cc): a hermetic host-backend runtime, error checks,
// byte patterns, and reading and writing a tensor through one tier.
#pragma once

#include <catch2/catch.hpp>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "strata/strata.h"

namespace strata::testing {

inline constexpr uint64_t kKiB = 1024;

using Vars = std::vector<std::pair<std::string, std::string>>;

// Checks a failing call: its code, and that strata_last_error() starts with `text` (the
// function's name and the problem) on this thread.
inline void expect_error(strata_status_t got, strata_status_t want, const std::string& text) {
  INFO("expected " << strata_status_name(want) << " \"" << text << "\"; got "
                   << strata_status_name(got) << " \"" << strata_last_error() << "\"");
  CHECK(got == want);
  CHECK(std::string(strata_last_error()).rfind(text, 0) == 0);
}

#define REQUIRE_OK(call)                                                                     \
  do {                                                                                       \
    const strata_status_t strata_status_ = (call);                                           \
    INFO(#call << ": " << strata_status_name(strata_status_) << " " << strata_last_error()); \
    REQUIRE(strata_status_ == STRATA_OK);                                                    \
  } while (false)

// A small host-backend runtime, hermetic: settings override (or unset) the environment.
inline strata_status_t make_runtime(const Vars& extra, strata_runtime_t** out) {
  std::map<std::string, std::string> vars = {
      {"STRATA_BACKEND", "host"}, {"STRATA_GPU_BYTES", "1MiB"}, {"STRATA_CPU_BYTES", "4MiB"}};
  for (const auto& [name, value] : extra) vars[name] = value;
  std::vector<strata_setting_t> settings;
  for (const auto& [name, value] : vars) settings.push_back({name.c_str(), value.c_str()});
  if (vars.count("STRATA_NVME_PATHS") == 0) settings.push_back({"STRATA_NVME_PATHS", nullptr});
  return strata_runtime_create(settings.data(), settings.size(), out);
}

inline Vars nvme_vars(const std::string& dir) {
  return {{"STRATA_NVME_PATHS", dir},
          {"STRATA_NVME_BYTES", "16MiB"},
          {"STRATA_IO_BLOCK", "64KiB"},
          {"STRATA_STAGING_BYTES", "1MiB"}};
}

// Owns a runtime for a test; destroyed at the end unless the test did it.
struct TestRuntime {
  explicit TestRuntime(const Vars& extra = {}) { REQUIRE_OK(make_runtime(extra, &runtime)); }
  ~TestRuntime() {
    if (runtime != nullptr) (void)strata_runtime_destroy(runtime);
  }
  TestRuntime(const TestRuntime&) = delete;
  TestRuntime& operator=(const TestRuntime&) = delete;
  strata_runtime_t* runtime = nullptr;
};

// Distinct for every (seed, byte): another tensor's or an older version's bytes never pass.
inline uint8_t byte_at(uint32_t seed, uint64_t i) {
  uint64_t x = (uint64_t{seed} << 32) ^ i;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return static_cast<uint8_t>(x ^ (x >> 31));
}

inline void fill(void* data, uint64_t bytes, uint32_t seed) {
  auto* p = static_cast<uint8_t*>(data);
  for (uint64_t i = 0; i < bytes; ++i) p[i] = byte_at(seed, i);
}

inline bool holds(const void* data, uint64_t bytes, uint32_t seed) {
  const auto* p = static_cast<const uint8_t*>(data);
  for (uint64_t i = 0; i < bytes; ++i) {
    if (p[i] != byte_at(seed, i)) return false;
  }
  return true;
}

// Writes `seed`'s pattern through the tier's copy (host backend: every tier is host memory,
// ready once the stream has caught up).
inline void write_through(strata_tensor_t t, strata_tier_t tier, strata_stream_t* s, uint64_t bytes,
                          uint32_t seed) {
  void* p = nullptr;
  REQUIRE_OK(strata_tensor_acquire(t, tier, s, STRATA_ACCESS_WRITE, &p));
  REQUIRE_OK(strata_stream_synchronize(s));
  fill(p, bytes, seed);
  REQUIRE_OK(strata_tensor_release(t, s));
}

inline bool read_through(strata_tensor_t t, strata_tier_t tier, strata_stream_t* s, uint64_t bytes,
                         uint32_t seed) {
  void* p = nullptr;
  REQUIRE_OK(strata_tensor_acquire(t, tier, s, STRATA_ACCESS_READ, &p));
  REQUIRE_OK(strata_stream_synchronize(s));
  const bool ok = holds(p, bytes, seed);
  REQUIRE_OK(strata_tensor_release(t, s));
  return ok;
}

}  // namespace strata::testing
