#include "strata/comm/nccl_library.h"

#include <dlfcn.h>
#include <link.h>

#include <cstdlib>
#include <filesystem>
#include <string_view>
#include <system_error>

#include "strata/base/text.h"
#include "strata/testing/nccl_library_testing.h"

namespace strata {
namespace {

using text::cat;
using text::to_absl;

constexpr std::string_view kSoname = "libnccl.so.2";

#if !defined(STRATA_NCCL_NOTE) || !defined(STRATA_NCCL_WHEEL)
#error "comm/CMakeLists.txt defines STRATA_NCCL_NOTE and STRATA_NCCL_WHEEL for this file"
#endif

// NODELETE: the functions stay valid for the life of the process, as in KvikIO's shim. A
// candidate passed over (too old, not NCCL) stays loaded too: RTLD_LOCAL keeps its symbols
// from anyone else, and unloading a library whose constructors ran is the riskier choice.
constexpr int kOpenFlags = RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE;

std::string last_dl_error() {
  const char* e = dlerror();
  return e != nullptr ? std::string(e) : std::string("unknown dlopen error");
}

std::string loaded_path(void* handle, std::string_view fallback) {
  link_map* map = nullptr;
  if (dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map != nullptr && map->l_name != nullptr &&
      *map->l_name != '\0') {
    return map->l_name;
  }
  return std::string(fallback);
}

const char* env(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? value : nullptr;
}

// Why the loaded `handle` cannot serve as NCCL ("" when it can; then `version` is set).
std::string unusable(void* handle, int& version) {
  using GetVersion = int (*)(int*);  // ncclResult_t ncclGetVersion(int*)
  auto get_version = reinterpret_cast<GetVersion>(dlsym(handle, "ncclGetVersion"));
  version = 0;
  if (get_version == nullptr) return "is not NCCL: it has no ncclGetVersion";
  if (get_version(&version) != 0) return "is not usable: ncclGetVersion failed";
  if (version < kMinNcclVersion) {
    return cat("is NCCL ", nccl_version_text(version), "; strata needs NCCL ",
               nccl_version_text(kMinNcclVersion), " or newer");
  }
  return "";
}

// A loaded candidate: taken (true) when it is a new enough NCCL; else listed as passed over, so
// that the search goes on to the next place (a newer NCCL may be further on), or as refused
// where the search ends with it (`last`: STRATA_NCCL_LIBRARY).
bool take(NcclSearch& search, void* handle, std::string path, std::string step, bool last = false) {
  int version = 0;
  const std::string problem = unusable(handle, version);
  if (!problem.empty()) {
    search.tried.push_back(
        cat(step, ": ", path, " ", problem, last ? " (refused)" : " (passed over)"));
    search.passed_over.push_back(cat(path, " (", step, ") ", problem));
    return false;
  }
  search.tried.push_back(cat(step, ": ", path, " (loaded)"));
  search.handle = handle;
  search.version = version;
  search.path = std::move(path);
  search.step = std::move(step);
  return true;
}

// dlopen of one candidate: true when it is taken (the search ends).
bool try_file(NcclSearch& search, const std::string& file, std::string_view step) {
  std::error_code ec;
  if (file.find('/') != std::string::npos && !std::filesystem::exists(file, ec)) {
    search.tried.push_back(cat(step, ": ", file, ": no such file"));
    return false;
  }
  void* handle = dlopen(file.c_str(), kOpenFlags);
  if (handle == nullptr) {
    search.tried.push_back(cat(step, ": ", file, ": ", last_dl_error()));
    return false;
  }
  return take(search, handle, loaded_path(handle, file), std::string(step));
}

NcclSearch search(const testing::NcclSearchSteps& steps) {
  NcclSearch search;
  if (const char* path = env("STRATA_NCCL_LIBRARY")) {
    // Named by the user: used or an error, nothing else tried.
    void* handle = dlopen(path, kOpenFlags);
    if (handle == nullptr) {
      const std::string why = last_dl_error();
      search.tried.push_back(cat("STRATA_NCCL_LIBRARY: ", path, ": ", why));
      search.error = absl::FailedPreconditionError(to_absl(
          cat("STRATA_NCCL_LIBRARY=", path, " cannot be loaded: ", why,
              ". Point it at NCCL's libnccl.so.2, or unset it to search torch's NCCL and the "
              "system")));
      return search;
    }
    const std::string loaded = loaded_path(handle, path);
    if (!take(search, handle, loaded, "STRATA_NCCL_LIBRARY", /*last=*/true)) {
      search.error =
          absl::FailedPreconditionError(to_absl(cat(search.passed_over.front(), ". ", nccl_fix())));
    }
    return search;
  }
  search.tried.push_back("STRATA_NCCL_LIBRARY: not set");

  const std::string soname(kSoname);
  if (!steps.already_loaded) {
    search.tried.push_back("already loaded in this process: left out (test)");
  } else if (void* handle = dlopen(soname.c_str(), RTLD_NOW | RTLD_NOLOAD)) {
    if (take(search, handle, loaded_path(handle, soname), "already loaded in this process")) {
      return search;
    }
  } else {
    search.tried.push_back(cat("already loaded in this process: no ", soname));
  }

  if (const char* dirs = env("STRATA_NCCL_SEARCH_PATH")) {
    std::string_view rest = dirs;
    while (!rest.empty()) {
      const size_t colon = rest.find(':');
      const std::string_view dir = rest.substr(0, colon);
      rest = colon == std::string_view::npos ? std::string_view() : rest.substr(colon + 1);
      if (dir.empty()) continue;
      if (try_file(search, cat(dir, "/", soname), "STRATA_NCCL_SEARCH_PATH")) return search;
    }
  } else {
    search.tried.push_back("STRATA_NCCL_SEARCH_PATH: not set");
  }

  if (!steps.system) {
    search.tried.push_back("the system: left out (test)");
  } else if (try_file(search, soname, "the system's library path") ||
             try_file(search, cat("/usr/local/cuda/lib64/", soname), "the CUDA toolkit")) {
    return search;
  }

  if (search.passed_over.empty()) {
    search.error = absl::NotFoundError(
        to_absl(cat("NCCL (", soname, ") was not found. Searched: ", text::join(search.tried, "; "),
                    ". ", nccl_fix())));
  } else {
    search.error = absl::FailedPreconditionError(
        to_absl(cat("no NCCL that strata can use was found: ", text::join(search.passed_over, "; "),
                    ". Searched: ", text::join(search.tried, "; "), ". ", nccl_fix())));
  }
  return search;
}

}  // namespace

const NcclSearch& nccl_library() {
  static const NcclSearch result = search({});  // C++ guarantees one thread runs the search
  return result;
}

std::string nccl_version_text(int code) {
  // NCCL_VERSION: X*1000+Y*100+Z up to 2.8, X*10000+Y*100+Z from 2.9.
  if (code < 10000) return cat(code / 1000, ".", code / 100 % 10, ".", code % 100);
  return cat(code / 10000, ".", code / 100 % 100, ".", code % 100);
}

bool nccl_backend_built() {
#if defined(STRATA_HAVE_NCCL)
  return true;
#else
  return false;
#endif
}

std::string_view nccl_backend_note() { return STRATA_NCCL_NOTE; }

std::string_view nccl_wheel() { return STRATA_NCCL_WHEEL; }

std::string nccl_fix() {
  return cat("Fix: install torch's NCCL wheel (pip install ", nccl_wheel(),
             "), or set STRATA_NCCL_LIBRARY to the path of libnccl.so.2");
}

namespace testing {
NcclSearch search_nccl_uncached(NcclSearchSteps steps) { return search(steps); }
#if !defined(STRATA_HAVE_NCCL)
// comm/nccl_api.cc defines these where the NCCL backend is built.
absl::StatusOr<NcclApiProbe> probe_nccl_api(const NcclSearch&) {
  return absl::UnimplementedError("this build of strata has no NCCL backend");
}
absl::StatusOr<NcclApiProbe> probe_loaded_nccl_api() {
  return absl::UnimplementedError("this build of strata has no NCCL backend");
}
#endif
}  // namespace testing

}  // namespace strata
