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
constexpr std::string_view kFix =
    "Fix: install torch's NCCL wheel (pip install nvidia-nccl-cu12), or set STRATA_NCCL_LIBRARY "
    "to the path of libnccl.so.2";

// NODELETE: the functions stay valid for the life of the process, as in KvikIO's shim.
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

// Checks that `handle` is NCCL and new enough; fills `search` (found, or the error).
void accept(NcclSearch& search, void* handle, std::string path, std::string step) {
  using GetVersion = int (*)(int*);  // ncclResult_t ncclGetVersion(int*)
  auto get_version = reinterpret_cast<GetVersion>(dlsym(handle, "ncclGetVersion"));
  int version = 0;
  if (get_version == nullptr) {
    search.error = absl::FailedPreconditionError(
        to_absl(cat(path, " (", step, ") is not NCCL: it has no ncclGetVersion. ", kFix)));
  } else if (get_version(&version) != 0) {
    search.error = absl::FailedPreconditionError(
        to_absl(cat(path, " (", step, "): ncclGetVersion failed. ", kFix)));
  } else if (version < kMinNcclVersion) {
    search.error = absl::FailedPreconditionError(to_absl(
        cat(path, " (", step, ") is NCCL ", nccl_version_text(version), "; strata needs NCCL ",
            nccl_version_text(kMinNcclVersion), " or newer. ", kFix)));
  } else {
    search.handle = handle;
    search.version = version;
  }
  search.tried.push_back(cat(step, ": ", path, search.handle != nullptr ? " (loaded)" : ""));
  search.path = std::move(path);
  search.step = std::move(step);
}

// dlopen of one candidate: true when it loaded (then accepted or rejected; the search ends).
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
  accept(search, handle, loaded_path(handle, file), std::string(step));
  return true;
}

NcclSearch search(const testing::NcclSearchSteps& steps) {
  NcclSearch search;
  if (const char* path = env("STRATA_NCCL_LIBRARY")) {
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
    accept(search, handle, loaded_path(handle, path), "STRATA_NCCL_LIBRARY");
    return search;
  }
  search.tried.push_back("STRATA_NCCL_LIBRARY: not set");

  const std::string soname(kSoname);
  if (!steps.already_loaded) {
    search.tried.push_back("already loaded in this process: left out (test)");
  } else if (void* handle = dlopen(soname.c_str(), RTLD_NOW | RTLD_NOLOAD)) {
    accept(search, handle, loaded_path(handle, soname), "already loaded in this process");
    return search;
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

  search.error = absl::NotFoundError(to_absl(cat("NCCL (", soname, ") was not found. Searched: ",
                                                 text::join(search.tried, "; "), ". ", kFix)));
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

namespace testing {
NcclSearch search_nccl_uncached(NcclSearchSteps steps) { return search(steps); }
}  // namespace testing

}  // namespace strata
