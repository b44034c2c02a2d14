// The C API (include/strata/strata.h): every call with bad arguments returns an error code and a
// message naming the problem; bytes survive every tier through it; stats come through; and a
// long seeded random sequence of valid and invalid calls (run under the sanitizers by
// `make test`) neither crashes nor loses a byte.
#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "strata/strata.h"
#include "temp_dir.h"

namespace {

constexpr uint64_t kKiB = 1024;

using Vars = std::vector<std::pair<std::string, std::string>>;

// Checks a failing call: its code, and that strata_last_error() starts with `text` (the
// function's name and the problem) on this thread.
void expect_error(strata_status_t got, strata_status_t want, const std::string& text) {
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
strata_status_t make_runtime(const Vars& extra, strata_runtime_t** out) {
  std::map<std::string, std::string> vars = {
      {"STRATA_BACKEND", "host"}, {"STRATA_GPU_BYTES", "1MiB"}, {"STRATA_CPU_BYTES", "4MiB"}};
  for (const auto& [name, value] : extra) vars[name] = value;
  std::vector<strata_setting_t> settings;
  for (const auto& [name, value] : vars) settings.push_back({name.c_str(), value.c_str()});
  if (vars.count("STRATA_NVME_PATHS") == 0) settings.push_back({"STRATA_NVME_PATHS", nullptr});
  return strata_runtime_create(settings.data(), settings.size(), out);
}

Vars nvme_vars(const std::string& dir) {
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
uint8_t byte_at(uint32_t seed, uint64_t i) {
  uint64_t x = (uint64_t{seed} << 32) ^ i;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return static_cast<uint8_t>(x ^ (x >> 31));
}

void fill(void* data, uint64_t bytes, uint32_t seed) {
  auto* p = static_cast<uint8_t*>(data);
  for (uint64_t i = 0; i < bytes; ++i) p[i] = byte_at(seed, i);
}

bool holds(const void* data, uint64_t bytes, uint32_t seed) {
  const auto* p = static_cast<const uint8_t*>(data);
  for (uint64_t i = 0; i < bytes; ++i) {
    if (p[i] != byte_at(seed, i)) return false;
  }
  return true;
}

// Writes `seed`'s pattern through the tier's copy (host backend: every tier is host memory,
// ready once the stream has caught up).
void write_through(strata_tensor_t t, strata_tier_t tier, strata_stream_t* s, uint64_t bytes,
                   uint32_t seed) {
  void* p = nullptr;
  REQUIRE_OK(strata_tensor_acquire(t, tier, s, STRATA_ACCESS_WRITE, &p));
  REQUIRE_OK(strata_stream_synchronize(s));
  fill(p, bytes, seed);
  REQUIRE_OK(strata_tensor_release(t, s));
}

bool read_through(strata_tensor_t t, strata_tier_t tier, strata_stream_t* s, uint64_t bytes,
                  uint32_t seed) {
  void* p = nullptr;
  REQUIRE_OK(strata_tensor_acquire(t, tier, s, STRATA_ACCESS_READ, &p));
  REQUIRE_OK(strata_stream_synchronize(s));
  const bool ok = holds(p, bytes, seed);
  REQUIRE_OK(strata_tensor_release(t, s));
  return ok;
}

TEST_CASE("c_api: status names, and the last error is per thread", "[c_api]") {
  CHECK(std::string(strata_status_name(STRATA_OK)) == "OK");
  CHECK(std::string(strata_status_name(STRATA_INVALID_ARGUMENT)) == "INVALID_ARGUMENT");
  CHECK(std::string(strata_status_name(STRATA_FAILED_PRECONDITION)) == "FAILED_PRECONDITION");
  CHECK(std::string(strata_status_name(STRATA_UNAUTHENTICATED)) == "UNAUTHENTICATED");
  CHECK(std::string(strata_status_name(-1)) == "UNRECOGNIZED");
  CHECK(std::string(strata_status_name(17)) == "UNRECOGNIZED");
  CHECK(strata_dtype_size(STRATA_DTYPE_BFLOAT16) == 2);
  CHECK(strata_dtype_size(STRATA_DTYPE_FLOAT64) == 8);
  CHECK(strata_dtype_size(99) == 0);

  expect_error(strata_runtime_stats(nullptr, nullptr), STRATA_INVALID_ARGUMENT,
               "strata_runtime_stats: runtime is NULL");
  std::string other;
  std::thread([&] {
    other = strata_last_error();  // nothing failed on this thread yet
    (void)strata_stream_destroy(nullptr);
    CHECK(std::string(strata_last_error()) == "strata_stream_destroy: stream is NULL");
  }).join();
  CHECK(other.empty());
  // Untouched by the other thread's failure, and by a later success.
  strata_runtime_t* runtime = nullptr;
  REQUIRE_OK(make_runtime({}, &runtime));
  CHECK(std::string(strata_last_error()) == "strata_runtime_stats: runtime is NULL");
  REQUIRE_OK(strata_runtime_destroy(runtime));
}

TEST_CASE("c_api: runtime creation errors name the setting", "[c_api]") {
  strata_runtime_t* runtime = reinterpret_cast<strata_runtime_t*>(0x1234);
  expect_error(make_runtime({{"STRATA_GPU_BYTES", "12XB"}}, &runtime), STRATA_INVALID_ARGUMENT,
               "strata_runtime_create: STRATA_GPU_BYTES='12XB' is not a size");
  CHECK(runtime == nullptr);  // cleared on failure
  expect_error(make_runtime({{"STRATA_GPU_BYTE", "1MiB"}}, &runtime), STRATA_INVALID_ARGUMENT,
               "strata_runtime_create: STRATA_GPU_BYTE='1MiB' is not a strata variable: did you "
               "mean STRATA_GPU_BYTES?");
  expect_error(make_runtime({{"GPU_BYTES", "1MiB"}}, &runtime), STRATA_INVALID_ARGUMENT,
               "strata_runtime_create: settings[0].name 'GPU_BYTES' is not a STRATA_* variable");
  expect_error(make_runtime({{"STRATA_NVME_PATHS", "/nonexistent/strata-c-api"}}, &runtime),
               STRATA_NOT_FOUND,
               "strata_runtime_create: STRATA_NVME_PATHS entry '/nonexistent/strata-c-api' does "
               "not exist");
  expect_error(strata_runtime_create(nullptr, 0, nullptr), STRATA_INVALID_ARGUMENT,
               "strata_runtime_create: out is NULL");
  expect_error(strata_runtime_create(nullptr, 2, &runtime), STRATA_INVALID_ARGUMENT,
               "strata_runtime_create: settings (with count > 0) is NULL");
  const strata_setting_t unnamed[] = {{"STRATA_BACKEND", "host"}, {nullptr, "1"}};
  expect_error(strata_runtime_create(unnamed, 2, &runtime), STRATA_INVALID_ARGUMENT,
               "strata_runtime_create: settings[1].name is NULL");
  expect_error(strata_runtime_create_from_env(nullptr), STRATA_INVALID_ARGUMENT,
               "strata_runtime_create_from_env: out is NULL");
}

// Sets environment variables for one scope and puts the old values back.
class ScopedEnv {
 public:
  explicit ScopedEnv(const std::vector<std::pair<std::string, const char*>>& vars) {
    for (const auto& [name, value] : vars) {
      const char* old = std::getenv(name.c_str());
      saved_.emplace_back(name, old == nullptr ? std::nullopt : std::optional<std::string>(old));
      if (value == nullptr) {
        unsetenv(name.c_str());
      } else {
        setenv(name.c_str(), value, 1);
      }
    }
  }
  ~ScopedEnv() {
    for (const auto& [name, value] : saved_) {
      if (value.has_value()) {
        setenv(name.c_str(), value->c_str(), 1);
      } else {
        unsetenv(name.c_str());
      }
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

TEST_CASE("c_api: the environment, and settings that override or unset it", "[c_api]") {
  ScopedEnv env({{"STRATA_BACKEND", "host"},
                 {"STRATA_GPU_BYTES", "12XB"},
                 {"STRATA_CPU_BYTES", "4MiB"},
                 {"STRATA_NVME_PATHS", "/nonexistent/strata-c-api"}});
  strata_runtime_t* runtime = nullptr;
  expect_error(strata_runtime_create_from_env(&runtime), STRATA_INVALID_ARGUMENT,
               "strata_runtime_create_from_env: STRATA_GPU_BYTES='12XB' is not a size");
  CHECK(runtime == nullptr);
  // A setting overrides the variable; a NULL value unsets it.
  const strata_setting_t fixed[] = {{"STRATA_GPU_BYTES", "1MiB"}, {"STRATA_NVME_PATHS", nullptr}};
  REQUIRE_OK(strata_runtime_create(fixed, 2, &runtime));
  strata_stats_t stats;
  REQUIRE_OK(strata_runtime_stats(runtime, &stats));
  CHECK(stats.tiers[STRATA_TIER_GPU].capacity <= 1024 * kKiB);
  CHECK(stats.tiers[STRATA_TIER_NVME].present == 0);
  REQUIRE_OK(strata_runtime_destroy(runtime));
  // Without the override the environment's value is used (and reported).
  const strata_setting_t gpu_only[] = {{"STRATA_GPU_BYTES", "1MiB"}};
  expect_error(strata_runtime_create(gpu_only, 1, &runtime), STRATA_NOT_FOUND,
               "strata_runtime_create: STRATA_NVME_PATHS entry '/nonexistent/strata-c-api'");
  {
    ScopedEnv fine({{"STRATA_GPU_BYTES", "1MiB"}, {"STRATA_NVME_PATHS", nullptr}});
    REQUIRE_OK(strata_runtime_create_from_env(&runtime));
    REQUIRE_OK(strata_runtime_destroy(runtime));
  }
}

TEST_CASE("c_api: every call with bad arguments returns an error code and a message", "[c_api]") {
  TestRuntime rt;
  TestRuntime other;
  strata_runtime_t* r = rt.runtime;
  strata_stream_t* s = nullptr;
  strata_stream_t* foreign_stream = nullptr;
  REQUIRE_OK(strata_stream_create(r, &s));
  REQUIRE_OK(strata_stream_create(other.runtime, &foreign_stream));
  strata_tensor_t t{};
  REQUIRE_OK(strata_tensor_create(r, "w", 4 * kKiB, STRATA_TIER_CPU, &t));
  strata_tensor_t foreign{};
  REQUIRE_OK(strata_tensor_create(other.runtime, "w", 4 * kKiB, STRATA_TIER_CPU, &foreign));
  const strata_tensor_t null_tensor{};
  void* p = nullptr;
  strata_stats_t stats;
  strata_tensor_info_t info;
  strata_tensor_t found{};

  SECTION("NULL handles and NULL outputs") {
    expect_error(strata_runtime_destroy(nullptr), STRATA_INVALID_ARGUMENT,
                 "strata_runtime_destroy: runtime is NULL");
    expect_error(strata_runtime_describe(nullptr, nullptr, 0, nullptr), STRATA_INVALID_ARGUMENT,
                 "strata_runtime_describe: runtime is NULL");
    expect_error(strata_runtime_describe(r, nullptr, 8, nullptr), STRATA_INVALID_ARGUMENT,
                 "strata_runtime_describe: buffer (with size > 0) is NULL");
    expect_error(strata_runtime_step_begin(nullptr), STRATA_INVALID_ARGUMENT,
                 "strata_runtime_step_begin: runtime is NULL");
    expect_error(strata_runtime_step_end(nullptr), STRATA_INVALID_ARGUMENT,
                 "strata_runtime_step_end: runtime is NULL");
    expect_error(strata_runtime_set_access_order(nullptr, nullptr, 0), STRATA_INVALID_ARGUMENT,
                 "strata_runtime_set_access_order: runtime is NULL");
    expect_error(strata_runtime_set_access_order(r, nullptr, 3), STRATA_INVALID_ARGUMENT,
                 "strata_runtime_set_access_order: order (with count > 0) is NULL");
    expect_error(strata_runtime_flush(nullptr), STRATA_INVALID_ARGUMENT,
                 "strata_runtime_flush: runtime is NULL");
    expect_error(strata_runtime_stats(r, nullptr), STRATA_INVALID_ARGUMENT,
                 "strata_runtime_stats: out is NULL");
    expect_error(strata_stream_create(nullptr, &s), STRATA_INVALID_ARGUMENT,
                 "strata_stream_create: runtime is NULL");
    CHECK(s == nullptr);
    REQUIRE_OK(strata_stream_create(r, &s));
    expect_error(strata_stream_create(r, nullptr), STRATA_INVALID_ARGUMENT,
                 "strata_stream_create: out is NULL");
    expect_error(strata_stream_synchronize(nullptr), STRATA_INVALID_ARGUMENT,
                 "strata_stream_synchronize: stream is NULL");
    expect_error(strata_tensor_create(nullptr, "x", 1, STRATA_TIER_CPU, &found),
                 STRATA_INVALID_ARGUMENT, "strata_tensor_create: runtime is NULL");
    expect_error(strata_tensor_create(r, nullptr, 1, STRATA_TIER_CPU, &found),
                 STRATA_INVALID_ARGUMENT, "strata_tensor_create: name is NULL");
    expect_error(strata_tensor_create(r, "x", 1, STRATA_TIER_CPU, nullptr), STRATA_INVALID_ARGUMENT,
                 "strata_tensor_create: out is NULL");
    expect_error(
        strata_tensor_create_ex(r, "x", STRATA_DTYPE_FLOAT32, nullptr, 2, STRATA_TIER_CPU, &found),
        STRATA_INVALID_ARGUMENT, "strata_tensor_create_ex: shape (with ndim > 0) is NULL");
    expect_error(strata_tensor_find(r, nullptr, &found), STRATA_INVALID_ARGUMENT,
                 "strata_tensor_find: name is NULL");
    expect_error(strata_tensor_find(nullptr, "w", &found), STRATA_INVALID_ARGUMENT,
                 "strata_tensor_find: runtime is NULL");
    expect_error(strata_tensor_find(r, "w", nullptr), STRATA_INVALID_ARGUMENT,
                 "strata_tensor_find: out is NULL");
    expect_error(strata_tensor_info(t, nullptr), STRATA_INVALID_ARGUMENT,
                 "strata_tensor_info: out is NULL");
    expect_error(strata_tensor_name(t, nullptr, 4, nullptr), STRATA_INVALID_ARGUMENT,
                 "strata_tensor_name: buffer (with size > 0) is NULL");
    expect_error(strata_tensor_acquire(t, STRATA_TIER_CPU, nullptr, STRATA_ACCESS_READ, &p),
                 STRATA_INVALID_ARGUMENT, "strata_tensor_acquire: stream is NULL");
    expect_error(strata_tensor_acquire(t, STRATA_TIER_CPU, s, STRATA_ACCESS_READ, nullptr),
                 STRATA_INVALID_ARGUMENT, "strata_tensor_acquire: out is NULL");
    expect_error(strata_tensor_release(t, nullptr), STRATA_INVALID_ARGUMENT,
                 "strata_tensor_release: stream is NULL");
  }

  SECTION("null tensor handles") {
    const std::string null_text = "tensor is a null handle";
    expect_error(strata_tensor_destroy(null_tensor), STRATA_INVALID_ARGUMENT,
                 "strata_tensor_destroy: " + null_text);
    expect_error(strata_tensor_info(null_tensor, &info), STRATA_INVALID_ARGUMENT,
                 "strata_tensor_info: " + null_text);
    expect_error(strata_tensor_name(null_tensor, nullptr, 0, nullptr), STRATA_INVALID_ARGUMENT,
                 "strata_tensor_name: " + null_text);
    expect_error(strata_tensor_acquire(null_tensor, STRATA_TIER_CPU, s, STRATA_ACCESS_READ, &p),
                 STRATA_INVALID_ARGUMENT, "strata_tensor_acquire: " + null_text);
    CHECK(p == nullptr);
    expect_error(strata_tensor_release(null_tensor, s), STRATA_INVALID_ARGUMENT,
                 "strata_tensor_release: " + null_text);
    expect_error(strata_tensor_prefetch(null_tensor, STRATA_TIER_GPU), STRATA_INVALID_ARGUMENT,
                 "strata_tensor_prefetch: " + null_text);
    expect_error(strata_tensor_evict(null_tensor, STRATA_TIER_GPU), STRATA_INVALID_ARGUMENT,
                 "strata_tensor_evict: " + null_text);
    const strata_access_t order[] = {{t, STRATA_TIER_GPU}, {null_tensor, STRATA_TIER_GPU}};
    expect_error(strata_runtime_set_access_order(r, order, 2), STRATA_INVALID_ARGUMENT,
                 "strata_runtime_set_access_order: order[1].tensor is a null handle");
  }

  SECTION("wrong tiers, modes, dtypes and shapes") {
    expect_error(strata_tensor_create(r, "x", 64, 3, &found), STRATA_INVALID_ARGUMENT,
                 "strata_tensor_create: home is 3: use STRATA_TIER_GPU (0), STRATA_TIER_CPU (1) "
                 "or STRATA_TIER_NVME (2)");
    expect_error(strata_tensor_create(r, "x", 64, STRATA_TIER_NVME, &found),
                 STRATA_FAILED_PRECONDITION,
                 "strata_tensor_create: tensor 'x': home tier nvme, but this runtime has no NVMe "
                 "tier; set STRATA_NVME_PATHS");
    expect_error(strata_tensor_create(r, "x", 0, STRATA_TIER_CPU, &found), STRATA_INVALID_ARGUMENT,
                 "strata_tensor_create: tensor 'x': size must be > 0");
    expect_error(strata_tensor_create(r, "w", 64, STRATA_TIER_CPU, &found), STRATA_ALREADY_EXISTS,
                 "strata_tensor_create: a tensor named 'w' already exists");
    expect_error(strata_tensor_create(r, "huge", uint64_t{1} << 40, STRATA_TIER_CPU, &found),
                 STRATA_RESOURCE_EXHAUSTED, "strata_tensor_create: creating tensor 'huge'");
    const int64_t bad_dim[] = {4, -2};
    expect_error(
        strata_tensor_create_ex(r, "x", STRATA_DTYPE_FLOAT32, bad_dim, 2, STRATA_TIER_CPU, &found),
        STRATA_INVALID_ARGUMENT,
        "strata_tensor_create_ex: shape[1] is -2: dimensions must be >= 0");
    const int64_t dims[] = {4, 4};
    expect_error(strata_tensor_create_ex(r, "x", 42, dims, 2, STRATA_TIER_CPU, &found),
                 STRATA_INVALID_ARGUMENT,
                 "strata_tensor_create_ex: dtype is 42: use one of the STRATA_DTYPE_* values");
    expect_error(strata_tensor_create_ex(r, "x", STRATA_DTYPE_FLOAT32, dims, STRATA_MAX_NDIM + 1,
                                         STRATA_TIER_CPU, &found),
                 STRATA_INVALID_ARGUMENT, "strata_tensor_create_ex: ndim is 9");
    const int64_t overflow[] = {int64_t{1} << 40, int64_t{1} << 40};
    expect_error(
        strata_tensor_create_ex(r, "x", STRATA_DTYPE_FLOAT32, overflow, 2, STRATA_TIER_CPU, &found),
        STRATA_INVALID_ARGUMENT, "strata_tensor_create_ex: the shape's size in bytes");
    expect_error(strata_tensor_acquire(t, STRATA_TIER_NVME, s, STRATA_ACCESS_READ, &p),
                 STRATA_INVALID_ARGUMENT,
                 "strata_tensor_acquire: acquire needs the gpu or cpu tier");
    expect_error(strata_tensor_acquire(t, -1, s, STRATA_ACCESS_READ, &p), STRATA_INVALID_ARGUMENT,
                 "strata_tensor_acquire: tier is -1");
    expect_error(strata_tensor_acquire(t, STRATA_TIER_GPU, s, 2, &p), STRATA_INVALID_ARGUMENT,
                 "strata_tensor_acquire: mode is 2: use STRATA_ACCESS_READ (0) or "
                 "STRATA_ACCESS_WRITE (1)");
    expect_error(strata_tensor_prefetch(t, STRATA_TIER_NVME), STRATA_INVALID_ARGUMENT,
                 "strata_tensor_prefetch: prefetch targets the gpu or cpu tier");
    expect_error(strata_tensor_prefetch(t, 1000), STRATA_INVALID_ARGUMENT,
                 "strata_tensor_prefetch: tier is 1000");
    expect_error(strata_tensor_evict(t, STRATA_TIER_CPU), STRATA_INVALID_ARGUMENT,
                 "strata_tensor_evict: tensor 'w': its home copy (cpu) is never evicted");
    expect_error(strata_tensor_evict(t, 7), STRATA_INVALID_ARGUMENT,
                 "strata_tensor_evict: tier is 7");
    const strata_access_t order[] = {{t, STRATA_TIER_NVME}};
    expect_error(strata_runtime_set_access_order(r, order, 1), STRATA_INVALID_ARGUMENT,
                 "strata_runtime_set_access_order: the access order names gpu or cpu acquires");
    const strata_access_t bad_tier[] = {{t, 9}};
    expect_error(strata_runtime_set_access_order(r, bad_tier, 1), STRATA_INVALID_ARGUMENT,
                 "strata_runtime_set_access_order: order[0].tier is 9");
    expect_error(strata_tensor_find(r, "nope", &found), STRATA_NOT_FOUND,
                 "strata_tensor_find: no tensor named 'nope'");
  }

  SECTION("release without acquire, and acquired tensors") {
    expect_error(strata_tensor_release(t, s), STRATA_FAILED_PRECONDITION,
                 "strata_tensor_release: tensor 'w' is not acquired: release without acquire");
    REQUIRE_OK(strata_tensor_acquire(t, STRATA_TIER_GPU, s, STRATA_ACCESS_READ, &p));
    CHECK(p != nullptr);
    expect_error(strata_tensor_destroy(t), STRATA_FAILED_PRECONDITION,
                 "strata_tensor_destroy: tensor 'w' is acquired 1 time(s)");
    expect_error(strata_tensor_evict(t, STRATA_TIER_GPU), STRATA_FAILED_PRECONDITION,
                 "strata_tensor_evict: tensor 'w' is acquired in the gpu tier");
    REQUIRE_OK(strata_tensor_release(t, s));
    expect_error(strata_tensor_release(t, s), STRATA_FAILED_PRECONDITION,
                 "strata_tensor_release: tensor 'w' is not acquired");
  }

  SECTION("handles of another runtime, or of another kind") {
    expect_error(strata_tensor_acquire(t, STRATA_TIER_CPU, foreign_stream, STRATA_ACCESS_READ, &p),
                 STRATA_INVALID_ARGUMENT,
                 "strata_tensor_acquire: stream belongs to another runtime than tensor");
    expect_error(strata_tensor_release(foreign, s), STRATA_INVALID_ARGUMENT,
                 "strata_tensor_release: stream belongs to another runtime than tensor");
    const strata_access_t order[] = {{foreign, STRATA_TIER_GPU}};
    expect_error(strata_runtime_set_access_order(r, order, 1), STRATA_INVALID_ARGUMENT,
                 "strata_runtime_set_access_order: order[0].tensor belongs to another runtime");
    auto* stream_as_runtime = reinterpret_cast<strata_runtime_t*>(s);
    expect_error(strata_runtime_flush(stream_as_runtime), STRATA_INVALID_ARGUMENT,
                 "strata_runtime_flush: runtime is a stream handle, not a runtime handle");
    auto* runtime_as_stream = reinterpret_cast<strata_stream_t*>(r);
    expect_error(strata_stream_synchronize(runtime_as_stream), STRATA_INVALID_ARGUMENT,
                 "strata_stream_synchronize: stream is a runtime handle, not a stream handle");
    expect_error(strata_stream_destroy(runtime_as_stream), STRATA_INVALID_ARGUMENT,
                 "strata_stream_destroy: stream is a runtime handle, not a stream handle");
    auto* made_up = reinterpret_cast<strata_runtime_t*>(uintptr_t{0xdeadbeef0000});
    expect_error(strata_runtime_stats(made_up, &stats), STRATA_INVALID_ARGUMENT,
                 "strata_runtime_stats: runtime is not a runtime handle that strata returned");
    expect_error(strata_runtime_destroy(made_up), STRATA_INVALID_ARGUMENT,
                 "strata_runtime_destroy: runtime is not a runtime handle that strata returned");
    strata_tensor_t forged = t;
    forged.runtime = 0xdeadbeef0000;
    expect_error(strata_tensor_info(forged, &info), STRATA_INVALID_ARGUMENT,
                 "strata_tensor_info: tensor is not a tensor handle strata returned");
    forged = t;
    forged.index = 12345;
    expect_error(strata_tensor_info(forged, &info), STRATA_INVALID_ARGUMENT,
                 "strata_tensor_info: not a tensor of this store");
    forged = t;
    forged.generation += 1;
    expect_error(strata_tensor_info(forged, &info), STRATA_NOT_FOUND,
                 "strata_tensor_info: the tensor was destroyed (stale handle)");
  }

  SECTION("use after destroy") {
    REQUIRE_OK(strata_tensor_destroy(t));
    expect_error(strata_tensor_destroy(t), STRATA_NOT_FOUND,
                 "strata_tensor_destroy: the tensor was destroyed (stale handle)");
    expect_error(strata_tensor_acquire(t, STRATA_TIER_CPU, s, STRATA_ACCESS_READ, &p),
                 STRATA_NOT_FOUND, "strata_tensor_acquire: the tensor was destroyed");
    // A new tensor in the same slot does not revive the old handle.
    REQUIRE_OK(strata_tensor_create(r, "w", 4 * kKiB, STRATA_TIER_CPU, &found));
    CHECK(found.index == t.index);
    expect_error(strata_tensor_info(t, &info), STRATA_NOT_FOUND,
                 "strata_tensor_info: the tensor was destroyed (stale handle)");
    REQUIRE_OK(strata_tensor_info(found, &info));

    REQUIRE_OK(strata_stream_destroy(s));
    expect_error(strata_stream_destroy(s), STRATA_NOT_FOUND,
                 "strata_stream_destroy: stream was destroyed");
    expect_error(strata_stream_synchronize(s), STRATA_NOT_FOUND,
                 "strata_stream_synchronize: stream was destroyed");
    expect_error(strata_tensor_acquire(found, STRATA_TIER_CPU, s, STRATA_ACCESS_READ, &p),
                 STRATA_NOT_FOUND, "strata_tensor_acquire: stream was destroyed");

    REQUIRE_OK(strata_runtime_destroy(r));
    rt.runtime = nullptr;
    const std::string gone = "runtime was destroyed";
    expect_error(strata_runtime_destroy(r), STRATA_NOT_FOUND, "strata_runtime_destroy: " + gone);
    expect_error(strata_runtime_stats(r, &stats), STRATA_NOT_FOUND,
                 "strata_runtime_stats: " + gone);
    expect_error(strata_runtime_flush(r), STRATA_NOT_FOUND, "strata_runtime_flush: " + gone);
    expect_error(strata_runtime_step_begin(r), STRATA_NOT_FOUND,
                 "strata_runtime_step_begin: " + gone);
    expect_error(strata_runtime_step_end(r), STRATA_NOT_FOUND, "strata_runtime_step_end: " + gone);
    expect_error(strata_runtime_set_access_order(r, nullptr, 0), STRATA_NOT_FOUND,
                 "strata_runtime_set_access_order: " + gone);
    expect_error(strata_runtime_describe(r, nullptr, 0, nullptr), STRATA_NOT_FOUND,
                 "strata_runtime_describe: " + gone);
    expect_error(strata_stream_create(r, &s), STRATA_NOT_FOUND, "strata_stream_create: " + gone);
    expect_error(strata_tensor_create(r, "y", 64, STRATA_TIER_CPU, &found), STRATA_NOT_FOUND,
                 "strata_tensor_create: " + gone);
    expect_error(strata_tensor_find(r, "w", &found), STRATA_NOT_FOUND,
                 "strata_tensor_find: " + gone);
    const std::string orphan = "tensor belongs to a runtime that was destroyed";
    expect_error(strata_tensor_info(t, &info), STRATA_NOT_FOUND, "strata_tensor_info: " + orphan);
    expect_error(strata_tensor_evict(t, STRATA_TIER_GPU), STRATA_NOT_FOUND,
                 "strata_tensor_evict: " + orphan);
    expect_error(strata_tensor_prefetch(t, STRATA_TIER_GPU), STRATA_NOT_FOUND,
                 "strata_tensor_prefetch: " + orphan);
    expect_error(strata_tensor_destroy(t), STRATA_NOT_FOUND, "strata_tensor_destroy: " + orphan);
  }

  SECTION("a runtime's destroy ends its streams and leaves other runtimes alone") {
    REQUIRE_OK(strata_tensor_acquire(t, STRATA_TIER_GPU, s, STRATA_ACCESS_WRITE, &p));
    REQUIRE_OK(strata_runtime_destroy(r));  // with a stream and an acquired tensor
    rt.runtime = nullptr;
    expect_error(strata_stream_synchronize(s), STRATA_NOT_FOUND,
                 "strata_stream_synchronize: stream was destroyed");
    expect_error(strata_tensor_release(t, s), STRATA_NOT_FOUND,
                 "strata_tensor_release: tensor belongs to a runtime that was destroyed");
    REQUIRE_OK(strata_tensor_info(foreign, &info));
    REQUIRE_OK(strata_stream_synchronize(foreign_stream));
  }
}

TEST_CASE("c_api: bytes round-trip through every tier, and the stats say so", "[c_api]") {
  strata::testing::TempDir dir("strata-c-api");
  TestRuntime rt(nvme_vars(dir.path()));
  strata_runtime_t* r = rt.runtime;
  strata_stream_t* s = nullptr;
  REQUIRE_OK(strata_stream_create(r, &s));

  constexpr uint64_t kBytes = 200 * kKiB + 3;  // not a whole number of blocks
  strata_tensor_t on_nvme{};
  strata_tensor_t on_cpu{};
  REQUIRE_OK(strata_tensor_create(r, "layer0.weight", kBytes, STRATA_TIER_NVME, &on_nvme));
  REQUIRE_OK(strata_tensor_create(r, "layer1.weight", kBytes, STRATA_TIER_CPU, &on_cpu));

  // CPU write, write-back to NVMe on evict, then NVMe → GPU.
  write_through(on_nvme, STRATA_TIER_CPU, s, kBytes, 1);
  REQUIRE_OK(strata_tensor_evict(on_nvme, STRATA_TIER_CPU));
  CHECK(read_through(on_nvme, STRATA_TIER_GPU, s, kBytes, 1));
  // GPU write, write-back through staging on evict, then back to the CPU.
  write_through(on_nvme, STRATA_TIER_GPU, s, kBytes, 2);
  REQUIRE_OK(strata_tensor_evict(on_nvme, STRATA_TIER_GPU));
  CHECK(read_through(on_nvme, STRATA_TIER_CPU, s, kBytes, 2));
  // Prefetch, then a hit.
  REQUIRE_OK(strata_tensor_evict(on_nvme, STRATA_TIER_CPU));
  REQUIRE_OK(strata_tensor_prefetch(on_nvme, STRATA_TIER_GPU));
  CHECK(read_through(on_nvme, STRATA_TIER_GPU, s, kBytes, 2));
  // CPU-homed: GPU write made home by flush.
  write_through(on_cpu, STRATA_TIER_CPU, s, kBytes, 3);
  write_through(on_cpu, STRATA_TIER_GPU, s, kBytes, 4);
  REQUIRE_OK(strata_runtime_flush(r));
  REQUIRE_OK(strata_tensor_evict(on_cpu, STRATA_TIER_GPU));
  CHECK(read_through(on_cpu, STRATA_TIER_CPU, s, kBytes, 4));

  strata_stats_t stats;
  REQUIRE_OK(strata_runtime_stats(r, &stats));
  CHECK(stats.tensors == 2);
  CHECK(stats.tiers[STRATA_TIER_GPU].present == 1);
  CHECK(stats.tiers[STRATA_TIER_GPU].capacity > 0);
  CHECK(stats.tiers[STRATA_TIER_GPU].capacity <= 1024 * kKiB);
  CHECK(stats.tiers[STRATA_TIER_CPU].present == 1);
  CHECK(stats.tiers[STRATA_TIER_NVME].present == 1);
  CHECK(stats.tiers[STRATA_TIER_NVME].capacity > 0);
  CHECK(stats.tiers[STRATA_TIER_NVME].used >= kBytes);
  CHECK(stats.acquires == 8);
  CHECK(stats.hits + stats.misses == stats.acquires);
  CHECK(stats.moves[STRATA_TIER_CPU][STRATA_TIER_NVME].moves >= 1);
  CHECK(stats.moves[STRATA_TIER_CPU][STRATA_TIER_NVME].bytes >= kBytes);
  CHECK(stats.moves[STRATA_TIER_NVME][STRATA_TIER_GPU].bytes +
            stats.moves[STRATA_TIER_NVME][STRATA_TIER_CPU].bytes >=
        2 * kBytes);
  CHECK(stats.moves[STRATA_TIER_GPU][STRATA_TIER_CPU].bytes >= kBytes);
  CHECK(stats.prefetches_issued + stats.prefetches_late >= 1);  // the acquire may beat the mover
  CHECK(stats.errors == 0);
  CHECK(stats.evictions_writeback >= 2);
  CHECK(stats.prefetch_accuracy >= 0.0);
  CHECK(stats.prefetch_accuracy <= 1.0);

  size_t length = 0;
  REQUIRE_OK(strata_runtime_describe(r, nullptr, 0, &length));
  std::string text(length, '\0');
  REQUIRE_OK(strata_runtime_describe(r, text.data(), length + 1, &length));
  CHECK_THAT(text, Catch::Contains("STRATA_BACKEND") && Catch::Contains("host") &&
                       Catch::Contains(dir.path()));

  REQUIRE_OK(strata_tensor_destroy(on_nvme));
  REQUIRE_OK(strata_tensor_destroy(on_cpu));
  REQUIRE_OK(strata_runtime_stats(r, &stats));
  CHECK(stats.tensors == 0);
  REQUIRE_OK(strata_stream_destroy(s));
  REQUIRE_OK(strata_runtime_destroy(r));
  rt.runtime = nullptr;
  CHECK(dir.entries() == 0);  // the swap file had no name
}

TEST_CASE("c_api: dtype, shape and name come back from strata_tensor_info", "[c_api]") {
  TestRuntime rt;
  strata_runtime_t* r = rt.runtime;
  const int64_t shape[] = {3, 5, 7};
  strata_tensor_t t{};
  REQUIRE_OK(strata_tensor_create_ex(r, "model.layers.0.attn.q_proj.weight", STRATA_DTYPE_BFLOAT16,
                                     shape, 3, STRATA_TIER_CPU, &t));
  strata_tensor_info_t info;
  REQUIRE_OK(strata_tensor_info(t, &info));
  CHECK(info.bytes == 3 * 5 * 7 * 2);
  CHECK(info.home == STRATA_TIER_CPU);
  CHECK(info.dtype == STRATA_DTYPE_BFLOAT16);
  CHECK(info.ndim == 3);
  CHECK(info.shape[0] == 3);
  CHECK(info.shape[1] == 5);
  CHECK(info.shape[2] == 7);
  CHECK(info.shape[3] == 0);

  strata_tensor_t scalar{};
  REQUIRE_OK(
      strata_tensor_create_ex(r, "step", STRATA_DTYPE_INT64, nullptr, 0, STRATA_TIER_GPU, &scalar));
  REQUIRE_OK(strata_tensor_info(scalar, &info));
  CHECK(info.bytes == 8);
  CHECK(info.ndim == 0);
  CHECK(info.home == STRATA_TIER_GPU);

  strata_tensor_t bytes{};
  REQUIRE_OK(strata_tensor_create(r, "raw", 1000, STRATA_TIER_CPU, &bytes));
  REQUIRE_OK(strata_tensor_info(bytes, &info));
  CHECK(info.dtype == STRATA_DTYPE_UINT8);
  CHECK(info.ndim == 1);
  CHECK(info.shape[0] == 1000);

  strata_tensor_t found{};
  REQUIRE_OK(strata_tensor_find(r, "model.layers.0.attn.q_proj.weight", &found));
  CHECK(std::memcmp(&found, &t, sizeof t) == 0);

  size_t length = 0;
  REQUIRE_OK(strata_tensor_name(t, nullptr, 0, &length));
  CHECK(length == std::strlen("model.layers.0.attn.q_proj.weight"));
  char small[6];
  REQUIRE_OK(strata_tensor_name(t, small, sizeof small, &length));
  CHECK(std::string(small) == "model");  // truncated, NUL-terminated
  std::string name(length + 1, '\0');
  REQUIRE_OK(strata_tensor_name(t, name.data(), name.size(), nullptr));
  CHECK(name.c_str() == std::string("model.layers.0.attn.q_proj.weight"));

  // A destroyed tensor's dtype does not leak into the next one in its slot.
  REQUIRE_OK(strata_tensor_destroy(t));
  REQUIRE_OK(strata_tensor_create(r, "again", 16, STRATA_TIER_CPU, &found));
  REQUIRE_OK(strata_tensor_info(found, &info));
  CHECK(info.dtype == STRATA_DTYPE_UINT8);
  CHECK(info.shape[0] == 16);
}

TEST_CASE("c_api: steps and a given access order drive the scheduler", "[c_api]") {
  TestRuntime rt;
  strata_runtime_t* r = rt.runtime;
  strata_stream_t* s = nullptr;
  REQUIRE_OK(strata_stream_create(r, &s));
  constexpr uint64_t kBytes = 192 * kKiB;  // 6 layers: more than the 1 MiB GPU arena holds
  std::vector<strata_tensor_t> layers(6);
  std::vector<strata_access_t> order;
  for (size_t i = 0; i < layers.size(); ++i) {
    REQUIRE_OK(strata_tensor_create(r, ("layer" + std::to_string(i)).c_str(), kBytes,
                                    STRATA_TIER_CPU, &layers[i]));
    write_through(layers[i], STRATA_TIER_CPU, s, kBytes, static_cast<uint32_t>(10 + i));
    order.push_back({layers[i], STRATA_TIER_GPU});
  }
  REQUIRE_OK(strata_runtime_set_access_order(r, order.data(), order.size()));
  for (int step = 0; step < 3; ++step) {
    REQUIRE_OK(strata_runtime_step_begin(r));
    for (size_t i = 0; i < layers.size(); ++i) {
      CHECK(read_through(layers[i], STRATA_TIER_GPU, s, kBytes, static_cast<uint32_t>(10 + i)));
    }
    REQUIRE_OK(strata_runtime_step_end(r));
  }
  strata_stats_t stats;
  REQUIRE_OK(strata_runtime_stats(r, &stats));
  CHECK(stats.schedule.has_trace == 1);
  CHECK(stats.schedule.given_order == 1);
  CHECK(stats.schedule.trace_length == layers.size());
  CHECK(stats.schedule.steps == 3);
  CHECK(stats.prefetches_issued > 0);
  CHECK(stats.tiers[STRATA_TIER_NVME].present == 0);
  REQUIRE_OK(strata_runtime_set_access_order(r, nullptr, 0));
}

// ---- The randomized sequence --------------------------------------------------------------------

// What the test believes about one tensor it created.
struct Model {
  strata_tensor_t handle{};
  std::string name;
  uint64_t bytes = 0;
  strata_tier_t home = STRATA_TIER_CPU;
  uint32_t seed = 0;     // the pattern its newest bytes hold
  bool written = false;  // contents are undefined until first written
  int held_tier = -1;    // an acquisition left open across operations
  strata_stream_t* held_stream = nullptr;
};

TEST_CASE("c_api: a randomized sequence of valid and invalid calls", "[c_api][stress]") {
  const uint32_t seed = GENERATE(1u, 2u, 3u);
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  const auto below = [&](uint64_t n) {
    return std::uniform_int_distribution<uint64_t>(0, n - 1)(rng);
  };

  strata::testing::TempDir dir("strata-c-api");
  Vars vars = nvme_vars(dir.path());
  vars.emplace_back("STRATA_GPU_BYTES", "512KiB");
  vars.emplace_back("STRATA_CPU_BYTES", "3MiB");
  TestRuntime rt(vars);
  strata_runtime_t* r = rt.runtime;
  strata_stream_t* streams[2] = {nullptr, nullptr};
  REQUIRE_OK(strata_stream_create(r, &streams[0]));
  REQUIRE_OK(strata_stream_create(r, &streams[1]));
  strata_stream_t* dead_stream = nullptr;
  REQUIRE_OK(strata_stream_create(r, &dead_stream));
  REQUIRE_OK(strata_stream_destroy(dead_stream));

  std::vector<Model> live;
  std::vector<strata_tensor_t> dead;  // destroyed handles, which must stay invalid
  uint32_t next_seed = 100;
  uint64_t created = 0;
  uint64_t cpu_home_bytes = 0;
  std::map<std::string, uint64_t> outcomes;  // op → count, so the run is known to cover them

  const auto pick_tier = [&] { return static_cast<strata_tier_t>(below(2)); };  // gpu or cpu
  const auto count = [&](const std::string& op, strata_status_t status) {
    outcomes[op + ":" + strata_status_name(status)]++;
    if (status != STRATA_OK) {
      INFO(op);
      CHECK(std::string(strata_last_error()).rfind("strata_", 0) == 0);
    }
  };
  const auto held_count = [&] {
    return std::count_if(live.begin(), live.end(), [](const Model& m) { return m.held_tier >= 0; });
  };
  const auto release = [&](Model& m) {
    REQUIRE_OK(strata_tensor_release(m.handle, m.held_stream));
    m.held_tier = -1;
    m.held_stream = nullptr;
  };

  constexpr int kOps = 3000;
  for (int op = 0; op < kOps; ++op) {
    const uint64_t what = below(100);
    INFO("op " << op << " kind " << what);
    if (what < 14 || live.empty()) {  // create
      Model m;
      m.name = "t" + std::to_string(created++);
      m.bytes = 1 + below(96 * kKiB);
      // CPU homes are capped: the rest of the CPU tier must stay free to hold NVMe tensors.
      m.home = below(3) == 0 && cpu_home_bytes + m.bytes <= 1024 * kKiB ? STRATA_TIER_CPU
                                                                        : STRATA_TIER_NVME;
      const strata_status_t status =
          strata_tensor_create(r, m.name.c_str(), m.bytes, m.home, &m.handle);
      count("create", status);
      if (status == STRATA_OK) {
        if (m.home == STRATA_TIER_CPU) cpu_home_bytes += m.bytes;
        live.push_back(m);
      } else {
        CHECK(status == STRATA_RESOURCE_EXHAUSTED);  // the tiny tiers are full
        CHECK(m.handle.runtime == 0);
      }
    } else if (what < 22) {  // destroy, maybe while held
      const size_t i = below(live.size());
      Model& m = live[i];
      // TensorStore::destroy keeps (leaks) the arena block of a tensor's last valid GPU or CPU
      // copy (see the [!mayfail] test below), which would fill these tiny tiers. NVMe extents
      // are freed, so a tensor is destroyed only once its bytes live on NVMe alone.
      if (m.held_tier < 0) {
        if (m.home != STRATA_TIER_NVME) continue;
        REQUIRE_OK(strata_runtime_flush(r));
        REQUIRE_OK(strata_tensor_evict(m.handle, STRATA_TIER_GPU));
        REQUIRE_OK(strata_tensor_evict(m.handle, STRATA_TIER_CPU));
      }
      const strata_status_t status = strata_tensor_destroy(m.handle);
      count("destroy", status);
      if (m.held_tier >= 0) {
        CHECK(status == STRATA_FAILED_PRECONDITION);
        release(m);
      } else {
        REQUIRE(status == STRATA_OK);
        dead.push_back(m.handle);
        live.erase(live.begin() + static_cast<ptrdiff_t>(i));
      }
    } else if (what < 55) {  // acquire, write or check, then release or keep it
      Model& m = live[below(live.size())];
      if (m.held_tier >= 0) {
        // A second acquisition of a held tensor: read-only, same tier.
        void* p = nullptr;
        const strata_status_t status =
            strata_tensor_acquire(m.handle, m.held_tier, m.held_stream, STRATA_ACCESS_READ, &p);
        count("acquire-nested", status);
        if (status == STRATA_OK) {
          REQUIRE_OK(strata_tensor_release(m.handle, m.held_stream));
        } else {
          CHECK(status == STRATA_RESOURCE_EXHAUSTED);
        }
        continue;
      }
      const strata_tier_t tier = pick_tier();
      strata_stream_t* s = streams[below(2)];
      const bool write = !m.written || below(3) == 0;
      void* p = nullptr;
      const strata_status_t status = strata_tensor_acquire(
          m.handle, tier, s, write ? STRATA_ACCESS_WRITE : STRATA_ACCESS_READ, &p);
      count(write ? "acquire-write" : "acquire-read", status);
      if (status != STRATA_OK) {
        CHECK(status == STRATA_RESOURCE_EXHAUSTED);  // everything else pinned
        CHECK(p == nullptr);
        continue;
      }
      REQUIRE(p != nullptr);
      REQUIRE_OK(strata_stream_synchronize(s));
      if (write) {
        m.seed = next_seed++;
        m.written = true;
        fill(p, m.bytes, m.seed);
      } else {
        INFO("tensor " << m.name << " in tier " << tier);
        CHECK(holds(p, m.bytes, m.seed));
      }
      if (held_count() < 4 && below(3) == 0) {
        m.held_tier = tier;
        m.held_stream = s;
      } else {
        REQUIRE_OK(strata_tensor_release(m.handle, s));
      }
    } else if (what < 62) {  // release: mostly a held tensor, else a release without acquire
      std::vector<size_t> held;
      for (size_t i = 0; i < live.size(); ++i) {
        if (live[i].held_tier >= 0) held.push_back(i);
      }
      if (!held.empty() && below(4) != 0) {
        release(live[held[below(held.size())]]);
      } else {
        Model& m = live[below(live.size())];
        if (m.held_tier >= 0) continue;
        const strata_status_t status = strata_tensor_release(m.handle, streams[below(2)]);
        count("release-unheld", status);
        CHECK(status == STRATA_FAILED_PRECONDITION);
      }
    } else if (what < 72) {  // evict
      Model& m = live[below(live.size())];
      const auto tier = static_cast<strata_tier_t>(below(3));
      const strata_status_t status = strata_tensor_evict(m.handle, tier);
      count("evict", status);
      if (tier == m.home) {
        CHECK(status == STRATA_INVALID_ARGUMENT);
      } else if (tier == m.held_tier) {
        CHECK(status == STRATA_FAILED_PRECONDITION);
      } else {
        CHECK(status == STRATA_OK);
      }
    } else if (what < 78) {  // prefetch
      Model& m = live[below(live.size())];
      const strata_status_t status = strata_tensor_prefetch(m.handle, pick_tier());
      count("prefetch", status);
      CHECK(status == STRATA_OK);
    } else if (what < 80) {
      const strata_status_t status = strata_runtime_flush(r);
      count("flush", status);
      CHECK(status == STRATA_OK);
    } else if (what < 83) {
      REQUIRE_OK(below(2) == 0 ? strata_runtime_step_begin(r) : strata_runtime_step_end(r));
    } else if (what < 86) {  // find and info agree with the model
      const Model& m = live[below(live.size())];
      strata_tensor_t found{};
      REQUIRE_OK(strata_tensor_find(r, m.name.c_str(), &found));
      CHECK(std::memcmp(&found, &m.handle, sizeof found) == 0);
      strata_tensor_info_t info;
      REQUIRE_OK(strata_tensor_info(found, &info));
      CHECK(info.bytes == m.bytes);
      CHECK(info.home == m.home);
    } else {  // invalid calls: each must fail with its code, and change nothing
      void* p = reinterpret_cast<void*>(1);
      strata_tensor_info_t info;
      switch (below(7)) {
        case 0: {
          if (dead.empty()) break;
          const strata_status_t status = strata_tensor_acquire(
              dead[below(dead.size())], pick_tier(), streams[0], STRATA_ACCESS_READ, &p);
          count("stale", status);
          CHECK(status == STRATA_NOT_FOUND);
          CHECK(p == nullptr);
          break;
        }
        case 1: {
          if (dead.empty()) break;
          const strata_status_t status = strata_tensor_evict(dead[below(dead.size())], 0);
          count("stale", status);
          CHECK(status == STRATA_NOT_FOUND);
          break;
        }
        case 2: {
          const strata_status_t status = strata_tensor_acquire(live[below(live.size())].handle,
                                                               STRATA_TIER_CPU, dead_stream, 0, &p);
          count("dead-stream", status);
          CHECK(status == STRATA_NOT_FOUND);
          break;
        }
        case 3: {
          strata_tensor_t forged = live[below(live.size())].handle;
          forged.generation += 1 + static_cast<uint32_t>(below(5));
          const strata_status_t status = strata_tensor_info(forged, &info);
          count("forged", status);
          CHECK(status == STRATA_NOT_FOUND);
          break;
        }
        case 4: {
          const strata_status_t status =
              strata_tensor_acquire(live[below(live.size())].handle,
                                    static_cast<strata_tier_t>(3 + below(5)), streams[0], 0, &p);
          count("bad-tier", status);
          CHECK(status == STRATA_INVALID_ARGUMENT);
          break;
        }
        case 5: {
          const strata_status_t status = strata_tensor_acquire(live[below(live.size())].handle,
                                                               STRATA_TIER_NVME, streams[0], 0, &p);
          count("nvme-acquire", status);
          CHECK(status == STRATA_INVALID_ARGUMENT);
          break;
        }
        default: {
          strata_tensor_t forged{};
          forged.runtime = (uint64_t{1} << 40) + rng();  // never issued
          const strata_status_t status = strata_tensor_destroy(forged);
          count("garbage", status);
          CHECK(status == STRATA_INVALID_ARGUMENT);
          break;
        }
      }
    }
  }

  // Everything released and flushed, every written tensor still holds its newest bytes.
  for (Model& m : live) {
    if (m.held_tier >= 0) release(m);
  }
  REQUIRE_OK(strata_runtime_flush(r));
  for (const Model& m : live) {
    if (!m.written) continue;
    INFO("tensor " << m.name);
    for (strata_tier_t tier : {STRATA_TIER_CPU, STRATA_TIER_GPU}) {
      CHECK(read_through(m.handle, tier, streams[0], m.bytes, m.seed));
    }
  }
  strata_stats_t stats;
  REQUIRE_OK(strata_runtime_stats(r, &stats));
  CHECK(stats.tensors == live.size());
  CHECK(stats.errors == 0);
  for (const char* op :
       {"create:OK", "destroy:OK", "destroy:FAILED_PRECONDITION", "acquire-write:OK",
        "acquire-read:OK", "evict:OK", "evict:INVALID_ARGUMENT",
        "release-unheld:FAILED_PRECONDITION", "stale:NOT_FOUND", "bad-tier:INVALID_ARGUMENT"}) {
    INFO(op);
    CHECK(outcomes[op] > 0);
  }
  for (const Model& m : live) REQUIRE_OK(strata_tensor_destroy(m.handle));
  REQUIRE_OK(strata_runtime_destroy(r));
  rt.runtime = nullptr;
  CHECK(dir.entries() == 0);
}

// TensorStore::destroy once leaked a tensor's last valid GPU or CPU copy (drop_copy()'s rule-1
// guard kept it, then the record forgot the block).
TEST_CASE("c_api: destroying a written tensor frees its copies in every tier", "[c_api]") {
  strata::testing::TempDir dir("strata-c-api");
  TestRuntime rt(nvme_vars(dir.path()));
  strata_stream_t* s = nullptr;
  REQUIRE_OK(strata_stream_create(rt.runtime, &s));
  for (strata_tier_t home : {STRATA_TIER_NVME, STRATA_TIER_CPU}) {
    for (strata_tier_t tier : {STRATA_TIER_GPU, STRATA_TIER_CPU}) {
      strata_stats_t before;
      REQUIRE_OK(strata_runtime_stats(rt.runtime, &before));
      strata_tensor_t t{};
      REQUIRE_OK(strata_tensor_create(rt.runtime, "x", 64 * kKiB, home, &t));
      write_through(t, tier, s, 64 * kKiB, 5);
      REQUIRE_OK(strata_tensor_destroy(t));
      strata_stats_t after;
      REQUIRE_OK(strata_runtime_stats(rt.runtime, &after));
      INFO("home " << home << ", written in tier " << tier);
      CHECK(after.tiers[STRATA_TIER_GPU].used == before.tiers[STRATA_TIER_GPU].used);
      CHECK(after.tiers[STRATA_TIER_CPU].used == before.tiers[STRATA_TIER_CPU].used);
    }
  }
}

TEST_CASE("c_api: destroying a runtime while other threads call into it", "[c_api][stress]") {
  strata_runtime_t* r = nullptr;
  REQUIRE_OK(make_runtime({}, &r));
  constexpr int kThreads = 3;
  std::atomic<int> started{0};
  std::atomic<bool> failed{false};
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      strata_stream_t* s = nullptr;
      strata_tensor_t t{};
      if (strata_stream_create(r, &s) != STRATA_OK ||
          strata_tensor_create(r, ("t" + std::to_string(i)).c_str(), 16 * kKiB, STRATA_TIER_CPU,
                               &t) != STRATA_OK) {
        failed = true;
        return;
      }
      ++started;
      // Until the runtime goes away: every call succeeds or says it is gone, none crashes.
      for (;;) {
        // The memory itself is not touched: it goes away with the runtime, which is the
        // caller's business; the calls must not crash.
        void* p = nullptr;
        strata_status_t status =
            strata_tensor_acquire(t, static_cast<strata_tier_t>(i % 2), s, STRATA_ACCESS_WRITE, &p);
        if (status == STRATA_OK) status = strata_tensor_release(t, s);
        if (status == STRATA_OK) {
          strata_stats_t stats;
          status = strata_runtime_stats(r, &stats);
        }
        if (status != STRATA_OK) {
          if (status != STRATA_NOT_FOUND) failed = true;
          return;
        }
      }
    });
  }
  while (started < kThreads && !failed) std::this_thread::yield();
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  REQUIRE_OK(strata_runtime_destroy(r));
  for (auto& thread : threads) thread.join();
  CHECK_FALSE(failed);
}

// ---- The offload optimizer ----------------------------------------------------------------------

TEST_CASE("c_api: optimizer calls with bad arguments return an error code and a message",
          "[c_api][optimizer]") {
  TestRuntime rt;
  TestRuntime other;
  strata_runtime_t* r = rt.runtime;
  strata_stream_t* s = nullptr;
  strata_stream_t* foreign_stream = nullptr;
  REQUIRE_OK(strata_stream_create(r, &s));
  REQUIRE_OK(strata_stream_create(other.runtime, &foreign_stream));
  strata_tensor_t param{};
  strata_tensor_t grad{};
  strata_tensor_t foreign{};
  REQUIRE_OK(strata_tensor_create(r, "w", 64 * 4, STRATA_TIER_CPU, &param));
  REQUIRE_OK(strata_tensor_create(r, "w.grad", 64 * 4, STRATA_TIER_CPU, &grad));
  REQUIRE_OK(strata_tensor_create(other.runtime, "g", 64 * 4, STRATA_TIER_CPU, &foreign));

  strata_optimizer_t* opt = nullptr;
  strata_optimizer_options_t options;
  expect_error(strata_optimizer_options_init(nullptr), STRATA_INVALID_ARGUMENT,
               "strata_optimizer_options_init: options is NULL");
  expect_error(strata_adam_group_init(nullptr), STRATA_INVALID_ARGUMENT,
               "strata_adam_group_init: group is NULL");
  REQUIRE_OK(strata_optimizer_options_init(&options));
  CHECK(options.state_home == STRATA_TIER_CPU);
  CHECK(options.defaults.lr == Approx(1e-3));
  CHECK(options.defaults.beta2 == Approx(0.999));
  CHECK(options.loss_scaling.scale == 1.0F);
  expect_error(strata_optimizer_create(nullptr, &options, &opt), STRATA_INVALID_ARGUMENT,
               "strata_optimizer_create: runtime is NULL");
  expect_error(strata_optimizer_create(r, &options, nullptr), STRATA_INVALID_ARGUMENT,
               "strata_optimizer_create: out is NULL");
  options.state_home = STRATA_TIER_NVME;
  expect_error(strata_optimizer_create(r, &options, &opt), STRATA_FAILED_PRECONDITION,
               "strata_optimizer_create: OffloadOptimizer: optimizer states on NVMe need an NVMe "
               "tier; set STRATA_NVME_PATHS");
  options.state_home = STRATA_TIER_GPU;
  expect_error(strata_optimizer_create(r, &options, &opt), STRATA_INVALID_ARGUMENT,
               "strata_optimizer_create: OffloadOptimizer: state_home must be the cpu or the nvme");
  options.state_home = 7;
  expect_error(strata_optimizer_create(r, &options, &opt), STRATA_INVALID_ARGUMENT,
               "strata_optimizer_create: options->state_home is 7");
  options.state_home = STRATA_TIER_CPU;
  options.isa = 9;
  expect_error(strata_optimizer_create(r, &options, &opt), STRATA_INVALID_ARGUMENT,
               "strata_optimizer_create: options->isa is 9");
  options.isa = STRATA_CPU_ISA_AUTO;
  options.defaults.beta1 = 1.5F;
  expect_error(strata_optimizer_create(r, &options, &opt), STRATA_INVALID_ARGUMENT,
               "strata_optimizer_create: OffloadOptimizer: beta1 1.5 must be in [0, 1)");
  CHECK(opt == nullptr);
  REQUIRE_OK(strata_optimizer_create(r, nullptr, &opt));  // the defaults

  strata_param_spec_t spec{};
  spec.name = "w";
  spec.param = param;
  spec.grad = grad;
  spec.param_type = STRATA_PARAM_F32;
  spec.grad_type = STRATA_GRAD_F32;
  spec.count = 64;
  strata_param_t id{};
  expect_error(strata_optimizer_add_param(opt, nullptr, &id), STRATA_INVALID_ARGUMENT,
               "strata_optimizer_add_param: spec is NULL");
  expect_error(strata_optimizer_add_param(opt, &spec, nullptr), STRATA_INVALID_ARGUMENT,
               "strata_optimizer_add_param: out is NULL");
  strata_param_spec_t bad = spec;
  bad.name = nullptr;
  expect_error(strata_optimizer_add_param(opt, &bad, &id), STRATA_INVALID_ARGUMENT,
               "strata_optimizer_add_param: spec->name is NULL");
  bad = spec;
  bad.param = strata_tensor_t{};
  expect_error(strata_optimizer_add_param(opt, &bad, &id), STRATA_INVALID_ARGUMENT,
               "strata_optimizer_add_param: spec->param is a null handle");
  bad = spec;
  bad.grad = foreign;
  expect_error(strata_optimizer_add_param(opt, &bad, &id), STRATA_INVALID_ARGUMENT,
               "strata_optimizer_add_param: spec->grad belongs to another runtime than the "
               "optimizer");
  bad = spec;
  bad.param_type = 5;
  expect_error(strata_optimizer_add_param(opt, &bad, &id), STRATA_INVALID_ARGUMENT,
               "strata_optimizer_add_param: spec->param_type is 5");
  bad = spec;
  bad.grad_type = -2;
  expect_error(strata_optimizer_add_param(opt, &bad, &id), STRATA_INVALID_ARGUMENT,
               "strata_optimizer_add_param: spec->grad_type is -2");
  bad = spec;
  bad.count = 0;
  expect_error(strata_optimizer_add_param(opt, &bad, &id), STRATA_INVALID_ARGUMENT,
               "strata_optimizer_add_param: OffloadOptimizer: parameter 'w' has count 0");
  REQUIRE_OK(strata_optimizer_add_param(opt, &spec, &id));
  strata_param_t again{};
  expect_error(strata_optimizer_add_param(opt, &spec, &again), STRATA_ALREADY_EXISTS,
               "strata_optimizer_add_param: ");
  CHECK(again.index == UINT32_MAX);  // outputs are cleared on failure

  strata_param_t missing{7};
  uint64_t steps = 0;
  expect_error(strata_optimizer_param_step_count(opt, missing, &steps), STRATA_NOT_FOUND,
               "strata_optimizer_param_step_count: param 7 is not a parameter of this optimizer");
  expect_error(strata_optimizer_find_param(opt, "nope", &missing), STRATA_NOT_FOUND,
               "strata_optimizer_find_param: ");
  expect_error(strata_optimizer_find_param(opt, nullptr, &missing), STRATA_INVALID_ARGUMENT,
               "strata_optimizer_find_param: name is NULL");
  expect_error(strata_optimizer_grad_ready(opt, strata_param_t{7}, s), STRATA_NOT_FOUND,
               "strata_optimizer_grad_ready: ");
  expect_error(strata_optimizer_grad_ready(opt, id, nullptr), STRATA_INVALID_ARGUMENT,
               "strata_optimizer_grad_ready: stream is NULL");
  expect_error(strata_optimizer_grad_ready(opt, id, foreign_stream), STRATA_INVALID_ARGUMENT,
               "strata_optimizer_grad_ready: stream belongs to another runtime than optimizer");
  expect_error(strata_optimizer_set_loss_scale(opt, -1.0F), STRATA_INVALID_ARGUMENT,
               "strata_optimizer_set_loss_scale: OffloadOptimizer: loss scale -1");
  strata_adam_group_t group;
  expect_error(strata_optimizer_get_group(opt, 5, &group), STRATA_NOT_FOUND,
               "strata_optimizer_get_group: OffloadOptimizer: no parameter group 5");
  expect_error(strata_optimizer_set_group(opt, 0, nullptr), STRATA_INVALID_ARGUMENT,
               "strata_optimizer_set_group: hyper is NULL");
  expect_error(strata_optimizer_add_group(opt, nullptr, nullptr), STRATA_INVALID_ARGUMENT,
               "strata_optimizer_add_group: group is NULL");
  std::vector<float> state(63);
  expect_error(strata_optimizer_read_state(opt, id, state.data(), nullptr, nullptr, 63),
               STRATA_INVALID_ARGUMENT,
               "strata_optimizer_read_state: OffloadOptimizer: read_state(w): master");
  expect_error(strata_optimizer_save(opt, nullptr), STRATA_INVALID_ARGUMENT,
               "strata_optimizer_save: directory is NULL");
  CHECK(strata_optimizer_load(opt, "/nonexistent/strata-checkpoint") != STRATA_OK);
  CHECK(std::string(strata_last_error()).rfind("strata_optimizer_load: ", 0) == 0);
  expect_error(strata_optimizer_stats(opt, nullptr), STRATA_INVALID_ARGUMENT,
               "strata_optimizer_stats: out is NULL");
  expect_error(strata_optimizer_step(nullptr, nullptr), STRATA_INVALID_ARGUMENT,
               "strata_optimizer_step: optimizer is NULL");
  expect_error(strata_optimizer_zero_grad(reinterpret_cast<strata_optimizer_t*>(s)),
               STRATA_INVALID_ARGUMENT,
               "strata_optimizer_zero_grad: optimizer is a stream handle, not an optimizer handle");

  // The optimizer holds its tensors' state: they cannot be destroyed under it... but the
  // optimizer itself can go, and then every call on it is an error.
  REQUIRE_OK(strata_optimizer_destroy(opt));
  expect_error(strata_optimizer_destroy(opt), STRATA_NOT_FOUND,
               "strata_optimizer_destroy: optimizer was destroyed");
  expect_error(strata_optimizer_step(opt, nullptr), STRATA_NOT_FOUND,
               "strata_optimizer_step: optimizer was destroyed");

  // A runtime's destroy takes its optimizers along.
  REQUIRE_OK(strata_optimizer_create(r, nullptr, &opt));
  REQUIRE_OK(strata_optimizer_add_param(opt, &spec, &id));
  REQUIRE_OK(strata_runtime_destroy(r));
  rt.runtime = nullptr;
  expect_error(strata_optimizer_stats(opt, nullptr), STRATA_NOT_FOUND,
               "strata_optimizer_stats: optimizer was destroyed");
  expect_error(strata_optimizer_destroy(opt), STRATA_NOT_FOUND,
               "strata_optimizer_destroy: optimizer was destroyed");
}

// torch.optim.AdamW on one fp32 parameter, in float as the CPU kernels compute it.
struct AdamW {
  strata_adam_group_t hyper;
  std::vector<float> master, m, v;
  uint64_t steps = 0;
  void step(const std::vector<float>& grad) {
    ++steps;
    const double bc1 = 1.0 - std::pow(double{hyper.beta1}, static_cast<double>(steps));
    const double bc2 = 1.0 - std::pow(double{hyper.beta2}, static_cast<double>(steps));
    for (size_t i = 0; i < master.size(); ++i) {
      const float g = grad[i];
      float p = master[i] * (1.0F - hyper.lr * hyper.weight_decay);
      m[i] = hyper.beta1 * m[i] + (1.0F - hyper.beta1) * g;
      v[i] = hyper.beta2 * v[i] + (1.0F - hyper.beta2) * g * g;
      const double denom = std::sqrt(static_cast<double>(v[i])) / std::sqrt(bc2) + hyper.eps;
      p -= static_cast<float>(hyper.lr / bc1 * m[i] / denom);
      master[i] = p;
    }
  }
};

void expect_near(const std::vector<float>& got, const std::vector<float>& want) {
  REQUIRE(got.size() == want.size());
  size_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::fabs(got[i] - want[i]) > 1e-5F * std::max(1.0F, std::fabs(want[i]))) ++bad;
  }
  CHECK(bad == 0);
}

TEST_CASE("c_api: the offload optimizer steps like AdamW, and checkpoints", "[c_api][optimizer]") {
  const strata_tier_t home =
      GENERATE(strata_tier_t{STRATA_TIER_CPU}, strata_tier_t{STRATA_TIER_NVME});
  INFO("states in tier " << home);
  strata::testing::TempDir swap("strata-c-api");
  strata::testing::TempDir checkpoint("strata-c-api-ckpt");
  Vars vars = nvme_vars(swap.path());
  vars.emplace_back("STRATA_CPU_BYTES", "8MiB");
  TestRuntime rt(vars);
  strata_runtime_t* r = rt.runtime;
  strata_stream_t* s = nullptr;
  REQUIRE_OK(strata_stream_create(r, &s));

  constexpr uint64_t kCount = 3000;
  const int64_t shape[] = {30, 100};
  strata_tensor_t param{};
  strata_tensor_t grad{};
  REQUIRE_OK(strata_tensor_create_ex(r, "layer.weight", STRATA_DTYPE_FLOAT32, shape, 2,
                                     STRATA_TIER_CPU, &param));
  REQUIRE_OK(strata_tensor_create_ex(r, "layer.weight.grad", STRATA_DTYPE_FLOAT32, shape, 2,
                                     STRATA_TIER_CPU, &grad));

  strata_optimizer_options_t options;
  REQUIRE_OK(strata_optimizer_options_init(&options));
  options.state_home = home;
  options.defaults.lr = 1e-2F;
  options.defaults.weight_decay = 0.01F;
  options.isa = STRATA_CPU_ISA_SCALAR;  // the same arithmetic on every machine
  strata_optimizer_t* opt = nullptr;
  REQUIRE_OK(strata_optimizer_create(r, &options, &opt));

  AdamW ref{options.defaults, std::vector<float>(kCount), std::vector<float>(kCount, 0.0F),
            std::vector<float>(kCount, 0.0F)};
  for (uint64_t i = 0; i < kCount; ++i) ref.master[i] = 0.5F * std::sin(static_cast<float>(i));
  strata_param_spec_t spec{};
  spec.name = "layer.weight";
  spec.param = param;
  spec.grad = grad;
  spec.param_type = STRATA_PARAM_F32;
  spec.grad_type = STRATA_GRAD_F32;
  spec.count = kCount;
  spec.initial_master = ref.master.data();
  strata_param_t id{};
  REQUIRE_OK(strata_optimizer_add_param(opt, &spec, &id));
  strata_param_t found{};
  REQUIRE_OK(strata_optimizer_find_param(opt, "layer.weight", &found));
  CHECK(found.index == id.index);

  const auto backward = [&](int step) {
    std::vector<float> g(kCount);
    for (uint64_t i = 0; i < kCount; ++i) {
      g[i] = std::cos(0.37F * static_cast<float>(i) + static_cast<float>(step));
    }
    void* p = nullptr;
    REQUIRE_OK(strata_tensor_acquire(grad, STRATA_TIER_GPU, s, STRATA_ACCESS_WRITE, &p));
    REQUIRE_OK(strata_stream_synchronize(s));  // host backend: "GPU" memory is host memory
    std::memcpy(p, g.data(), kCount * sizeof(float));
    REQUIRE_OK(strata_tensor_release(grad, s));
    REQUIRE_OK(strata_optimizer_grad_ready(opt, id, s));
    return g;
  };
  const auto state = [&] {
    std::vector<float> master(kCount), m(kCount), v(kCount);
    REQUIRE_OK(strata_optimizer_read_state(opt, id, master.data(), m.data(), v.data(), kCount));
    return std::tuple(master, m, v);
  };
  const auto model = [&] {
    std::vector<float> w(kCount);
    void* p = nullptr;
    REQUIRE_OK(strata_tensor_acquire(param, STRATA_TIER_CPU, s, STRATA_ACCESS_READ, &p));
    std::memcpy(w.data(), p, kCount * sizeof(float));
    REQUIRE_OK(strata_tensor_release(param, s));
    return w;
  };

  CHECK(model() == ref.master);  // the parameter tensor starts from the initial master
  for (int step = 0; step < 3; ++step) {
    const std::vector<float> g = backward(step);
    strata_step_result_t result{};
    REQUIRE_OK(strata_optimizer_step(opt, &result));
    ref.step(g);
    double sq = 0;
    for (float x : g) sq += double{x} * x;
    CHECK(result.skipped == 0);
    CHECK(result.step == static_cast<uint64_t>(step + 1));
    CHECK(result.params_updated == 1);
    CHECK(result.grad_norm == Approx(std::sqrt(sq)).epsilon(1e-5));
    CHECK(result.clip_coef == 1.0);
    CHECK(result.loss_scale == 1.0F);
    const auto [master, m, v] = state();
    expect_near(master, ref.master);
    expect_near(m, ref.m);
    expect_near(v, ref.v);
    CHECK(model() == master);  // fp32 parameters are the master itself
  }
  uint64_t steps = 0;
  REQUIRE_OK(strata_optimizer_step_count(opt, &steps));
  CHECK(steps == 3);
  REQUIRE_OK(strata_optimizer_param_step_count(opt, id, &steps));
  CHECK(steps == 3);
  strata_optimizer_stats_t stats;
  REQUIRE_OK(strata_optimizer_stats(opt, &stats));
  CHECK(stats.steps == 3);
  CHECK(stats.params == 1);
  CHECK(stats.elements == kCount);
  CHECK(stats.grads_landed == 3);
  CHECK(stats.grad_bytes_landed == 3 * kCount * sizeof(float));
  if (home == STRATA_TIER_NVME) {
    CHECK(stats.chunks >= 1);
    CHECK(stats.nvme_bytes_written > 0);
    CHECK(stats.nvme_bytes_read > 0);
  }

  // Checkpoint, a step that is then undone by load(), and the state is the checkpoint's.
  const std::string dir = checkpoint.path() + "/step3";
  REQUIRE_OK(strata_optimizer_save(opt, dir.c_str()));
  const auto saved = state();
  backward(3);
  REQUIRE_OK(strata_optimizer_step(opt, nullptr));
  CHECK(std::get<0>(state()) != std::get<0>(saved));
  REQUIRE_OK(strata_optimizer_load(opt, dir.c_str()));
  CHECK(state() == saved);
  CHECK(model() == std::get<0>(saved));
  REQUIRE_OK(strata_optimizer_step_count(opt, &steps));
  CHECK(steps == 3);

  // zero_grad drops landed gradients: a step then updates nothing.
  backward(4);
  REQUIRE_OK(strata_optimizer_zero_grad(opt));
  strata_step_result_t result{};
  REQUIRE_OK(strata_optimizer_step(opt, &result));
  CHECK(result.params_updated == 0);

  // Groups and the loss scale.
  strata_adam_group_t group;
  REQUIRE_OK(strata_adam_group_init(&group));
  group.lr = 0.5F;
  group.decoupled = 0;
  uint32_t index = 0;
  REQUIRE_OK(strata_optimizer_add_group(opt, &group, &index));
  CHECK(index == 1);
  strata_adam_group_t back;
  REQUIRE_OK(strata_optimizer_get_group(opt, 1, &back));
  CHECK(back.lr == 0.5F);
  CHECK(back.decoupled == 0);
  back.lr = 0.25F;
  REQUIRE_OK(strata_optimizer_set_group(opt, 0, &back));
  REQUIRE_OK(strata_optimizer_get_group(opt, 0, &group));
  CHECK(group.lr == 0.25F);
  REQUIRE_OK(strata_optimizer_set_loss_scale(opt, 128.0F));
  float scale = 0;
  REQUIRE_OK(strata_optimizer_loss_scale(opt, &scale));
  CHECK(scale == 128.0F);

  REQUIRE_OK(strata_optimizer_destroy(opt));
  REQUIRE_OK(strata_tensor_destroy(param));  // the optimizer no longer uses them
  REQUIRE_OK(strata_tensor_destroy(grad));
}

}  // namespace
