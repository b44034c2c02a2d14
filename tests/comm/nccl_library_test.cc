// The NCCL loader (strata/comm/nccl_library.h): each search step, the errors a user meets, and
// real loading of the NCCL this machine has under /usr/local/cuda (ncclGetVersion and
// ncclGetErrorString need no GPU): the search, comm's table of functions resolved from it
// (resolve(), load_nccl_api()) and its "lacks" error. Searches run afresh (the test hook); the
// environment is set per test and restored. A case that needs the real NCCL (or the NCCL
// backend) and cannot have it here is reported as skipped (tests/skip.h).
#include "strata/comm/nccl_library.h"

#include <dlfcn.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>

#include "skip.h"
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
  CHECK(contains(message(search), "pip install " + std::string(nccl_wheel()) + ")"));
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
  CHECK(contains(message(search), "pip install " + std::string(nccl_wheel())));
}

TEST_CASE("An NCCL older than strata needs is an error naming its version", "[nccl_library]") {
  ScopedEnv library("STRATA_NCCL_LIBRARY", STRATA_FAKE_NCCL);
  const NcclSearch search = search_nccl_uncached();
  INFO(message(search));
  CHECK_FALSE(search.found());
  CHECK(contains(message(search), "is NCCL 2.7.8; strata needs NCCL 2.14.0 or newer"));
  REQUIRE(search.tried.size() == 1);  // nothing else tried
  CHECK(contains(search.tried[0], "is NCCL 2.7.8; strata needs NCCL 2.14.0 or newer (refused)"));
}

TEST_CASE("An old NCCL alone on the search path: the error names it and the fix",
          "[nccl_library]") {
  NcclDir old(STRATA_FAKE_NCCL);
  ScopedEnv library("STRATA_NCCL_LIBRARY", std::nullopt);
  ScopedEnv path("STRATA_NCCL_SEARCH_PATH", old.path());
  const NcclSearch search =
      search_nccl_uncached(NcclSearchSteps{.already_loaded = false, .system = false});
  INFO(message(search));
  CHECK_FALSE(search.found());
  CHECK(search.error.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(contains(message(search), "no NCCL that strata can use was found: " + old.path() +
                                      "/libnccl.so.2 (STRATA_NCCL_SEARCH_PATH) is NCCL 2.7.8; "
                                      "strata needs NCCL 2.14.0 or newer"));
  CHECK(contains(message(search), nccl_fix()));
  REQUIRE(search.passed_over.size() == 1);
}

TEST_CASE("The fix names the NCCL wheel of the CUDA this build was made with", "[nccl_library]") {
#if defined(STRATA_TEST_CUDA_MAJOR)
  CHECK(std::string(nccl_wheel()) == "nvidia-nccl-cu" + std::to_string(STRATA_TEST_CUDA_MAJOR));
#else
  CHECK(contains(std::string(nccl_wheel()), "nvidia-nccl-cu12"));
  CHECK(contains(std::string(nccl_wheel()), "nvidia-nccl-cu13"));
#endif
  CHECK(nccl_fix() == "Fix: install torch's NCCL wheel (pip install " + std::string(nccl_wheel()) +
                          "), or set STRATA_NCCL_LIBRARY to the path of libnccl.so.2");
  // Why this build has the backend or not, as strata-info says it.
  const std::string note(nccl_backend_note());
  INFO(note);
  CHECK((nccl_backend_built() ? note.starts_with("built against nccl.h ")
                              : note.starts_with("not built: ")));
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
    testing::skip("no NCCL at /usr/local/cuda/lib64");
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
    testing::skip("no NCCL at /usr/local/cuda/lib64");
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
    testing::skip("no NCCL at /usr/local/cuda/lib64");
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
    testing::skip("no NCCL at /usr/local/cuda/lib64");
    return;
  }
  ScopedEnv library("STRATA_NCCL_LIBRARY", std::nullopt);
  ScopedEnv path("STRATA_NCCL_SEARCH_PATH", std::nullopt);
  const NcclSearch search = search_nccl_uncached(NcclSearchSteps{.already_loaded = false});
  INFO(message(search));
  REQUIRE(search.found());
  CHECK((search.step == "the system's library path" || search.step == "the CUDA toolkit"));
}

