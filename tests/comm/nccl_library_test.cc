// The NCCL loader (strata/comm/nccl_library.h): each search step, the errors a user meets, and
// real loading of the NCCL this machine has under /usr/local/cuda (ncclGetVersion and
// ncclGetErrorString need no GPU). Searches run afresh (the test hook); the environment is set
// per test and restored.
#include "strata/comm/nccl_library.h"

#include <dlfcn.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>

#include "strata/testing/nccl_library_testing.h"

namespace strata {
namespace {

namespace fs = std::filesystem;
using testing::NcclSearchSteps;
using testing::search_nccl_uncached;

constexpr const char* kSystemNccl = "/usr/local/cuda/lib64/libnccl.so.2";

// Sets (or unsets) an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, std::optional<std::string> value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value) {
      setenv(name, value->c_str(), 1);
    } else {
      unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (old_) {
      setenv(name_, old_->c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

std::string message(const NcclSearch& search) { return std::string(search.error.message()); }

// A directory holding libnccl.so.2 -> `target`, removed at the end.
class NcclDir {
 public:
  explicit NcclDir(const std::string& target) {
    char pattern[] = "/tmp/strata-nccl-XXXXXX";
    dir_ = mkdtemp(pattern);
    fs::create_symlink(target, dir_ / "libnccl.so.2");
  }
  ~NcclDir() {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string path() const { return dir_.string(); }

 private:
  fs::path dir_;
};

TEST_CASE("No NCCL anywhere: the error names every place searched and the fix", "[nccl_library]") {
  ScopedEnv library("STRATA_NCCL_LIBRARY", std::nullopt);
  ScopedEnv path("STRATA_NCCL_SEARCH_PATH", "/nonexistent/strata-a:/nonexistent/strata-b");
  const NcclSearch search =
      search_nccl_uncached(NcclSearchSteps{.already_loaded = false, .system = false});
  INFO(message(search));
  CHECK_FALSE(search.found());
  CHECK(search.error.code() == absl::StatusCode::kNotFound);
  CHECK(contains(message(search), "STRATA_NCCL_LIBRARY: not set"));
  CHECK(contains(message(search), "/nonexistent/strata-a/libnccl.so.2: no such file"));
  CHECK(contains(message(search), "/nonexistent/strata-b/libnccl.so.2: no such file"));
  CHECK(contains(message(search), "pip install nvidia-nccl-cu12"));
  CHECK(contains(message(search), "set STRATA_NCCL_LIBRARY"));
  CHECK(search.tried.size() == 5);
}

TEST_CASE("STRATA_NCCL_LIBRARY naming a missing file is an error naming it, nothing else tried",
          "[nccl_library]") {
  ScopedEnv library("STRATA_NCCL_LIBRARY", "/nonexistent/libnccl.so.2");
  const NcclSearch search = search_nccl_uncached();
  INFO(message(search));
  CHECK_FALSE(search.found());
  CHECK(search.error.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(
      contains(message(search), "STRATA_NCCL_LIBRARY=/nonexistent/libnccl.so.2 cannot be loaded"));
  CHECK(contains(message(search), "No such file"));  // dlerror's words
  CHECK(search.tried.size() == 1);
}

TEST_CASE("STRATA_NCCL_LIBRARY naming a library that is not NCCL is an error, not a crash",
          "[nccl_library]") {
  const char* libz = "libz.so.1";  // loaded by name: every Debian system has it
  ScopedEnv library("STRATA_NCCL_LIBRARY", libz);
  const NcclSearch search = search_nccl_uncached();
  INFO(message(search));
  CHECK_FALSE(search.found());
  CHECK(contains(message(search), "libz.so.1"));
  CHECK(contains(message(search), "is not NCCL: it has no ncclGetVersion"));
  CHECK(contains(message(search), "pip install nvidia-nccl-cu12"));
}

TEST_CASE("An NCCL older than strata needs is an error naming its version", "[nccl_library]") {
  ScopedEnv library("STRATA_NCCL_LIBRARY", STRATA_FAKE_NCCL);
  const NcclSearch search = search_nccl_uncached();
  INFO(message(search));
  CHECK_FALSE(search.found());
  CHECK(contains(message(search), "is NCCL 2.7.8; strata needs NCCL 2.14.0 or newer"));
}

TEST_CASE("Version codes read as NCCL writes them", "[nccl_library]") {
  CHECK(nccl_version_text(22809) == "2.28.9");
  CHECK(nccl_version_text(21400) == "2.14.0");
  CHECK(nccl_version_text(2708) == "2.7.8");
}

// The real NCCL of this machine, where it has one (the CUDA toolkit's).
bool have_system_nccl() { return fs::exists(kSystemNccl); }

TEST_CASE("STRATA_NCCL_LIBRARY loads a real NCCL: its version and its functions",
          "[nccl_library]") {
  if (!have_system_nccl()) {
    SUCCEED("SKIPPED: no NCCL at /usr/local/cuda/lib64");
    return;
  }
  ScopedEnv library("STRATA_NCCL_LIBRARY", kSystemNccl);
  const NcclSearch search = search_nccl_uncached();
  INFO(message(search));
  REQUIRE(search.found());
  CHECK(search.error.ok());
  CHECK(search.step == "STRATA_NCCL_LIBRARY");
  CHECK(fs::equivalent(search.path, kSystemNccl));
  CHECK(search.version >= kMinNcclVersion);
  // A function of the table, called through the loaded library (no GPU needed).
  using ErrorString = const char* (*)(int);
  auto error_string = reinterpret_cast<ErrorString>(dlsym(search.handle, "ncclGetErrorString"));
  REQUIRE(error_string != nullptr);
  CHECK(std::string(error_string(0)) == "no error");
}

TEST_CASE("STRATA_NCCL_SEARCH_PATH is searched in order, after the places before it",
          "[nccl_library]") {
  if (!have_system_nccl()) {
    SUCCEED("SKIPPED: no NCCL at /usr/local/cuda/lib64");
    return;
  }
  NcclDir wheel(kSystemNccl);  // as torch's nvidia/nccl/lib
  ScopedEnv library("STRATA_NCCL_LIBRARY", std::nullopt);
  ScopedEnv path("STRATA_NCCL_SEARCH_PATH", "/nonexistent/strata-a:" + wheel.path());
  const NcclSearch search =
      search_nccl_uncached(NcclSearchSteps{.already_loaded = false, .system = false});
  INFO(message(search));
  REQUIRE(search.found());
  CHECK(search.step == "STRATA_NCCL_SEARCH_PATH");
  REQUIRE(search.tried.size() == 4);
  CHECK(search.tried[0] == "STRATA_NCCL_LIBRARY: not set");
  CHECK(contains(search.tried[2], "/nonexistent/strata-a/libnccl.so.2: no such file"));
  CHECK(contains(search.tried[3], "(loaded)"));
}

TEST_CASE("NCCL already in the process (torch's) is used before any search", "[nccl_library]") {
  if (!have_system_nccl()) {
    SUCCEED("SKIPPED: no NCCL at /usr/local/cuda/lib64");
    return;
  }
  void* torch_nccl = dlopen(kSystemNccl, RTLD_NOW | RTLD_LOCAL);  // as `import torch` does
  REQUIRE(torch_nccl != nullptr);
  ScopedEnv library("STRATA_NCCL_LIBRARY", std::nullopt);
  ScopedEnv path("STRATA_NCCL_SEARCH_PATH", "/nonexistent/strata-a");
  const NcclSearch search = search_nccl_uncached();
  INFO(message(search));
  REQUIRE(search.found());
  CHECK(search.step == "already loaded in this process");
  CHECK(fs::equivalent(search.path, kSystemNccl));
  dlclose(torch_nccl);
}

TEST_CASE("The system's NCCL is found last", "[nccl_library]") {
  if (!have_system_nccl()) {
    SUCCEED("SKIPPED: no NCCL at /usr/local/cuda/lib64");
    return;
  }
  ScopedEnv library("STRATA_NCCL_LIBRARY", std::nullopt);
  ScopedEnv path("STRATA_NCCL_SEARCH_PATH", std::nullopt);
  const NcclSearch search = search_nccl_uncached(NcclSearchSteps{.already_loaded = false});
  INFO(message(search));
  REQUIRE(search.found());
  CHECK((search.step == "the system's library path" || search.step == "the CUDA toolkit"));
}

}  // namespace
}  // namespace strata
