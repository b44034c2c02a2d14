// The C API's runtime handles: status names and the per-thread last error, runtime creation
// errors that name the setting, the environment and settings that override or unset it, and a
// runtime destroyed while other threads call into it.
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "c_api_fixtures.h"
#include "strata/strata.h"

namespace strata::testing {
namespace {

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

}  // namespace
}  // namespace strata::testing
