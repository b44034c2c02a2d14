#include "strata/config/config.h"

#include <stdlib.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <map>
#include <string>

#include "log_capture.h"

namespace strata {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr uint64_t kGiB = uint64_t{1} << 30;

using Vars = std::map<std::string, std::string>;

Config config_of(const Vars& vars) {
  absl::StatusOr<Config> config = Config::from_variables(vars);
  INFO(config.status().ToString());
  REQUIRE(config.ok());
  return *config;
}

// The error for `vars`; checks it names the variable and the value.
std::string error_of(const Vars& vars) {
  absl::StatusOr<Config> config = Config::from_variables(vars);
  REQUIRE_FALSE(config.ok());
  CHECK(config.status().code() == absl::StatusCode::kInvalidArgument);
  const std::string message(config.status().message());
  INFO(message);
  for (const auto& [name, value] : vars) {
    CHECK(message.find(name) != std::string::npos);
    if (!value.empty()) CHECK(message.find(value) != std::string::npos);
  }
  return message;
}

bool contains(const std::string& text, std::string_view part) {
  return text.find(part) != std::string::npos;
}

TEST_CASE("Config defaults match the documented table", "[config]") {
  const Config c = config_of({{"PATH", "/usr/bin"}, {"HOME", "/root"}});  // others ignored
  CHECK(c.backend == Backend::kAuto);
  CHECK_FALSE(c.device.has_value());  // LOCAL_RANK when set, else 0 (choose_device)
  CHECK_FALSE(c.local.rank.has_value());
  CHECK_FALSE(c.local.world_size.has_value());
  CHECK_FALSE(c.gpu_bytes.has_value());
  CHECK(c.cpu_bytes == SizeSetting::of_percent(25));
  CHECK(c.nvme_paths.empty());
  CHECK(c.nvme_bytes == SizeSetting::of_bytes(8 * kGiB));
  CHECK(c.io_engine == IoEngineKind::kAuto);
  CHECK(c.io_depth == 32);
  CHECK(c.io_block == kMiB);
  CHECK(c.staging_bytes == 256 * kMiB);
  CHECK(c.verify);
  CHECK(c.log == LogLevel::kWarn);
}

TEST_CASE("STRATA_BACKEND and STRATA_DEVICE", "[config]") {
  CHECK(config_of({{"STRATA_BACKEND", "auto"}}).backend == Backend::kAuto);
  CHECK(config_of({{"STRATA_BACKEND", "cuda"}}).backend == Backend::kCuda);
  CHECK(config_of({{"STRATA_BACKEND", "host"}}).backend == Backend::kHost);
  CHECK(config_of({{"STRATA_BACKEND", " CUDA "}}).backend == Backend::kCuda);
  CHECK(config_of({{"STRATA_BACKEND", "Host"}}).backend == Backend::kHost);
  CHECK(contains(error_of({{"STRATA_BACKEND", "gpu"}}),
                 "STRATA_BACKEND='gpu' is not a backend: use auto, cuda or host"));

  CHECK(config_of({{"STRATA_DEVICE", "0"}}).device == 0);
  CHECK(config_of({{"STRATA_DEVICE", "3"}}).device == 3);
  CHECK(contains(error_of({{"STRATA_DEVICE", "-1"}}),
                 "STRATA_DEVICE='-1' is out of range: use an integer of at least 0"));
  CHECK(contains(error_of({{"STRATA_DEVICE", "gpu0"}}), "is not a CUDA device ordinal"));
  CHECK(contains(error_of({{"STRATA_DEVICE", "1.5"}}), "is not a CUDA device ordinal"));
  CHECK(contains(error_of({{"STRATA_DEVICE", "99999999999"}}), "out of range"));
}

TEST_CASE("STRATA_GPU_BYTES, STRATA_CPU_BYTES, STRATA_NVME_BYTES: sizes and percentages",
          "[config]") {
  CHECK(config_of({{"STRATA_GPU_BYTES", "40GiB"}}).gpu_bytes == SizeSetting::of_bytes(40 * kGiB));
  CHECK(config_of({{"STRATA_GPU_BYTES", "80%"}}).gpu_bytes == SizeSetting::of_percent(80));
  CHECK(config_of({{"STRATA_CPU_BYTES", "1.5GB"}}).cpu_bytes ==
        SizeSetting::of_bytes(1'500'000'000));
  CHECK(config_of({{"STRATA_CPU_BYTES", "12.5%"}}).cpu_bytes == SizeSetting::of_percent(12.5));
  CHECK(config_of({{"STRATA_CPU_BYTES", "0.5%"}}).cpu_bytes == SizeSetting::of_percent(0.5));
  CHECK(config_of({{"STRATA_NVME_BYTES", "512KiB"}}).nvme_bytes ==
        SizeSetting::of_bytes(512 * 1024));
  CHECK(config_of({{"STRATA_NVME_BYTES", "50%"}}).nvme_bytes == SizeSetting::of_percent(50));

  for (const char* name : {"STRATA_GPU_BYTES", "STRATA_CPU_BYTES", "STRATA_NVME_BYTES"}) {
    INFO(name);
    CHECK(error_of({{name, "12XB"}}) ==
          std::string(name) +
              "='12XB' is not a size (unknown unit 'XB'; units are B, KiB, MiB, GiB, TiB, PiB, "
              "KB, MB, GB, TB, PB): use a byte count with an optional unit (4096, 512KiB, "
              "64MiB, 40GiB, 1.5GB) or a percentage (80%)");
    CHECK(contains(error_of({{name, "-4GiB"}}), "is negative: sizes must be positive"));
    CHECK(contains(error_of({{name, "0"}}), "is zero: sizes must be positive"));
    CHECK(contains(error_of({{name, "99999999TiB"}}), "is too large"));
    CHECK(contains(error_of({{name, "150%"}}), "at most 100%"));
    CHECK(contains(error_of({{name, "0%"}}), "out of range"));
    CHECK(contains(error_of({{name, "1..5GB"}}), "is not a size"));
  }
}

TEST_CASE("STRATA_NVME_PATHS", "[config]") {
  CHECK(config_of({{"STRATA_NVME_PATHS", "/mnt/nvme0"}}).nvme_paths ==
        std::vector<std::string>{"/mnt/nvme0"});
  CHECK(config_of({{"STRATA_NVME_PATHS", "/mnt/a,/mnt/b"}}).nvme_paths ==
        std::vector<std::string>{"/mnt/a", "/mnt/b"});
  CHECK(config_of({{"STRATA_NVME_PATHS", " /mnt/a , /mnt/b "}}).nvme_paths ==
        std::vector<std::string>{"/mnt/a", "/mnt/b"});
  CHECK(config_of({{"STRATA_NVME_PATHS", ""}}).nvme_paths.empty());  // empty: no NVMe tier
  CHECK(config_of({{"STRATA_NVME_PATHS", "  "}}).nvme_paths.empty());
  for (const char* bad : {"/mnt/a,,/mnt/b", ",/mnt/a", "/mnt/a,", "/mnt/a, ,/mnt/b"}) {
    INFO(bad);
    CHECK(contains(error_of({{"STRATA_NVME_PATHS", bad}}), "has an empty entry"));
  }
  CHECK(contains(error_of({{"STRATA_NVME_PATHS", "/mnt/a,/mnt/a"}}), "lists '/mnt/a' twice"));
}

TEST_CASE("STRATA_IO_ENGINE, STRATA_IO_DEPTH", "[config]") {
  CHECK(config_of({{"STRATA_IO_ENGINE", "auto"}}).io_engine == IoEngineKind::kAuto);
  CHECK(config_of({{"STRATA_IO_ENGINE", "io_uring"}}).io_engine == IoEngineKind::kIoUring);
  CHECK(config_of({{"STRATA_IO_ENGINE", "IO_URING"}}).io_engine == IoEngineKind::kIoUring);
  CHECK(config_of({{"STRATA_IO_ENGINE", "psync"}}).io_engine == IoEngineKind::kPsync);
  CHECK(contains(error_of({{"STRATA_IO_ENGINE", "libaio"}}),
                 "STRATA_IO_ENGINE='libaio' is not an I/O engine: use auto, io_uring or psync"));

  CHECK(config_of({{"STRATA_IO_DEPTH", "1"}}).io_depth == 1);
  CHECK(config_of({{"STRATA_IO_DEPTH", "4096"}}).io_depth == 4096);
  CHECK(config_of({{"STRATA_IO_DEPTH", "64"}}).io_depth == 64);
  for (const char* bad : {"0", "4097", "-3"}) {
    CHECK(contains(error_of({{"STRATA_IO_DEPTH", bad}}),
                   "out of range: use an integer from 1 to "
                   "4096"));
  }
  CHECK(contains(error_of({{"STRATA_IO_DEPTH", "deep"}}), "is not a depth"));
}

TEST_CASE("STRATA_IO_BLOCK, STRATA_STAGING_BYTES", "[config]") {
  CHECK(config_of({{"STRATA_IO_BLOCK", "4KiB"}}).io_block == 4096);
  CHECK(config_of({{"STRATA_IO_BLOCK", "64MiB"}}).io_block == 64 * kMiB);
  CHECK(config_of({{"STRATA_STAGING_BYTES", "1GiB"}}).staging_bytes == kGiB);
  const Config both = config_of({{"STRATA_IO_BLOCK", "4MiB"}, {"STRATA_STAGING_BYTES", "4MiB"}});
  CHECK(both.io_block == 4 * kMiB);
  CHECK(both.staging_bytes == 4 * kMiB);

  CHECK(contains(error_of({{"STRATA_IO_BLOCK", "1000"}}),
                 "STRATA_IO_BLOCK='1000' (1000 bytes) is not allowed: use a positive multiple of "
                 "4KiB up to 64MiB"));
  CHECK(contains(error_of({{"STRATA_IO_BLOCK", "1.5KiB"}}),
                 "STRATA_IO_BLOCK='1.5KiB' (1536 bytes) is not allowed"));
  CHECK(contains(error_of({{"STRATA_IO_BLOCK", "6KiB"}}),
                 "STRATA_IO_BLOCK='6KiB' (6144 bytes) is not allowed"));
  CHECK(contains(error_of({{"STRATA_IO_BLOCK", "128MiB"}}), "up to 64MiB"));
  CHECK(contains(error_of({{"STRATA_IO_BLOCK", "50%"}}),
                 "is a percentage, which is not "
                 "accepted here"));
  CHECK(contains(error_of({{"STRATA_STAGING_BYTES", "12XB"}}), "is not a size"));
  CHECK(contains(error_of({{"STRATA_STAGING_BYTES", "512KiB"}}),
                 "STRATA_STAGING_BYTES=512KiB is smaller than STRATA_IO_BLOCK=1MiB"));
  CHECK(contains(error_of({{"STRATA_STAGING_BYTES", "1MiB"}, {"STRATA_IO_BLOCK", "2MiB"}}),
                 "staging must hold at least one I/O block"));
}

TEST_CASE("STRATA_VERIFY, STRATA_LOG", "[config]") {
  for (const char* on : {"on", "ON", "1", "true", "True", "yes"}) {
    CHECK(config_of({{"STRATA_VERIFY", on}}).verify);
  }
  for (const char* off : {"off", "Off", "0", "false", "no"}) {
    CHECK_FALSE(config_of({{"STRATA_VERIFY", off}}).verify);
  }
  CHECK(contains(error_of({{"STRATA_VERIFY", "maybe"}}),
                 "STRATA_VERIFY='maybe' is not a switch: use on or off"));

  CHECK(config_of({{"STRATA_LOG", "error"}}).log == LogLevel::kError);
  CHECK(config_of({{"STRATA_LOG", "warn"}}).log == LogLevel::kWarn);
  CHECK(config_of({{"STRATA_LOG", "info"}}).log == LogLevel::kInfo);
  CHECK(config_of({{"STRATA_LOG", "DEBUG"}}).log == LogLevel::kDebug);
  CHECK(contains(error_of({{"STRATA_LOG", "verbose"}}),
                 "STRATA_LOG='verbose' is not a log level: use error, warn, info or debug"));
}

TEST_CASE("A variable set to nothing is an error that names its default", "[config]") {
  CHECK(error_of({{"STRATA_LOG", ""}}) ==
        "STRATA_LOG is set but empty: unset it to use the default (warn) or give a value");
  CHECK(contains(error_of({{"STRATA_GPU_BYTES", " "}}), "default (80% on cuda, 1GiB on host)"));
}

TEST_CASE("Near misses of STRATA_ variables are errors with the closest name suggested",
          "[config]") {
  CHECK(contains(error_of({{"STRATA_GPU_BYTE", "1GiB"}}),
                 "STRATA_GPU_BYTE='1GiB' is not a strata variable: did you mean "
                 "STRATA_GPU_BYTES?"));
  CHECK(contains(error_of({{"STRATA_NVME_PATH", "/x"}}), "did you mean STRATA_NVME_PATHS?"));
  CHECK(contains(error_of({{"STRATA_IODEPTH", "8"}}), "did you mean STRATA_IO_DEPTH?"));
  CHECK(contains(error_of({{"STRATA_VERFIY", "on"}}), "did you mean STRATA_VERIFY?"));
  CHECK(contains(error_of({{"STRATA_BAKCEND", "host"}}), "did you mean STRATA_BACKEND?"));
  CHECK(contains(error_of({{"STRATA_gpu_bytes", "1GiB"}}),
                 "did you mean STRATA_GPU_BYTES? (names are upper case)"));
  CHECK(contains(error_of({{"STRATA_LOGS", "info"}}), "did you mean STRATA_LOG?"));
  // Variables of other programs are not ours to judge.
  CHECK(Config::from_variables({{"STRATAX", "1"}, {"MY_STRATA_THING", "1"}}).ok());
  // The NCCL loader's variables are strata's, read where NCCL is loaded; a typo is still caught.
  CHECK(Config::from_variables(
            {{"STRATA_NCCL_LIBRARY", "/x/libnccl.so.2"}, {"STRATA_NCCL_SEARCH_PATH", "/a:/b"}})
            .ok());
  CHECK(contains(error_of({{"STRATA_NCCL_LIBRAY", "/x"}}), "did you mean STRATA_NCCL_LIBRARY?"));
}

TEST_CASE("Other STRATA_ variables are a warning, once, not an error", "[config][log]") {
  testing::LogCapture log;
  log::set_threshold(LogLevel::kWarn);
  // A wrapper script's variable must not stop every strata program from starting.
  CHECK(config_of({{"STRATA_BUILD_TYPE", "Release"}, {"STRATA_IO_DEPTH", "8"}}).io_depth == 8);
  CHECK(config_of({{"STRATA_BUILD_TYPE", "Release"}}).io_depth == 32);
  const auto build_type = log.matching("STRATA_BUILD_TYPE='Release' is not a strata variable");
  REQUIRE(build_type.size() == 1);  // once, although two configurations saw it
  CHECK(build_type[0].rfind("strata: warning: ", 0) == 0);
  CHECK(contains(build_type[0], "ignored (strata reads STRATA_BACKEND, STRATA_DEVICE,"));
  CHECK_FALSE(contains(build_type[0], "did you mean"));
  // Short names need a close match: STRATA_FOO is two edits from STRATA_LOG, too far.
  CHECK(Config::from_variables({{"STRATA_FOO", "1"}}).ok());
  CHECK(log.matching("STRATA_FOO='1' is not a strata variable").size() == 1);
  CHECK(Config::from_variables({{"STRATA_COMPLETELY_DIFFERENT", "1"}}).ok());
  const auto far = log.matching("STRATA_COMPLETELY_DIFFERENT='1'");
  REQUIRE(far.size() == 1);
  CHECK_FALSE(contains(far[0], "did you mean"));
  // A real error elsewhere still fails, and the foreign variable is not counted as one.
  absl::StatusOr<Config> bad =
      Config::from_variables({{"STRATA_HOME", "/opt"}, {"STRATA_GPU_BYTES", "12XB"}});
  REQUIRE_FALSE(bad.ok());
  const std::string both(bad.status().message());
  CHECK_FALSE(contains(both, "configuration errors"));
  CHECK_FALSE(contains(both, "STRATA_HOME"));
  CHECK(contains(both, "STRATA_GPU_BYTES='12XB'"));
}

TEST_CASE("Several errors are all reported, one per line, in table order", "[config]") {
  absl::StatusOr<Config> c = Config::from_variables({{"STRATA_LOG", "loud"},
                                                     {"STRATA_GPU_BYTES", "12XB"},
                                                     {"STRATA_GPU_BYTE", "1"},
                                                     {"STRATA_BACKEND", "tpu"}});
  REQUIRE_FALSE(c.ok());
  const std::string message(c.status().message());
  INFO(message);
  CHECK(message.rfind("4 configuration errors:\n", 0) == 0);
  const size_t backend = message.find("\n  STRATA_BACKEND='tpu'");
  const size_t gpu = message.find("\n  STRATA_GPU_BYTES='12XB'");
  const size_t log = message.find("\n  STRATA_LOG='loud'");
  const size_t unknown = message.find("\n  STRATA_GPU_BYTE='1' is not a strata variable");
  REQUIRE(backend != std::string::npos);
  REQUIRE(gpu != std::string::npos);
  REQUIRE(log != std::string::npos);
  REQUIRE(unknown != std::string::npos);
  CHECK(backend < gpu);
  CHECK(gpu < log);
  CHECK(log < unknown);
}

TEST_CASE("from_environment reads STRATA_ variables from the process environment", "[config]") {
  REQUIRE(setenv("STRATA_IO_DEPTH", "7", 1) == 0);
  REQUIRE(setenv("STRATA_CPU_BYTES", "2GiB", 1) == 0);
  absl::StatusOr<Config> c = Config::from_environment();
  unsetenv("STRATA_IO_DEPTH");
  unsetenv("STRATA_CPU_BYTES");
  REQUIRE(c.ok());
  CHECK(c->io_depth == 7);
  CHECK(c->cpu_bytes == SizeSetting::of_bytes(2 * kGiB));

  REQUIRE(setenv("STRATA_GPU_BYTES", "12XB", 1) == 0);
  c = Config::from_environment();
  unsetenv("STRATA_GPU_BYTES");
  REQUIRE_FALSE(c.ok());
  CHECK(contains(std::string(c.status().message()), "STRATA_GPU_BYTES='12XB' is not a size"));
}

}  // namespace
}  // namespace strata

namespace strata {
namespace {

TEST_CASE("STRATA_COMM_BACKEND, STRATA_COMM_TIMEOUT, STRATA_COMM_DEBUG", "[config][comm]") {
  const Config defaults = config_of({});
  CHECK(defaults.comm.backend == CommBackendKind::kAuto);
  CHECK(defaults.comm.timeout == std::chrono::minutes(5));
  CHECK_FALSE(defaults.comm.debug);

  const Config set = config_of({{"STRATA_COMM_BACKEND", "Gloo"},
                                {"STRATA_COMM_TIMEOUT", "2.5s"},
                                {"STRATA_COMM_DEBUG", "on"}});
  CHECK(set.comm.backend == CommBackendKind::kGloo);
  CHECK(set.comm.timeout == std::chrono::milliseconds(2500));
  CHECK(set.comm.debug);
  CHECK(config_of({{"STRATA_COMM_BACKEND", "nccl"}}).comm.backend == CommBackendKind::kNccl);

  const std::pair<const char*, int64_t> durations[] = {{"90", 90000},    {"500ms", 500},
                                                       {"5min", 300000}, {"2m", 120000},
                                                       {"1h", 3600000},  {" 30s ", 30000}};
  for (const auto& [text, ms] : durations) {
    INFO(text);
    CHECK(config_of({{"STRATA_COMM_TIMEOUT", text}}).comm.timeout.count() == ms);
  }

  CHECK(error_of({{"STRATA_COMM_BACKEND", "mpi"}}).find("auto, nccl or gloo") != std::string::npos);
  for (const char* bad : {"soon", "10 parsecs", "-5s", "0", "50ms", "25h", "nan", "s"}) {
    INFO(bad);
    const std::string message = error_of({{"STRATA_COMM_TIMEOUT", bad}});
    CHECK(message.find("30s, 500ms, 5min or 2h") != std::string::npos);
  }
  CHECK(error_of({{"STRATA_COMM_DEBUG", "maybe"}}).find("on or off") != std::string::npos);
  // A near miss of a comm variable is caught like any other.
  absl::StatusOr<Config> typo = Config::from_variables({{"STRATA_COMM_TIMOUT", "5s"}});
  REQUIRE_FALSE(typo.ok());
  CHECK(std::string(typo.status().message()).find("STRATA_COMM_TIMEOUT") != std::string::npos);
}

TEST_CASE("STRATA_ADAM_THREADS, STRATA_ADAM_RESERVE, STRATA_ADAM_PIN", "[config][cpu_pool]") {
  const Config defaults = config_of({});
  CHECK(defaults.adam_pool == CpuPoolSettings{0, 0, true});
  const Config set = config_of(
      {{"STRATA_ADAM_THREADS", "12"}, {"STRATA_ADAM_RESERVE", " 2 "}, {"STRATA_ADAM_PIN", "off"}});
  CHECK(set.adam_pool == CpuPoolSettings{12, 2, false});

  CHECK(contains(error_of({{"STRATA_ADAM_THREADS", "many"}}),
                 "is not a thread count: use an integer from 0 to 65536"));
  CHECK(contains(error_of({{"STRATA_ADAM_THREADS", "-1"}}), "is out of range"));
  CHECK(contains(error_of({{"STRATA_ADAM_THREADS", "65537"}}), "is out of range"));
  CHECK(contains(error_of({{"STRATA_ADAM_RESERVE", "2.5"}}),
                 "is not a number of cores: use an integer from 0 to 65535"));
  CHECK(contains(error_of({{"STRATA_ADAM_PIN", "sometimes"}}), "on or off"));
  CHECK(contains(error_of({{"STRATA_ADAM_RESERVE", ""}}), "set but empty"));
  // A near miss is caught like any other.
  absl::StatusOr<Config> typo = Config::from_variables({{"STRATA_ADAM_THREAD", "4"}});
  REQUIRE_FALSE(typo.ok());
  CHECK(contains(std::string(typo.status().message()), "did you mean STRATA_ADAM_THREADS"));
}

}  // namespace
}  // namespace strata
