// The directories offload-bench's NVMe paths use: STRATA_NVME_PATHS when set, otherwise a fresh
// directory under $TMPDIR (or /tmp) that is removed when the bench ends. Every file the bench
// and SwapSpace create there has no name (O_TMPFILE), so the directory is always empty; it is
// removed at exit, by SIGINT/SIGTERM/SIGHUP handlers, and after SIGKILL by a small reaper
// process that waits for the bench's end of a pipe to close.
#pragma once

#include <absl/status/statusor.h>

#include <string>
#include <vector>

namespace strata::bench {

class NvmeDirs {
 public:
  // `configured`: STRATA_NVME_PATHS (empty when unset).
  static absl::StatusOr<NvmeDirs> choose(const std::vector<std::string>& configured);
  NvmeDirs(NvmeDirs&& other) noexcept;
  NvmeDirs& operator=(NvmeDirs&&) = delete;
  ~NvmeDirs();

  const std::vector<std::string>& paths() const { return paths_; }
  bool temporary() const { return temporary_; }
  // "/tmp/strata-bench-Ab12Cd (temporary: STRATA_NVME_PATHS is unset; removed at exit)".
  std::string describe() const;

 private:
  NvmeDirs(std::vector<std::string> paths, bool temporary)
      : paths_(std::move(paths)), temporary_(temporary) {}
  std::vector<std::string> paths_;
  bool temporary_ = false;
};

}  // namespace strata::bench
