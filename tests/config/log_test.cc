// Logging: the threshold, the line format, warn_once, and what Runtime::create says through it
// (STRATA_LOG from the configuration, each of Runtime::warnings() once, an info line).
#include "strata/base/log.h"

#include <linux/capability.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <string>

#include "log_capture.h"
#include "strata/runtime/runtime.h"

namespace strata {
namespace {

using testing::LogCapture;

bool contains(const std::string& text, std::string_view part) {
  return text.find(part) != std::string::npos;
}

TEST_CASE("Log levels filter, and each message is one prefixed line", "[log]") {
  LogCapture log;
  log::set_threshold(LogLevel::kInfo);
  STRATA_LOG(kError, "an error %d", 1);
  STRATA_LOG(kWarn, "a warning %s", "two");
  STRATA_LOG(kInfo, "an info line\n");  // a trailing newline is not doubled
  STRATA_LOG(kDebug, "a debug line");   // above the threshold: not written
  REQUIRE(log.all().size() == 3);
  CHECK(log.all()[0] == "strata: error: an error 1\n");
  CHECK(log.all()[1] == "strata: warning: a warning two\n");
  CHECK(log.all()[2] == "strata: info: an info line\n");

  log::set_threshold(LogLevel::kError);
  CHECK_FALSE(log::enabled(LogLevel::kWarn));
  STRATA_LOG(kWarn, "hidden");
  STRATA_LOG(kInfo, "hidden");
  STRATA_LOG(kError, "shown");
  REQUIRE(log.all().size() == 4);
  CHECK(log.all()[3] == "strata: error: shown\n");

  log::set_threshold(LogLevel::kDebug);
  STRATA_LOG(kDebug, "traced");
  REQUIRE(log.all().size() == 5);
  CHECK(log.all()[4] == "strata: debug: traced\n");
}

TEST_CASE("warn_once says a text once, and nothing while warnings are off", "[log]") {
  LogCapture log;
  log::set_threshold(LogLevel::kError);
  log::warn_once("log_test: first text");  // off: not said, and not used up
  CHECK(log.all().empty());
  log::set_threshold(LogLevel::kWarn);
  log::warn_once("log_test: first text");
  log::warn_once("log_test: first text");
  log::warn_once("log_test: second text");
  REQUIRE(log.all().size() == 2);
  CHECK(log.all()[0] == "strata: warning: log_test: first text\n");
  CHECK(log.all()[1] == "strata: warning: log_test: second text\n");
}

// Makes the memlock check of resolve() fail for one scope, so that a runtime with an NVMe tier
// has a warning on any machine: RLIMIT_MEMLOCK's soft limit at 64 KiB and CAP_IPC_LOCK dropped
// from the effective set (it stays permitted, so both come back). With io_uring the warning is
// "above RLIMIT_MEMLOCK"; without it, the psync fallback.
class LowMemlock {
 public:
  LowMemlock() {
    REQUIRE(getrlimit(RLIMIT_MEMLOCK, &saved_limit_) == 0);
    rlimit low = saved_limit_;
    low.rlim_cur = 64 << 10;
    if (saved_limit_.rlim_max != RLIM_INFINITY && saved_limit_.rlim_max < low.rlim_cur) {
      low.rlim_cur = saved_limit_.rlim_max;
    }
    REQUIRE(setrlimit(RLIMIT_MEMLOCK, &low) == 0);
    header_.version = _LINUX_CAPABILITY_VERSION_3;
    REQUIRE(syscall(SYS_capget, &header_, saved_caps_) == 0);
    dropped_ = (saved_caps_[0].effective & (1U << CAP_IPC_LOCK)) != 0;
    if (dropped_) {  // root, or a container granting CAP_IPC_LOCK
      __user_cap_data_struct lowered[2] = {saved_caps_[0], saved_caps_[1]};
      lowered[0].effective &= ~(1U << CAP_IPC_LOCK);
      REQUIRE(syscall(SYS_capset, &header_, lowered) == 0);
    }
  }
  ~LowMemlock() {
    if (dropped_) syscall(SYS_capset, &header_, saved_caps_);
    setrlimit(RLIMIT_MEMLOCK, &saved_limit_);
  }
  LowMemlock(const LowMemlock&) = delete;
  LowMemlock& operator=(const LowMemlock&) = delete;

