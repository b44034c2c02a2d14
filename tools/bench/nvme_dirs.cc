#include "bench/nvme_dirs.h"

#include <absl/strings/str_format.h>
#include <absl/strings/str_join.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <utility>

namespace strata::bench {
namespace {

// The temporary directory, for the signal handler (which may only make async-signal-safe calls:
// rmdir, signal, raise).
char g_temporary_dir[4096] = {};

extern "C" void remove_temporary_dir_and_reraise(int signal_number) {
  if (g_temporary_dir[0] != '\0') ::rmdir(g_temporary_dir);
  std::signal(signal_number, SIG_DFL);
  std::raise(signal_number);
}

}  // namespace

absl::StatusOr<NvmeDirs> NvmeDirs::choose(const std::vector<std::string>& configured) {
  if (!configured.empty()) return NvmeDirs(configured, false);
  const char* tmpdir = std::getenv("TMPDIR");
  std::string base = tmpdir != nullptr && tmpdir[0] != '\0' ? tmpdir : "/tmp";
  while (base.size() > 1 && base.back() == '/') base.pop_back();
  std::string pattern = base + "/strata-bench-XXXXXX";
  if (pattern.size() >= sizeof(g_temporary_dir)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "TMPDIR='%s' is too long; set a shorter TMPDIR or STRATA_NVME_PATHS", base));
  }
  if (::mkdtemp(pattern.data()) == nullptr) {
    return absl::PermissionDeniedError(absl::StrFormat(
        "cannot create a temporary directory for the NVMe paths under '%s' (%s): set TMPDIR to a "
        "writable directory, or STRATA_NVME_PATHS to the directories to measure",
        base, std::strerror(errno)));
  }
  std::memcpy(g_temporary_dir, pattern.c_str(), pattern.size() + 1);
  for (const int signal_number : {SIGINT, SIGTERM, SIGHUP}) {
    std::signal(signal_number, &remove_temporary_dir_and_reraise);
  }
  return NvmeDirs({pattern}, true);
}

NvmeDirs::NvmeDirs(NvmeDirs&& other) noexcept
    : paths_(std::move(other.paths_)), temporary_(std::exchange(other.temporary_, false)) {}

NvmeDirs::~NvmeDirs() {
  if (!temporary_) return;
  // The swap and baseline files are O_TMPFILE (or unlinked at once), so the directory is empty
  // even while they are still open.
  for (const std::string& path : paths_) ::rmdir(path.c_str());
  g_temporary_dir[0] = '\0';
}

std::string NvmeDirs::describe() const {
  if (temporary_) {
    return absl::StrFormat("%s (temporary: STRATA_NVME_PATHS is unset; removed at exit)",
                           paths_.front());
  }
  return absl::StrFormat("%s (STRATA_NVME_PATHS)", absl::StrJoin(paths_, ","));
}

}  // namespace strata::bench