TEST_CASE("An old NCCL first and a new one further on: the new one is used, the old one listed",
          "[nccl_library]") {
  if (!have_system_nccl()) {
    testing::skip("no NCCL at /usr/local/cuda/lib64");
    return;
  }
  NcclDir old(STRATA_FAKE_NCCL);  // 2.7.8
  NcclDir wheel(kSystemNccl);
  ScopedEnv library("STRATA_NCCL_LIBRARY", std::nullopt);
  ScopedEnv path("STRATA_NCCL_SEARCH_PATH", old.path() + ":" + wheel.path());
  const NcclSearch search =
      search_nccl_uncached(NcclSearchSteps{.already_loaded = false, .system = false});
  INFO(message(search));
  REQUIRE(search.found());
  CHECK(search.error.ok());
  CHECK(search.step == "STRATA_NCCL_SEARCH_PATH");
  CHECK(fs::equivalent(search.path, kSystemNccl));
  CHECK(search.version >= kMinNcclVersion);
  REQUIRE(search.tried.size() == 4);
  CHECK(search.tried[2] == "STRATA_NCCL_SEARCH_PATH: " + old.path() +
                               "/libnccl.so.2 is NCCL 2.7.8; strata needs NCCL 2.14.0 or newer "
                               "(passed over)");
  CHECK(contains(search.tried[3], "(loaded)"));
  REQUIRE(search.passed_over.size() == 1);
  CHECK(contains(search.passed_over[0], old.path() + "/libnccl.so.2 (STRATA_NCCL_SEARCH_PATH)"));
}

// comm's table of NCCL functions: only in a build with the NCCL backend.
bool backend_or_skip() {
  if (nccl_backend_built()) return true;
  testing::skip("this build has no NCCL backend: " + std::string(nccl_backend_note()));
  return false;
}

TEST_CASE("comm's NCCL table resolves every function from the real NCCL and calls through it",
          "[nccl_library]") {
  if (!backend_or_skip()) return;
  if (!have_system_nccl()) {
    testing::skip("no NCCL at /usr/local/cuda/lib64");
    return;
  }
  ScopedEnv library("STRATA_NCCL_LIBRARY", kSystemNccl);
  const NcclSearch search = search_nccl_uncached();
  REQUIRE(search.found());
  absl::StatusOr<testing::NcclApiProbe> probe = testing::probe_nccl_api(search);
  INFO(probe.status());
  REQUIRE(probe.ok());
  CHECK(probe->version == search.version);
  CHECK(probe->no_error == "no error");
  CHECK(probe->has_split == (search.version >= 21800));  // ncclCommSplit: NCCL 2.18
}

TEST_CASE("load_nccl_api: comm's own table, once per process, from the real NCCL",
          "[nccl_library]") {
  if (!backend_or_skip()) return;
  if (!have_system_nccl()) {
    testing::skip("no NCCL at /usr/local/cuda/lib64");
    return;
  }
  // CTest runs each case in a process of its own, so this is the first search of the process.
  ScopedEnv library("STRATA_NCCL_LIBRARY", kSystemNccl);
  absl::StatusOr<testing::NcclApiProbe> probe = testing::probe_loaded_nccl_api();
  INFO(probe.status());
  REQUIRE(probe.ok());
  REQUIRE(nccl_library().found());
  CHECK(probe->version == nccl_library().version);
  CHECK(probe->version >= kMinNcclVersion);
  CHECK(probe->no_error == "no error");
  // The second call answers from the same table.
  absl::StatusOr<testing::NcclApiProbe> again = testing::probe_loaded_nccl_api();
  REQUIRE(again.ok());
  CHECK(again->version == probe->version);
}

TEST_CASE("A library that says it is a new NCCL but lacks its functions: the error names them",
          "[nccl_library]") {
  if (!backend_or_skip()) return;
  ScopedEnv library("STRATA_NCCL_LIBRARY", STRATA_FAKE_NCCL_LACKING);  // "2.20.0"
  const NcclSearch search = search_nccl_uncached();
  INFO(message(search));
  REQUIRE(search.found());  // ncclGetVersion answers, new enough
  CHECK(search.version == 22000);
  absl::StatusOr<testing::NcclApiProbe> probe = testing::probe_nccl_api(search);
  REQUIRE_FALSE(probe.ok());
  const std::string m(probe.status().message());
  INFO(m);
  CHECK(probe.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(contains(m, "(NCCL 2.20.0) lacks ncclGetErrorString, ncclGetLastError, ncclGetUniqueId"));
  CHECK(contains(m, "ncclBroadcast: use NCCL 2.14.0 or newer"));
  CHECK_FALSE(contains(m, "ncclGetVersion"));  // it has that one
  CHECK_FALSE(contains(m, "ncclCommSplit"));   // optional
  CHECK(contains(m, "pip install " + std::string(nccl_wheel()) + ", or set STRATA_NCCL_LIBRARY"));
}

}  // namespace
}  // namespace strata