 private:
  rlimit saved_limit_{};
  __user_cap_header_struct header_{};
  __user_cap_data_struct saved_caps_[2]{};
  bool dropped_ = false;
};

// A host runtime with an NVMe tier in a fresh directory; `cpu` makes the memlock warning's text
// (and so warn_once's key) unique to the test.
absl::StatusOr<std::unique_ptr<Runtime>> runtime_with(const std::string& dir,
                                                      const std::string& cpu,
                                                      const std::string& level) {
  auto config = Config::from_variables({{"STRATA_BACKEND", "host"},
                                        {"STRATA_GPU_BYTES", "4MiB"},
                                        {"STRATA_CPU_BYTES", cpu},
                                        {"STRATA_NVME_PATHS", dir},
                                        {"STRATA_NVME_BYTES", "16MiB"},
                                        {"STRATA_IO_BLOCK", "256KiB"},
                                        {"STRATA_STAGING_BYTES", "3MiB"},
                                        {"STRATA_LOG", level}});
  if (!config.ok()) return config.status();
  return Runtime::create(*config);
}

class TempDir {
 public:
  TempDir() : path_((std::filesystem::temp_directory_path() / "strata-log-XXXXXX").string()) {
    REQUIRE(mkdtemp(path_.data()) != nullptr);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

TEST_CASE("Runtime::create prints each warning once, however many runtimes", "[log][runtime]") {
  TempDir dir;
  LogCapture log;
  LowMemlock low;
  auto first = runtime_with(dir.path(), "24MiB", "warn");
  REQUIRE(first.ok());
  auto second = runtime_with(dir.path(), "24MiB", "warn");
  REQUIRE(second.ok());
  // Runtime::warnings() is what create() found. The io_uring registration warning comes from
  // the tier's background registration thread, so a runtime lists it only when its thread failed
  // before create() returned: a race between the two runtimes, left out of the comparison.
  const auto found_by_create = [](const std::vector<std::string>& all) {
    std::vector<std::string> out;
    for (const std::string& w : all) {
      if (w.find("buffer registration stopped") == std::string::npos) out.push_back(w);
    }
    return out;
  };
  const std::vector<std::string>& warnings = (*first)->warnings();
  REQUIRE_FALSE(warnings.empty());
  // The second runtime still lists them all, though each is printed once.
  CHECK(found_by_create((*second)->warnings()) == found_by_create(warnings));
  for (const std::string& warning : warnings) {
    INFO(warning);
    const auto lines = log.matching(warning);
    CHECK(lines.size() == 1);
    if (!lines.empty()) CHECK(lines[0] == "strata: warning: " + warning + "\n");
  }
  // The psync fallback or the memlock warning, whichever this machine has.
  CHECK((log.matching("STRATA_CPU_BYTES (24.00 MiB) is above RLIMIT_MEMLOCK").size() +
         log.matching("NVMe I/O uses psync").size()) >= 1);
  CHECK(log.matching("strata: info:").empty());  // STRATA_LOG=warn: no info line
}

TEST_CASE("STRATA_LOG=error silences warnings, info adds the resolved tiers", "[log][runtime]") {
  TempDir dir;
  LogCapture log;
  LowMemlock low;
  auto quiet = runtime_with(dir.path(), "32MiB", "error");
  REQUIRE(quiet.ok());
  CHECK_FALSE((*quiet)->warnings().empty());  // there is something to say
  CHECK(log.all().empty());                   // but nothing is said
  CHECK(log::threshold() == LogLevel::kError);

  auto chatty = runtime_with(dir.path(), "32MiB", "info");
  REQUIRE(chatty.ok());
  CHECK(log::threshold() == LogLevel::kInfo);
  // The warnings withheld at error are said now, once (a text said by an earlier runtime of this
  // process, such as the psync fallback, at most once).
  for (const std::string& warning : (*chatty)->warnings()) {
    INFO(warning);
    const size_t expected = contains(warning, "STRATA_CPU_BYTES (32.00 MiB)") ? 1 : 0;
    CHECK(log.matching(warning).size() >= expected);
    CHECK(log.matching(warning).size() <= 1);
  }
  const auto info = log.matching("strata: info: runtime: backend host");
  REQUIRE(info.size() == 1);
  CHECK(contains(info[0], "GPU arena 4.00 MiB"));
  CHECK(contains(info[0], "pinned CPU 32.00 MiB"));
  CHECK(contains(info[0], dir.path()));
  CHECK(info[0].find('\n') == info[0].size() - 1);  // one line
}

}  // namespace
}  // namespace strata
